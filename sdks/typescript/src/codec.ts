// The crucible frame codec, written from docs/protocol.md alone (independently of the Rust
// `wire` crate), so that fixtures/ checks two implementations against each other:
//
//   [type:1][reserved:3][payload length:4, big-endian][payload ≤ 65,536 bytes]

import { CrucibleError } from "./errors.js";

export const HEADER_SIZE = 8;
export const MAX_PAYLOAD = 65536;

export const FrameType = {
  Stdout: 1,
  Stderr: 2,
  Exit: 3,
  Stdin: 4,
  StdinClose: 5,
  /** A terminal's new size (client to daemon): the payload is `{"rows":R,"cols":C}`. */
  Resize: 6,
} as const;
export type FrameType = (typeof FrameType)[keyof typeof FrameType];

/** The protocol's names for the types, as the fixture manifest spells them. */
export const FRAME_TYPE_NAMES: Readonly<Record<FrameType, string>> = {
  1: "stdout",
  2: "stderr",
  3: "exit",
  4: "stdin",
  5: "stdin_close",
  6: "resize",
};

export type FrameErrorKind =
  | "truncated_header"
  | "truncated_payload"
  | "oversize"
  | "unknown_type"
  | "missing_exit"
  | "data_after_exit";

/** An invalid frame stream; `kind` is the name docs/protocol.md and the fixtures use. */
export class FrameError extends CrucibleError {
  readonly kind: FrameErrorKind;

  constructor(kind: FrameErrorKind, message: string) {
    super(0, "protocol_error", `invalid frame stream (${kind}): ${message}`);
    this.kind = kind;
  }
}

export interface Frame {
  readonly type: FrameType;
  /** May be a view into the buffer that was pushed: copy it to keep it past that buffer's life. */
  readonly payload: Buffer;
}

/**
 * `guest_to_host` streams (exec output) end with exactly one exit frame; `host_to_guest`
 * streams (stdin) may end after any whole frame.
 */
export type Direction = "guest_to_host" | "host_to_guest";

const EMPTY = Buffer.alloc(0);

function isFrameType(t: number): t is FrameType {
  return t >= 1 && t <= 6;
}

/** One frame: header and payload in one buffer. The payload must fit in a frame. */
export function encodeFrame(type: FrameType, payload: Uint8Array = EMPTY): Buffer {
  if (!isFrameType(type)) throw new RangeError(`unknown frame type ${String(type)}`);
  if (payload.length > MAX_PAYLOAD) {
    throw new RangeError(`a payload of ${payload.length} bytes exceeds the ${MAX_PAYLOAD}-byte frame limit`);
  }
  const out = Buffer.allocUnsafe(HEADER_SIZE + payload.length);
  writeHeader(out, 0, type, payload.length);
  out.set(payload, HEADER_SIZE);
  return out;
}

/** `data` as consecutive frames of one type, split at the payload limit; empty data gives one empty frame. */
export function encodeFrames(type: FrameType, data: Uint8Array): Buffer {
  if (!isFrameType(type)) throw new RangeError(`unknown frame type ${String(type)}`);
  const count = Math.max(1, Math.ceil(data.length / MAX_PAYLOAD));
  const out = Buffer.allocUnsafe(count * HEADER_SIZE + data.length);
  let at = 0;
  for (let from = 0; from < data.length || at === 0; from += MAX_PAYLOAD) {
    const len = Math.min(MAX_PAYLOAD, data.length - from);
    writeHeader(out, at, type, len);
    out.set(data.subarray(from, from + len), at + HEADER_SIZE);
    at += HEADER_SIZE + len;
  }
  return out;
}

function writeHeader(out: Buffer, at: number, type: FrameType, length: number): void {
  out[at] = type;
  out[at + 1] = 0;
  out[at + 2] = 0;
  out[at + 3] = 0;
  out.writeUInt32BE(length, at + 4);
}

/**
 * Incremental decoder: push() chunks split anywhere, get the frames they complete, call
 * finish() at EOF. Frames that lie whole inside one pushed chunk are views into it (no copy),
 * which is what keeps a 64 MiB stream cheap. Errors are sticky: once the stream is invalid,
 * every later call throws the same error.
 */
export class FrameDecoder {
  readonly direction: Direction;
  // Only for a header split across chunks; made when one is.
  #header: Buffer | null = null;
  #headerFilled = 0;
  // The frame being assembled across chunks, once its header is known.
  #type: FrameType = FrameType.Stdout;
  #payload: Buffer | null = null;
  #payloadFilled = 0;
  #sawExit = false;
  #error: FrameError | null = null;

