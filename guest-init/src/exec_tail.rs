//! The latest output of one command, kept so that a client that re-attaches (its connection
//! dropped, the daemon restarted) gets what it missed.
//!
//! Output is numbered: byte `n` of the command's output stream is the `n`th stdout or stderr
//! payload byte in the order the agent framed them. The tail holds the bytes from
//! [`Tail::kept_from`] to [`Tail::end`], at most its capacity; older ones are dropped. It is
//! fed everything the command writes, attached or not: bytes already sent may still be in
//! flight (socket buffers, the daemon) when a connection drops, and only the client knows how
//! far it got, so a re-attach names its offset and the tail replays from there.
//!
//! It sits on the exec hot path (every read of a kept command is copied in), so the bytes live
//! in one ring that grows to the capacity and is then reused: a copy per read, no allocation.
//! Which stream each byte came from is a run-length list beside it.

use std::collections::VecDeque;

use wire::FrameType;

/// A run of bytes of one stream.
#[derive(Debug, Clone, Copy)]
struct Run {
    kind: FrameType,
    len: usize,
}

/// The latest output of one command, up to a capacity.
#[derive(Debug)]
pub struct Tail {
    bytes: VecDeque<u8>,
    /// The streams of `bytes`, front to back; their lengths add up to `bytes.len()`.
    runs: VecDeque<Run>,
    capacity: usize,
    /// Most runs kept: a command that alternates one-byte writes between stdout and stderr
    /// would otherwise make the list outgrow the bytes.
    max_runs: usize,
    end: u64,
}

impl Tail {
    /// An empty tail that keeps at most `capacity` bytes.
    pub fn new(capacity: usize) -> Tail {
        Tail {
            bytes: VecDeque::new(),
            runs: VecDeque::new(),
            capacity,
            max_runs: (capacity / 64).max(64),
            end: 0,
        }
    }

    /// The offset just past the newest byte: how much the command has written.
    pub fn end(&self) -> u64 {
        self.end
    }

    /// The offset of the oldest byte still kept.
    pub fn kept_from(&self) -> u64 {
        self.end - self.bytes.len() as u64
    }

    /// Bytes held now.
    pub fn held(&self) -> usize {
        self.bytes.len()
    }

    /// Appends what `kind` just wrote, dropping the oldest bytes beyond the capacity. Returns
    /// how many bytes were dropped (to give back to a budget).
    pub fn push(&mut self, kind: FrameType, bytes: &[u8]) -> usize {
        self.end += bytes.len() as u64;
        let keep = bytes.len().min(self.capacity);
        // Room first, so that the ring never grows past the capacity.
        let mut dropped = bytes.len() - keep;
        dropped += self.shrink_to(self.capacity - keep);
        if keep == 0 {
            return dropped;
        }
        self.bytes.extend(&bytes[bytes.len() - keep..]);
        match self.runs.back_mut() {
            Some(last) if last.kind == kind => last.len += keep,
            _ => self.runs.push_back(Run { kind, len: keep }),
        }
        if self.runs.len() > self.max_runs {
            let oldest = self.runs.front().map_or(0, |r| r.len);
            dropped += self.shrink_to(self.bytes.len() - oldest);
        }
        dropped
    }

    /// Drops the oldest bytes until at most `limit` are held; returns how many it dropped.
    pub fn shrink_to(&mut self, limit: usize) -> usize {
        let excess = self.bytes.len().saturating_sub(limit);
        if excess == 0 {
            return 0;
        }
        self.bytes.drain(..excess);
        let mut left = excess;
        while left > 0 {
            let Some(front) = self.runs.front_mut() else {
                break;
            };
            if front.len <= left {
                left -= front.len;
                self.runs.pop_front();
            } else {
                front.len -= left;
                left = 0;
            }
        }
        if self.bytes.is_empty() {
            // A tail emptied by a budget gives its memory back.
            self.bytes = VecDeque::new();
        }
        excess
    }

    /// The kept output from `from` on, as `(stream, bytes)` pieces in order, at most `max`
    /// bytes of them: a client replays its missed output piece by piece.
    pub fn read_from(&self, from: u64, max: usize) -> Vec<(FrameType, &[u8])> {
        let mut out = Vec::new();
        let from = from.max(self.kept_from());
        let mut skip = usize::try_from(from - self.kept_from()).unwrap_or(usize::MAX);
        let mut at = 0;
        let mut left = max;
        for run in &self.runs {
            let start = at;
            at += run.len;
            if left == 0 {
                break;
            }
            if skip >= run.len {
                skip -= run.len;
                continue;
            }
            let take = (run.len - skip).min(left);
            for piece in ring_range(&self.bytes, start + skip, start + skip + take) {
                if !piece.is_empty() {
                    out.push((run.kind, piece));
                }
            }
            left -= take;
            skip = 0;
        }
        out
    }
}

