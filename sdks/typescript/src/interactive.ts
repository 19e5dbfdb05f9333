// An interactive session: stdin frames out, output events in, over whichever pipe the
// transport gives (a hijacked HTTP connection or a WebSocket). A session started with `tty`
// has a terminal, and resize frames change its size.

import { FrameType, encodeFrame, encodeFrames } from "./codec.js";
import { ConnectionError, CrucibleError } from "./errors.js";
import { FrameEvents } from "./events.js";
import type { ExecEvent } from "./events.js";
import type { Pipe } from "./pipe.js";
import { CommandError, CommandResult } from "./result.js";
import type { ExecResult } from "./result.js";
import { terminalDimension } from "./types.js";

export class InteractiveSession implements AsyncIterable<ExecEvent>, AsyncDisposable {
  /** The command's exec id (as the daemon named it, or as the SDK did for a WebSocket). */
  readonly execId: string;
  readonly transport: "hijack" | "websocket";
  /** Whether the command runs on a terminal (started with `tty: true`): what resize() needs. */
  readonly tty: boolean;
  readonly #pipe: Pipe;
  readonly #cmd: readonly string[];
  readonly #events: FrameEvents;
  #stdinClosed = false;

  constructor(pipe: Pipe, execId: string, cmd: readonly string[], transport: "hijack" | "websocket", tty = false) {
    this.#pipe = pipe;
    this.execId = execId;
    this.#cmd = cmd;
    this.transport = transport;
    this.tty = tty;
    this.#events = new FrameEvents(pipe, execId);
  }

  /** Sends bytes to the command's stdin (split into frames as needed). */
  async send(data: string | Uint8Array): Promise<void> {
    if (this.#stdinClosed) throw new TypeError("send() after closeStdin(): the command's stdin is closed");
    const bytes = typeof data === "string" ? Buffer.from(data, "utf8") : data;
    if (bytes.length === 0) return;
    await this.#settled();
    const f = this.#events.final;
    if (f !== null) {
      throw f.ok ? new ConnectionError(0, "closed", `the command ${JSON.stringify(this.#cmd)} has ended: its stdin is gone`) : f.error;
    }
    try {
      await this.#pipe.write(encodeFrames(FrameType.Stdin, bytes));
    } catch (e) {
      throw e instanceof CrucibleError ? e : new ConnectionError(0, "unreachable", `writing to the session of ${JSON.stringify(this.#cmd)}: ${(e as Error).message}`, { cause: e });
    }
  }

  /**
   * Closes the command's stdin (the `stdin_close` frame): the command reads EOF. Never
   * fails for a command that ended meanwhile: its stdin is closed either way, and how it
   * ended is for wait() or the events to say.
   */
  async closeStdin(): Promise<void> {
    if (this.#stdinClosed) return;
    this.#stdinClosed = true;
    await this.#settled();
    if (this.#events.final !== null) return;
    try {
      await this.#pipe.write(encodeFrame(FrameType.StdinClose));
    } catch {
      // The daemon closed the connection after the exit frame: see above.
    }
  }

  /**
   * Sets the size of the command's terminal (the `resize` frame; the command gets SIGWINCH).
   * `rows` and `cols` are integers from 0 to 65535 (else a TypeError naming the one that is
   * not); a session started without `tty: true` has no terminal to resize (TypeError, nothing
   * sent). Once the command has ended it does nothing: there is no terminal left.
   */
  async resize(rows: number, cols: number): Promise<void> {
    const size = { rows: terminalDimension(rows, "rows"), cols: terminalDimension(cols, "cols") };
    if (!this.tty) throw new TypeError(`resize() needs a terminal: the session of ${JSON.stringify(this.#cmd)} was started without \`tty: true\``);
    await this.#settled();
    if (this.#events.final !== null) return;
    try {
      await this.#pipe.write(encodeFrame(FrameType.Resize, Buffer.from(JSON.stringify(size), "utf8")));
    } catch (e) {
      throw e instanceof CrucibleError ? e : new ConnectionError(0, "unreachable", `resizing the terminal of ${JSON.stringify(this.#cmd)}: ${(e as Error).message}`, { cause: e });
    }
  }

  /**
   * Lets the event loop read what has arrived before writing. A command that exits on its
   * own is followed by its exit frame and the daemon closing the connection; a write that
   * meets the closed connection fails with EPIPE, and Node then drops the socket with the
   * exit frame still unread in it. Reading first makes that race a window of microseconds.
   */
  #settled(): Promise<void> {
    // Twice: an immediate queued from an I/O callback runs before the loop polls again, the
    // second one only after a poll has delivered what arrived.
    return new Promise((resolve) => setImmediate(() => setImmediate(resolve)));
  }

  /** stdout/stderr events as they arrive, then one exit event. Iterable once. */
  [Symbol.asyncIterator](): AsyncIterator<ExecEvent> {
    return this.#events[Symbol.asyncIterator]();
  }

  /**
   * Waits for the command to end. Output no iteration of the session consumed is collected
   * into the result; with an iteration under way, the result has no output.
   */
  async wait(options: { throwOnError?: boolean } = {}): Promise<CommandResult> {
    const stdout: Buffer[] = [];
    const stderr: Buffer[] = [];
    let result: ExecResult | undefined;
    if (!this.#events.iterating) {
      for await (const ev of this.#events) {
        if (ev.type === "stdout") stdout.push(ev.data);
        else if (ev.type === "stderr") stderr.push(ev.data);
        else result = ev.result;
      }
    } else {
      const f = await this.#events.done;
      if (!f.ok) throw f.error;
      result = f.result;
    }
    const collected = new CommandResult(result!.raw, this.execId, Buffer.concat(stdout), Buffer.concat(stderr));
    if (options.throwOnError && !collected.ok) throw new CommandError(collected, this.#cmd);
    return collected;
  }

  /** Drops the connection; a command still running is killed (unless started with `onDisconnect: "keep"`). */
  close(): void {
    this.#events.close(new ConnectionError(0, "closed", `the session of ${JSON.stringify(this.#cmd)} was closed before the command ended`));
  }

  async [Symbol.asyncDispose](): Promise<void> {
    this.close();
  }
}
