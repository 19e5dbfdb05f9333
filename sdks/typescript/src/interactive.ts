// An interactive session: stdin frames out, output frames in, over whichever byte pipe the
// transport gives (a hijacked HTTP connection or a WebSocket). The session owns the decoding,
// the event queue and its backpressure; the pipes only move bytes.

import { FrameDecoder, FrameType, encodeFrame, encodeFrames } from "./codec.js";
import type { Frame } from "./codec.js";
import { ConnectionError, CrucibleError } from "./errors.js";
import type { ExecEvent } from "./exec.js";
import { CommandError, CommandResult, ExecResult, parseExecResult } from "./result.js";

/** Where a pipe's bytes go. */
export interface PipeSink {
  data(chunk: Buffer): void;
  /**
   * The peer ended the stream. `refusal` is the transport's word for why, when it has one (a
   * WebSocket close code), used only if the stream ended before its exit frame.
   */
  end(refusal?: CrucibleError): void;
  error(e: Error): void;
}

/** A full-duplex byte stream to the daemon. */
export interface Pipe {
  /** Resolves once the bytes are handed to the OS (so a fast sender waits for a slow reader). */
  write(data: Buffer): Promise<void>;
  /** Delivers bytes from now on; `leftover` first, if the transport read some with its head. */
  start(sink: PipeSink): void;
  pause(): void;
  resume(): void;
  /** Drops the connection (which kills the command unless it was started with `onDisconnect: "keep"`). */
  close(): void;
}

// Queued output past which the pipe is paused until the consumer catches up, so that a
// command printing faster than the caller reads slows down instead of filling memory.
const HIGH_WATER = 1 << 20;
const LOW_WATER = 1 << 18;

type Final = { ok: true; result: ExecResult } | { ok: false; error: Error };

export class InteractiveSession implements AsyncIterable<ExecEvent>, AsyncDisposable {
  /** The command's exec id (as the daemon named it). */
  readonly execId: string;
  readonly transport: "hijack" | "websocket";
  readonly #pipe: Pipe;
  readonly #cmd: readonly string[];
  readonly #decoder = new FrameDecoder("guest_to_host");
  #queue: ExecEvent[] = [];
  #queuedBytes = 0;
  #paused = false;
  #wake: (() => void) | null = null;
  #final: Final | null = null;
  #doc: ExecResult | null = null;
  #iterating = false;
  #stdinClosed = false;
  readonly #done: Promise<Final>;
  #resolveDone!: (f: Final) => void;

  constructor(pipe: Pipe, execId: string, cmd: readonly string[], transport: "hijack" | "websocket") {
    this.#pipe = pipe;
    this.execId = execId;
    this.#cmd = cmd;
    this.transport = transport;
    this.#done = new Promise((resolve) => (this.#resolveDone = resolve));
    pipe.start({
      data: (chunk) => this.#data(chunk),
      end: (refusal) => this.#end(refusal),
      error: (e) => this.#settle({ ok: false, error: e }),
    });
  }

  /** Sends bytes to the command's stdin (split into frames as needed). */
  async send(data: string | Uint8Array): Promise<void> {
    if (this.#stdinClosed) throw new TypeError("send() after closeStdin(): the command's stdin is closed");
    const bytes = typeof data === "string" ? Buffer.from(data, "utf8") : data;
    if (bytes.length === 0) return;
    await this.#write(encodeFrames(FrameType.Stdin, bytes));
  }

  /** Closes the command's stdin (the `stdin_close` frame); the command sees EOF. */
  async closeStdin(): Promise<void> {
    if (this.#stdinClosed) return;
    this.#stdinClosed = true;
    // A command that already ended has nothing left to close.
    if (this.#final !== null) return;
    await this.#write(encodeFrame(FrameType.StdinClose));
  }

  async #write(frame: Buffer): Promise<void> {
    if (this.#final !== null && !this.#final.ok) throw this.#final.error;
    try {
      await this.#pipe.write(frame);
    } catch (e) {
      throw e instanceof CrucibleError ? e : new ConnectionError(0, "unreachable", `writing to the session of ${JSON.stringify(this.#cmd)}: ${(e as Error).message}`, { cause: e });
    }
  }

  /** stdout/stderr events as they arrive, then one exit event. Iterable once. */
  [Symbol.asyncIterator](): AsyncIterator<ExecEvent> {
    if (this.#iterating) throw new TypeError("an interactive session's events can be iterated once");
    this.#iterating = true;
    return this.#events();
  }

  async *#events(): AsyncGenerator<ExecEvent, void, undefined> {
    try {
      for (;;) {
        const ev = this.#queue.shift();
        if (ev !== undefined) {
          if (ev.type !== "exit") this.#consumed(ev.data.length);
          yield ev;
          if (ev.type === "exit") return;
          continue;
        }
        if (this.#final !== null && !this.#final.ok) throw this.#final.error;
        await new Promise<void>((resolve) => (this.#wake = resolve));
      }
    } finally {
      // Leaving early closes the session: nobody reads what the command prints any more.
      if (this.#final === null) this.close();
    }
  }

  /**
   * Waits for the command to end. Output not consumed by an iteration of the session is
   * collected into the result; with an iteration under way, the result has no output.
   */
  async wait(options: { throwOnError?: boolean } = {}): Promise<CommandResult> {
    const stdout: Buffer[] = [];
    const stderr: Buffer[] = [];
    let result: ExecResult;
    if (!this.#iterating) {
      let last: ExecResult | undefined;
      for await (const ev of this) {
        if (ev.type === "stdout") stdout.push(ev.data);
        else if (ev.type === "stderr") stderr.push(ev.data);
        else last = ev.result;
      }
      result = last!;
    } else {
      const f = await this.#done;
      if (!f.ok) throw f.error;
      result = f.result;
    }
    const collected = new CommandResult(result.raw, this.execId, Buffer.concat(stdout), Buffer.concat(stderr));
    if (options.throwOnError && !collected.ok) throw new CommandError(collected, this.#cmd);
    return collected;
  }

  /** Drops the connection; a command still running is killed (unless it was started with `onDisconnect: "keep"`). */
  close(): void {
    this.#settle({ ok: false, error: new ConnectionError(0, "closed", `the session of ${JSON.stringify(this.#cmd)} was closed before the command ended`) });
  }

  async [Symbol.asyncDispose](): Promise<void> {
    this.close();
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
      this.#pipe.pause();
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
        this.#doc = new ExecResult(parseExecResult(f.payload), this.execId);
        return;
      default:
        throw new CrucibleError(0, "protocol_error", `unexpected frame of type ${f.type} from the daemon`);
    }
  }

  #end(refusal?: CrucibleError): void {
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
      this.#pipe.resume();
    }
  }

  #settle(f: Final): void {
    if (this.#final !== null) return;
    this.#final = f;
    this.#pipe.close();
    this.#resolveDone(f);
    this.#notify();
  }

  #notify(): void {
    const wake = this.#wake;
    this.#wake = null;
    wake?.();
  }
}