  constructor(direction: Direction = "guest_to_host") {
    this.direction = direction;
  }

  /** Whether the exit frame has been decoded. */
  get sawExit(): boolean {
    return this.#sawExit;
  }

  /** Adds bytes; returns the frames they completed, in order. Throws FrameError. */
  push(chunk: Uint8Array): Frame[] {
    const frames: Frame[] = [];
    this.pushEach(chunk, (frame) => frames.push(frame));
    return frames;
  }

  /** push() without the array: `onFrame` sees each completed frame as it is found. */
  pushEach(chunk: Uint8Array, onFrame: (frame: Frame) => void): void {
    if (this.#error) throw this.#error;
    const buf = Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk.buffer, chunk.byteOffset, chunk.length);
    let at = 0;
    const end = buf.length;
    while (at < end) {
      if (this.#sawExit && this.direction === "guest_to_host") {
        throw this.#fail("data_after_exit", `${end - at} bytes after the exit frame`);
      }
      if (this.#payload !== null) {
        const n = Math.min(this.#payload.length - this.#payloadFilled, end - at);
        buf.copy(this.#payload, this.#payloadFilled, at, at + n);
        this.#payloadFilled += n;
        at += n;
        if (this.#payloadFilled === this.#payload.length) {
          const payload = this.#payload;
          this.#payload = null;
          this.#emit(this.#type, payload, onFrame);
        }
        continue;
      }
      let type: number;
      let length: number;
      if (this.#headerFilled === 0 && end - at >= HEADER_SIZE) {
        type = buf[at]!;
        length = buf.readUInt32BE(at + 4);
        at += HEADER_SIZE;
      } else {
        const header = (this.#header ??= Buffer.alloc(HEADER_SIZE));
        const n = Math.min(HEADER_SIZE - this.#headerFilled, end - at);
        buf.copy(header, this.#headerFilled, at, at + n);
        this.#headerFilled += n;
        at += n;
        if (this.#headerFilled < HEADER_SIZE) break;
        this.#headerFilled = 0;
        type = header[0]!;
        length = header.readUInt32BE(4);
      }
      // The type byte first: a header wrong twice is unknown_type (docs/protocol.md).
      if (!isFrameType(type)) throw this.#fail("unknown_type", `frame type ${type}`);
      if (length > MAX_PAYLOAD) {
        throw this.#fail("oversize", `a header declares ${length} bytes, over the ${MAX_PAYLOAD}-byte limit`);
      }
      if (end - at >= length) {
        const payload = length === 0 ? EMPTY : buf.subarray(at, at + length);
        at += length;
        this.#emit(type, payload, onFrame);
      } else {
        this.#type = type;
        this.#payload = Buffer.allocUnsafe(length);
        this.#payloadFilled = 0;
      }
    }
  }

  /** Declares EOF: throws unless the stream ended on a frame boundary (and, for output, after its exit frame). */
  finish(): void {
    if (this.#error) throw this.#error;
    if (this.#headerFilled > 0) {
      throw this.#fail("truncated_header", `EOF after ${this.#headerFilled} of ${HEADER_SIZE} header bytes`);
    }
    if (this.#payload !== null) {
      throw this.#fail(
        "truncated_payload",
        `EOF after ${this.#payloadFilled} of the ${this.#payload.length} payload bytes its header declared`,
      );
    }
    if (this.direction === "guest_to_host" && !this.#sawExit) {
      throw this.#fail("missing_exit", "the stream ended without an exit frame: the command's result was lost");
    }
  }

  #emit(type: FrameType, payload: Buffer, onFrame: (frame: Frame) => void): void {
    if (type === FrameType.Exit) this.#sawExit = true;
    onFrame({ type, payload });
  }

  #fail(kind: FrameErrorKind, message: string): FrameError {
    this.#error = new FrameError(kind, message);
    return this.#error;
  }
}

/** Decodes a whole stream (or a sequence of chunks) and checks its end. */
export function decodeFrames(chunks: Iterable<Uint8Array>, direction: Direction = "guest_to_host"): Frame[] {
  const decoder = new FrameDecoder(direction);
  const frames: Frame[] = [];
  for (const chunk of chunks) {
    // Copies: the caller's chunks may be reused once this returns.
    decoder.pushEach(chunk, (f) => frames.push({ type: f.type, payload: Buffer.from(f.payload) }));
  }
  decoder.finish();
  return frames;
}
