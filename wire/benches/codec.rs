//! Encode and decode throughput of the frame codec.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use wire::{encode_frames, Decoder, Direction, FrameType, MAX_PAYLOAD};

fn codec(c: &mut Criterion) {
    let data = vec![0xa5u8; 16 * MAX_PAYLOAD];
    let mut encoded = Vec::new();
    encode_frames(FrameType::Stdout, &data, &mut encoded);

    let mut group = c.benchmark_group("codec");
    group.throughput(Throughput::Bytes(data.len() as u64));
    // The floor the codec is measured against: copying the same bytes once.
    group.bench_function("memcpy_floor", |b| {
        let mut out = vec![0u8; encoded.len()];
        b.iter(|| {
            out.copy_from_slice(std::hint::black_box(&encoded));
            out.len()
        })
    });
    group.bench_function("encode_64k_frames", |b| {
        let mut out = Vec::with_capacity(encoded.len());
        b.iter(|| {
            out.clear();
            encode_frames(FrameType::Stdout, std::hint::black_box(&data), &mut out);
            out.len()
        })
    });
    group.bench_function("decode_64k_frames", |b| {
        let mut decoder = Decoder::new(Direction::HostToGuest);
        b.iter(|| {
            let mut total = 0;
            // Feed in the 64 KiB pieces a socket read would deliver.
            for piece in encoded.chunks(MAX_PAYLOAD) {
                decoder.push(std::hint::black_box(piece));
                while let Ok(Some(frame)) = decoder.next_frame() {
                    total += frame.payload.len();
                }
            }
            total
        })
    });
    group.finish();
}

criterion_group!(benches, codec);
criterion_main!(benches);
