// One-shot exec and re-attach: a POST whose 200 answer is the command's frame stream, read
// either collected (run) or as events (stream). The two share one reader so they cannot
// disagree on what a valid stream is.

import type { Dispatcher } from "undici";

import { FrameDecoder, FrameType } from "./codec.js";
import type { Frame } from "./codec.js";
import { CrucibleError } from "./errors.js";
import type { Subject } from "./errors.js";
import { CommandError, CommandResult, ExecResult, parseExecResult } from "./result.js";
import type { Transport } from "./transport.js";
import type { ExecResultDocument } from "./types.js";

/** What a command's output stream carries, in order: output chunks, then one exit. */
export type ExecEvent =
  | { readonly type: "stdout"; readonly data: Buffer }
  | { readonly type: "stderr"; readonly data: Buffer }
  | { readonly type: "exit"; readonly result: ExecResult };

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

function unexpected(frame: Frame): CrucibleError {
  return new CrucibleError(0, "protocol_error", `unexpected frame of type ${frame.type} from the daemon (an output stream carries stdout, stderr and exit)`);
}

/** Opens the stream; rejects with the daemon's error before any output. */
export async function open(t: Transport, req: StreamRequest): Promise<{ res: Dispatcher.ResponseData; execId: string }> {
  const res = await t.streamJson(req.path, req.body, req.subject);
  const header = res.headers["x-crucible-exec-id"];
  return { res, execId: typeof header === "string" ? header : "" };
}

/**
 * Reads a stream to its end and returns the result, handing output to the callbacks and
 * keeping it unless told not to. The hot path of `run`: no generator, no per-frame objects
 * beyond what the decoder hands out.
 */
export async function collect(t: Transport, req: StreamRequest, o: CollectOptions): Promise<CommandResult> {
  const { res, execId } = await open(t, req);
  const keep = o.collect !== false;
  const out: Buffer[] = [];
  const err: Buffer[] = [];
  let doc: ExecResultDocument | undefined;
  const decoder = new FrameDecoder("guest_to_host");
  const onFrame = (f: Frame): void => {
    switch (f.type) {
      case FrameType.Stdout:
        if (f.payload.length === 0) return;
        if (keep) out.push(f.payload);
        o.onStdout?.(f.payload);
        return;
      case FrameType.Stderr:
        if (f.payload.length === 0) return;
        if (keep) err.push(f.payload);
        o.onStderr?.(f.payload);
        return;
      case FrameType.Exit:
        doc = parseExecResult(f.payload);
        return;
      default:
        throw unexpected(f);
    }
  };
  try {
    for await (const chunk of res.body) decoder.pushEach(chunk as Buffer, onFrame);
  } catch (e) {
    res.body.destroy();
    throw t.connectionError(e, `the output stream of ${JSON.stringify(req.cmd)}`);
  }
  decoder.finish();
  const result = new CommandResult(doc!, execId, concat(out), concat(err));
  if (o.throwOnError && !result.ok) throw new CommandError(result, req.cmd);
  return result;
}

function concat(chunks: Buffer[]): Buffer {
  if (chunks.length === 0) return Buffer.alloc(0);
  // A single chunk is a view into a socket read: copy it so the result does not pin that read.
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
    const { res, execId } = await open(this.#t, this.#req);
    this.#execId = execId;
    const decoder = new FrameDecoder("guest_to_host");
    let ended = false;
    try {
      for await (const chunk of iterate(res, this.#t, this.#req)) {
        for (const f of decoder.push(chunk)) {
          switch (f.type) {
            case FrameType.Stdout:
              if (f.payload.length > 0) yield { type: "stdout", data: f.payload };
              break;
            case FrameType.Stderr:
              if (f.payload.length > 0) yield { type: "stderr", data: f.payload };
              break;
            case FrameType.Exit: {
              this.#result = new ExecResult(parseExecResult(f.payload), execId);
              break;
            }
            default:
              throw unexpected(f);
          }
        }
      }
      decoder.finish();
      ended = true;
    } finally {
      if (!ended) res.body.destroy();
    }
    const result = this.#result!;
    if (this.#throwOnError && !result.ok) throw new CommandError(result, this.#req.cmd);
    yield { type: "exit", result };
  }
}

async function* iterate(res: Dispatcher.ResponseData, t: Transport, req: StreamRequest): AsyncGenerator<Buffer> {
  try {
    for await (const chunk of res.body) yield chunk as Buffer;
  } catch (e) {
    throw t.connectionError(e, `the output stream of ${JSON.stringify(req.cmd)}`);
  }
}