/// `ring[lo..hi]` as at most two slices (the ring may wrap inside it).
fn ring_range(ring: &VecDeque<u8>, lo: usize, hi: usize) -> [&[u8]; 2] {
    let (a, b) = ring.as_slices();
    let n = a.len();
    // The bounds come from the runs, which add up to the ring's length; `get` keeps a broken
    // invariant from ever panicking the agent.
    if hi <= n {
        [a.get(lo..hi).unwrap_or_default(), &[]]
    } else if lo >= n {
        [b.get(lo - n..hi - n).unwrap_or_default(), &[]]
    } else {
        [
            a.get(lo..).unwrap_or_default(),
            b.get(..hi - n).unwrap_or_default(),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pieces from `from`, with adjacent pieces of one stream joined (a ring may split
    /// one run in two).
    fn replay(tail: &Tail, from: u64) -> Vec<(FrameType, Vec<u8>)> {
        let mut out: Vec<(FrameType, Vec<u8>)> = Vec::new();
        for (kind, bytes) in tail.read_from(from, usize::MAX) {
            match out.last_mut() {
                Some((last, joined)) if *last == kind => joined.extend_from_slice(bytes),
                _ => out.push((kind, bytes.to_vec())),
            }
        }
        out
    }

    #[test]
    fn keeps_everything_within_its_capacity_and_replays_from_any_offset() {
        let mut tail = Tail::new(100);
        assert_eq!(tail.push(FrameType::Stdout, b"hello "), 0);
        assert_eq!(tail.push(FrameType::Stderr, b"oops"), 0);
        assert_eq!(tail.push(FrameType::Stdout, b"world"), 0);
        assert_eq!((tail.kept_from(), tail.end(), tail.held()), (0, 15, 15));
        assert_eq!(
            replay(&tail, 0),
            [
                (FrameType::Stdout, b"hello ".to_vec()),
                (FrameType::Stderr, b"oops".to_vec()),
                (FrameType::Stdout, b"world".to_vec()),
            ]
        );
        assert_eq!(
            replay(&tail, 8),
            [
                (FrameType::Stderr, b"ps".to_vec()),
                (FrameType::Stdout, b"world".to_vec()),
            ]
        );
        assert!(replay(&tail, 15).is_empty(), "live: nothing to replay");
    }

    #[test]
    fn drops_the_oldest_bytes_exactly_and_says_how_many() {
        let mut tail = Tail::new(10);
        assert_eq!(tail.push(FrameType::Stdout, b"0123456789"), 0);
        assert_eq!(tail.push(FrameType::Stderr, b"abc"), 3);
        assert_eq!((tail.kept_from(), tail.end(), tail.held()), (3, 13, 10));
        // Asking from before what is kept starts at what is kept.
        assert_eq!(
            replay(&tail, 0),
            [
                (FrameType::Stdout, b"3456789".to_vec()),
                (FrameType::Stderr, b"abc".to_vec()),
            ]
        );
        // One write bigger than the whole capacity keeps its last bytes.
        assert_eq!(tail.push(FrameType::Stdout, b"ABCDEFGHIJKLMNOP"), 16);
        assert_eq!((tail.kept_from(), tail.end()), (19, 29));
        assert_eq!(
            replay(&tail, 0),
            [(FrameType::Stdout, b"GHIJKLMNOP".to_vec())]
        );
    }

    #[test]
    fn a_zero_capacity_keeps_nothing_but_still_counts() {
        let mut tail = Tail::new(0);
        assert_eq!(tail.push(FrameType::Stdout, b"gone"), 4);
        assert_eq!((tail.kept_from(), tail.end(), tail.held()), (4, 4, 0));
        assert!(replay(&tail, 0).is_empty());
    }

    #[test]
    fn shrinking_gives_bytes_back_and_reads_are_bounded() {
        let mut tail = Tail::new(1000);
        for _ in 0..10 {
            tail.push(FrameType::Stdout, &[b'x'; 50]);
            tail.push(FrameType::Stderr, &[b'y'; 50]);
        }
        assert_eq!(tail.shrink_to(120), 880);
        assert_eq!((tail.kept_from(), tail.held()), (880, 120));
        let first = tail.read_from(0, 30);
        assert_eq!(first.iter().map(|(_, b)| b.len()).sum::<usize>(), 30);
        // 880 is 30 bytes into the ninth stderr write.
        let kinds: Vec<_> = first.iter().map(|(k, _)| *k).collect();
        assert!(kinds.starts_with(&[FrameType::Stderr]), "{kinds:?}");
        assert_eq!(replay(&tail, 900)[0], (FrameType::Stdout, vec![b'x'; 50]));
    }

    #[test]
    fn the_ring_wraps_and_stays_within_its_capacity() {
        let mut tail = Tail::new(64);
        let mut all = Vec::new();
        for i in 0..100u8 {
            let piece = [i; 7];
            tail.push(FrameType::Stdout, &piece);
            all.extend_from_slice(&piece);
        }
        assert_eq!(tail.held(), 64);
        assert_eq!(
            replay(&tail, 0),
            [(FrameType::Stdout, all[all.len() - 64..].to_vec())]
        );
        assert!(tail.bytes.capacity() <= 128, "{}", tail.bytes.capacity());
    }

    #[test]
    fn alternating_streams_cannot_grow_the_run_list_past_its_bound() {
        let mut tail = Tail::new(64 * 100);
        for _ in 0..10_000 {
            tail.push(FrameType::Stdout, b"o");
            tail.push(FrameType::Stderr, b"e");
        }
        assert!(tail.runs.len() <= tail.max_runs, "{}", tail.runs.len());
        assert_eq!(tail.held(), tail.runs.iter().map(|r| r.len).sum::<usize>());
        assert_eq!(tail.kept_from() + tail.held() as u64, tail.end());
    }
}
