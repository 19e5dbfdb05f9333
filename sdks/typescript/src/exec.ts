// One-shot exec and re-attach: a POST whose 200 answer is the command's frame stream, read
// either collected (run) or as events (stream). Both take the stream connections of
// http1.ts; run() decodes straight from the socket's reads, stream() through FrameEvents.

import { FrameDecoder, FrameType } from "./codec.js";
import type { Frame } from "./codec.js";
import { CrucibleError } from "./errors.js";
import type { Subject } from "./errors.js";
import { FrameEvents } from "./events.js";
import type { ExecEvent } from "./events.js";
import { CommandError, CommandResult } from "./result.js";
import type { ExecResult } from "./result.js";
import { parseExecResult } from "./result.js";
import type { Transport } from "./transport.js";
import type { ExecResultDocument } from "./types.js";

export type { ExecEvent } from "./events.js";

export interface OutputCallbacks {
  /** Each stdout chunk as it arrives (chunk boundaries mean nothing). */
  onStdout?: (data: Buffer) => void;
  onStderr?: (data: Buffer) => void;
}

export interface CollectOptions extends OutputCallbacks {
  /** Throw CommandError unless the command exited 0 (a lost stream included). Default false. */
  throwOnError?: boolean;
  /** Keep the output in the result (default true); false when callbacks consume it. */
  collect?: boolean;
}

/** A request that answers with a frame stream. */
export interface StreamRequest {
  path: string;
  body: string;
  subject: Subject;
  /** For messages: the argv, when it is known. */
  cmd: readonly string[];
}

const EMPTY = Buffer.alloc(0);

/**
 * Runs a stream to its end and returns the result, handing output to the callbacks and
 * keeping it unless told not to. The hot path of `run`: frames are decoded from the socket's
 * reads as they come, with no queue, generator or stream object between.
 */
export async function collect(t: Transport, req: StreamRequest, o: CollectOptions): Promise<CommandResult> {
  const exchange = await t.streams.post(req.path, req.body, req.subject);
  const execId = exchange.headers.get("x-crucible-exec-id") ?? "";
  const keep = o.collect !== false;
  const onStdout = o.onStdout;
  const onStderr = o.onStderr;
  let out: Buffer[] | null = null;
  let err: Buffer[] | null = null;
  let doc: ExecResultDocument | undefined;
  const decoder = new FrameDecoder("guest_to_host");
  const onFrame = (f: Frame): void => {
    const p = f.payload;
    switch (f.type) {
      case FrameType.Stdout:
        if (p.length === 0) return;
        if (keep) (out ??= []).push(p);
        onStdout?.(p);
        return;
      case FrameType.Stderr:
        if (p.length === 0) return;
        if (keep) (err ??= []).push(p);
        onStderr?.(p);
        return;
      case FrameType.Exit:
        doc = parseExecResult(p);
        return;
      default:
        throw new CrucibleError(0, "protocol_error", `unexpected frame of type ${f.type} from the daemon (an output stream carries stdout, stderr and exit)`);
    }
  };
  await new Promise<void>((resolve, reject) => {
    exchange.start({
      data: (chunk) => {
        try {
          decoder.pushEach(chunk, onFrame);
        } catch (e) {
          exchange.close();
          reject(e);
        }
      },
      end: () => {
        try {
          decoder.finish();
          resolve();
        } catch (e) {
          reject(e);
        }
      },
      error: reject,
    });
  });
  const result = new CommandResult(doc!, execId, concat(out), concat(err));
  if (o.throwOnError && !result.ok) throw new CommandError(result, req.cmd);
  return result;
}

function concat(chunks: Buffer[] | null): Buffer {
  if (chunks === null) return EMPTY;
  // Always a copy: the chunks are views into socket reads, which a result must not pin.
  return chunks.length === 1 ? Buffer.from(chunks[0]!) : Buffer.concat(chunks);
}

/**
 * A command's output as an async iterable of events. The request is sent when iteration
 * starts; leaving the loop early closes the connection (the command runs on unless it was
 * started with `onDisconnect: "kill"`, and `attach` finds it by its exec id).
 */
export class ExecStream implements AsyncIterable<ExecEvent> {
  readonly #t: Transport;
  readonly #req: StreamRequest;
  readonly #throwOnError: boolean;
  #started = false;
  #execId = "";
  #result: ExecResult | undefined;

  constructor(t: Transport, req: StreamRequest, throwOnError: boolean) {
    this.#t = t;
    this.#req = req;
    this.#throwOnError = throwOnError;
  }

  /** The command's exec id, known once the daemon answered. */
  get execId(): string {
    return this.#execId;
  }

  /** How the command ended, once the exit event has been seen. */
  get result(): ExecResult | undefined {
    return this.#result;
  }

  [Symbol.asyncIterator](): AsyncIterator<ExecEvent> {
    if (this.#started) throw new TypeError("an ExecStream can be iterated once");
    this.#started = true;
    return this.#events();
  }

  async *#events(): AsyncGenerator<ExecEvent, void, undefined> {
    const exchange = await this.#t.streams.post(this.#req.path, this.#req.body, this.#req.subject);
    this.#execId = exchange.headers.get("x-crucible-exec-id") ?? "";
    for await (const ev of new FrameEvents(exchange, this.#execId)) {
      if (ev.type === "exit") {
        this.#result = ev.result;
        if (this.#throwOnError && !ev.result.ok) throw new CommandError(ev.result, this.#req.cmd);
      }
      yield ev;
    }
  }
}
