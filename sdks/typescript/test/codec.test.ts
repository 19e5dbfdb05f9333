// The conformance suite of docs/protocol.md ("Conformance fixtures"), step by step, against
// fixtures/manifest.json and the recorded streams: no daemon needed.

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import path from "node:path";
import { describe, test } from "node:test";

import {
  FRAME_TYPE_NAMES,
  FrameDecoder,
  FrameError,
  FrameType,
  HEADER_SIZE,
  MAX_PAYLOAD,
  encodeFrame,
  encodeFrames,
} from "../src/codec.js";
import type { Direction, Frame } from "../src/codec.js";
import { FIXTURES_DIR } from "./helpers/paths.js";

interface ManifestFrame {
  type: number;
  type_name: string;
  length: number;
  sha256: string;
  text?: string;
  exec_result?: unknown;
}
interface ManifestFixture {
  file: string;
  description: string;
  direction: Direction;
  invalid: boolean;
  error?: string;
  frames?: ManifestFrame[];
}
interface Manifest {
  version: number;
  header_size: number;
  max_payload_size: number;
  frame_types: Record<string, number>;
  fixtures: ManifestFixture[];
}

const manifest = JSON.parse(readFileSync(path.join(FIXTURES_DIR, "manifest.json"), "utf8")) as Manifest;
const valid = manifest.fixtures.filter((f) => !f.invalid);
const invalid = manifest.fixtures.filter((f) => f.invalid);
const bytesOf = (f: ManifestFixture): Buffer => readFileSync(path.join(FIXTURES_DIR, f.file));

/** Splits `data` into pieces of `size` (the whole when size is 0), as a transport might. */
function pieces(data: Buffer, size: number): Buffer[] {
  if (size === 0) return [data];
  const out: Buffer[] = [];
  for (let i = 0; i < data.length; i += size) out.push(data.subarray(i, i + size));
  return out;
}

/** Decodes, copying payloads (views into a piece must not outlive it in a test either). */
function decodeAll(chunks: Buffer[], direction: Direction): Frame[] {
  const d = new FrameDecoder(direction);
  const frames: Frame[] = [];
  for (const c of chunks) d.pushEach(c, (f) => frames.push({ type: f.type, payload: Buffer.from(f.payload) }));
  d.finish();
  return frames;
}

describe("step 1: the manifest's constants are the codec's", () => {
  test("version, header size, payload limit, frame types", () => {
    assert.equal(manifest.version, 1);
    assert.equal(manifest.header_size, HEADER_SIZE);
    assert.equal(manifest.max_payload_size, MAX_PAYLOAD);
    const ours = Object.fromEntries(Object.entries(FRAME_TYPE_NAMES).map(([t, name]) => [name, Number(t)]));
    assert.deepEqual(manifest.frame_types, ours);
    assert.deepEqual(
      { stdout: FrameType.Stdout, stderr: FrameType.Stderr, exit: FrameType.Exit, stdin: FrameType.Stdin, stdin_close: FrameType.StdinClose, resize: FrameType.Resize },
      manifest.frame_types,
    );
  });
});

describe("step 2: every valid fixture decodes to its listed frames, then a clean EOF", () => {
  test("there are valid fixtures of both directions", () => {
    assert.ok(valid.length >= 13, `only ${valid.length} valid fixtures`);
    assert.ok(valid.some((f) => f.direction === "host_to_guest"));
  });
  for (const fixture of valid) {
    // Whole, one byte at a time, and at an odd size that splits headers and payloads.
    for (const split of [0, 1, 4093]) {
      test(`${fixture.file} (${split === 0 ? "whole" : `in pieces of ${split}`})`, () => {
        const frames = decodeAll(pieces(bytesOf(fixture), split), fixture.direction);
        const want = fixture.frames!;
        assert.equal(frames.length, want.length, "frame count");
        frames.forEach((frame, i) => {
          const w = want[i]!;
          assert.equal(frame.type, w.type, `frame ${i} type`);
          assert.equal(FRAME_TYPE_NAMES[frame.type], w.type_name, `frame ${i} type name`);
          assert.equal(frame.payload.length, w.length, `frame ${i} length`);
          assert.equal(createHash("sha256").update(frame.payload).digest("hex"), w.sha256, `frame ${i} sha256`);
          if (w.text !== undefined) assert.equal(frame.payload.toString("utf8"), w.text, `frame ${i} text`);
          if (frame.type === FrameType.Exit) {
            assert.ok(w.exec_result !== undefined, `frame ${i}: the manifest lists the exit frame's exec_result`);
            assert.deepEqual(JSON.parse(frame.payload.toString("utf8")), w.exec_result, `frame ${i} exec_result`);
          } else {
            assert.equal(w.exec_result, undefined);
          }
        });
      });
    }
  }
});

