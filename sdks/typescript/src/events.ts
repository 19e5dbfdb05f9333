// A frame stream from the daemon as async-iterable events: decoded as bytes arrive, queued
// for a consumer that pulls, with backpressure on the source so that a command printing
// faster than the caller reads slows down instead of filling memory. Streams, re-attaches and
// interactive sessions all read through this one type.

import { FrameDecoder, FrameType } from "./codec.js";
import type { Frame } from "./codec.js";
import { ConnectionError, CrucibleError } from "./errors.js";
import type { Source } from "./pipe.js";
import { ExecResult, parseExecResult } from "./result.js";

/** What a command's output stream carries, in order: output chunks, then one exit. */
export type ExecEvent =
  | { readonly type: "stdout"; readonly data: Buffer }
  | { readonly type: "stderr"; readonly data: Buffer }
  | { readonly type: "exit"; readonly result: ExecResult };

export type Final = { ok: true; result: ExecResult } | { ok: false; error: Error };

const HIGH_WATER = 1 << 20;
const LOW_WATER = 1 << 18;

export class FrameEvents implements AsyncIterable<ExecEvent> {
  readonly #source: Source;
  readonly #execId: string;
  readonly #decoder = new FrameDecoder("guest_to_host");
  readonly #queue: ExecEvent[] = [];
  #head = 0;
  #queuedBytes = 0;
  #paused = false;
  #wake: (() => void) | null = null;
  #final: Final | null = null;
  #doc: ExecResult | null = null;
  #iterating = false;
  readonly done: Promise<Final>;
  #resolveDone!: (f: Final) => void;

  constructor(source: Source, execId: string) {
    this.#source = source;
    this.#execId = execId;
    this.done = new Promise((resolve) => (this.#resolveDone = resolve));
    source.start({
      data: (chunk) => this.#data(chunk),
      end: (refusal) => this.#end(refusal),
      error: (e) => this.#error(e),
    });
  }

  /** How the stream ended, once it has. */
  get final(): Final | null {
    return this.#final;
  }

  get iterating(): boolean {
    return this.#iterating;
  }

  [Symbol.asyncIterator](): AsyncIterator<ExecEvent> {
    if (this.#iterating) throw new TypeError("a command's events can be iterated once");
    this.#iterating = true;
    return this.#events();
  }

  async *#events(): AsyncGenerator<ExecEvent, void, undefined> {
    try {
      for (;;) {
        if (this.#head < this.#queue.length) {
          const ev = this.#queue[this.#head]!;
          this.#queue[this.#head++] = undefined as never;
          if (this.#head === this.#queue.length) {
            this.#queue.length = 0;
            this.#head = 0;
          }
          if (ev.type !== "exit") this.#consumed(ev.data.length);
          yield ev;
          if (ev.type === "exit") return;
          continue;
        }
        if (this.#final !== null && !this.#final.ok) throw this.#final.error;
        await new Promise<void>((resolve) => (this.#wake = resolve));
      }
    } finally {
      // Leaving early closes the stream: nobody reads what the command prints any more.
      if (this.#final === null) this.close(new ConnectionError(0, "closed", "the stream was closed before the command ended"));
    }
  }

  /** Ends the stream with `error` (if it has not ended) and closes its connection. */
  close(error: Error): void {
    this.#settle({ ok: false, error });
  }

  #data(chunk: Buffer): void {
    if (this.#final !== null) return;
    try {
      this.#decoder.pushEach(chunk, (f) => this.#frame(f));
    } catch (e) {
      this.#settle({ ok: false, error: e as Error });
      return;
    }
    if (this.#queuedBytes > HIGH_WATER && !this.#paused) {
      this.#paused = true;
      this.#source.pause();
    }
    this.#notify();
  }

  #frame(f: Frame): void {
    switch (f.type) {
      case FrameType.Stdout:
      case FrameType.Stderr:
        if (f.payload.length === 0) return;
        this.#queue.push({ type: f.type === FrameType.Stdout ? "stdout" : "stderr", data: f.payload });
        this.#queuedBytes += f.payload.length;
        return;
      case FrameType.Exit:
        this.#doc = new ExecResult(parseExecResult(f.payload), this.#execId);
        return;
      default:
        throw new CrucibleError(0, "protocol_error", `unexpected frame of type ${f.type} from the daemon (an output stream carries stdout, stderr and exit)`);
    }
  }

  /** A connection that breaks after the exit frame has lost nothing: the stream is complete. */
  #error(e: Error): void {
    if (this.#final === null && this.#decoder.sawExit) this.#end();
    else this.#settle({ ok: false, error: e });
  }

  #end(refusal?: Error): void {
    if (this.#final !== null) return;
    if (!this.#decoder.sawExit && refusal !== undefined) {
      this.#settle({ ok: false, error: refusal });
      return;
    }
    try {
      this.#decoder.finish();
    } catch (e) {
      this.#settle({ ok: false, error: e as Error });
      return;
    }
    const result = this.#doc!;
    this.#queue.push({ type: "exit", result });
    this.#settle({ ok: true, result });
  }

  #consumed(n: number): void {
    this.#queuedBytes -= n;
    if (this.#paused && this.#queuedBytes < LOW_WATER) {
      this.#paused = false;
      this.#source.resume();
    }
  }

  #settle(f: Final): void {
    if (this.#final !== null) return;
    this.#final = f;
    this.#source.close();
    this.#resolveDone(f);
    this.#notify();
  }

  #notify(): void {
    const wake = this.#wake;
    this.#wake = null;
    wake?.();
  }
}