describe("step 3: every invalid fixture fails with its named error, never a clean EOF", () => {
  test("the six error kinds are all covered", () => {
    assert.deepEqual(
      invalid.map((f) => f.error).sort(),
      ["data_after_exit", "missing_exit", "oversize", "truncated_header", "truncated_payload", "unknown_type"],
    );
  });
  for (const fixture of invalid) {
    for (const split of [0, 1]) {
      test(`${fixture.file} is ${fixture.error} (${split === 0 ? "whole" : "byte by byte"})`, () => {
        assert.throws(
          () => decodeAll(pieces(bytesOf(fixture), split), fixture.direction),
          (e: unknown) => e instanceof FrameError && e.kind === fixture.error,
        );
      });
    }
  }
  test("oversize is reported from the header, before its payload arrives", () => {
    const d = new FrameDecoder();
    const header = Buffer.from([1, 0, 0, 0, 0, 0, 0, 0]);
    header.writeUInt32BE(MAX_PAYLOAD + 1, 4);
    assert.throws(() => d.push(header), (e: unknown) => e instanceof FrameError && e.kind === "oversize");
    // Sticky: the stream stays invalid.
    assert.throws(() => d.finish(), (e: unknown) => e instanceof FrameError && e.kind === "oversize");
  });
  test("a header wrong twice is unknown_type", () => {
    const header = Buffer.from([9, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]);
    assert.throws(() => new FrameDecoder().push(header), (e: unknown) => e instanceof FrameError && e.kind === "unknown_type");
  });
  test("an input stream needs no exit frame, but truncation is still an error", () => {
    const d = new FrameDecoder("host_to_guest");
    d.push(encodeFrame(FrameType.Stdin, Buffer.from("x")));
    d.finish();
    const t = new FrameDecoder("host_to_guest");
    t.push(encodeFrame(FrameType.Stdin, Buffer.from("xyz")).subarray(0, 10));
    assert.throws(() => t.finish(), (e: unknown) => e instanceof FrameError && e.kind === "truncated_payload");
  });
});

describe("step 4: encoding the host_to_guest fixtures' frames is byte-identical", () => {
  test("every host_to_guest fixture is encoded, stdin_session.bin and tty_session.bin among them", () => {
    const files = valid.filter((f) => f.direction === "host_to_guest").map((f) => f.file);
    assert.ok(files.includes("stdin_session.bin") && files.includes("tty_session.bin"), files.join(", "));
  });
  for (const fixture of valid.filter((f) => f.direction === "host_to_guest")) {
    test(fixture.file, () => {
      const frames = fixture.frames!;
      assert.ok(frames.length > 0);
      const encoded = Buffer.concat(
        frames.map((f) => {
          const payload = Buffer.from(f.text ?? "", "utf8");
          // The manifest lists text only for short printable payloads; check it is the whole payload.
          assert.equal(payload.length, f.length, `${f.type_name}: the listed text is the whole payload`);
          return encodeFrame(f.type as FrameType, payload);
        }),
      );
      assert.deepEqual(encoded, bytesOf(fixture));
    });
  }
  test("tty_session.bin's resize payloads are the TerminalSize JSON", () => {
    const frames = decodeAll([bytesOf(manifest.fixtures.find((f) => f.file === "tty_session.bin")!)], "host_to_guest");
    const sizes = frames.filter((f) => f.type === FrameType.Resize).map((f) => JSON.parse(f.payload.toString("utf8")) as unknown);
    assert.deepEqual(sizes, [{ rows: 40, cols: 120 }, { rows: 50, cols: 132 }]);
  });
});

describe("the encoder", () => {
  test("splits large writes at the payload limit", () => {
    const data = Buffer.alloc(200 * 1024, 7);
    const frames = decodeAll([encodeFrames(FrameType.Stdout, data)], "host_to_guest");
    assert.deepEqual(frames.map((f) => f.payload.length), [65536, 65536, 65536, 8192]);
    assert.deepEqual(Buffer.concat(frames.map((f) => f.payload)), data);
  });
  test("empty data is one empty frame; exactly the limit is one frame", () => {
    assert.deepEqual(encodeFrames(FrameType.Stdin, Buffer.alloc(0)), Buffer.from([4, 0, 0, 0, 0, 0, 0, 0]));
    assert.equal(encodeFrames(FrameType.Stdout, Buffer.alloc(MAX_PAYLOAD)).length, HEADER_SIZE + MAX_PAYLOAD);
  });
  test("refuses an oversize payload and an unknown type", () => {
    assert.throws(() => encodeFrame(FrameType.Stdout, Buffer.alloc(MAX_PAYLOAD + 1)), RangeError);
    assert.throws(() => encodeFrame(9 as FrameType), RangeError);
    assert.throws(() => encodeFrame(7 as FrameType), RangeError);
  });
  test("a resize frame is a known type in either direction, as the Rust decoder has it", () => {
    const resize = encodeFrame(FrameType.Resize, Buffer.from('{"rows":1,"cols":2}'));
    assert.deepEqual(decodeAll([resize], "host_to_guest").map((f) => f.type), [FrameType.Resize]);
    // In an output stream the decoder accepts the type; the readers refuse it (events.ts, exec.ts).
    const output = Buffer.concat([resize, bytesOf(manifest.fixtures.find((f) => f.file === "no_output.bin")!)]);
    assert.deepEqual(decodeAll([output], "guest_to_host").map((f) => f.type), [FrameType.Resize, FrameType.Exit]);
  });
  test("frames whole inside one chunk are views, split ones are assembled", () => {
    const a = encodeFrame(FrameType.Stdout, Buffer.from("hello"));
    const b = encodeFrame(FrameType.Stderr, Buffer.from("world!"));
    const both = Buffer.concat([a, b]);
    const d = new FrameDecoder("host_to_guest");
    const first = d.push(both.subarray(0, a.length + 3));
    assert.equal(first.length, 1);
    assert.equal(first[0]!.payload.buffer, both.buffer, "a whole frame is a view into the chunk");
    const second = d.push(both.subarray(a.length + 3));
    assert.deepEqual(second.map((f) => [f.type, f.payload.toString()]), [[FrameType.Stderr, "world!"]]);
    d.finish();
  });
});
