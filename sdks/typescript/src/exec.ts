// One-shot exec and re-attach: a POST whose 200 answer is the command's frame stream, read
// either collected (run) or as events (stream). Both take the stream connections of
// http1.ts; run() decodes straight from the socket's reads, stream() through FrameEvents.
//
// A one-shot command runs on when its connection drops (unless it asked for
// `onDisconnect: "kill"`), and the daemon replays its output from any byte the client names.
// So a connection that breaks mid-stream need not lose the command: both paths re-attach from
// the output bytes already received, a few times, and the caller sees one unbroken stream.

import { FrameDecoder, FrameType } from "./codec.js";
import type { Frame } from "./codec.js";
import { ConnectionError, CrucibleError } from "./errors.js";
import type { Subject } from "./errors.js";
import { FrameEvents } from "./events.js";
import type { ExecEvent } from "./events.js";
import { CommandError, CommandResult } from "./result.js";
import type { ExecResult } from "./result.js";
import { parseExecResult } from "./result.js";
import type { Exchange } from "./http1.js";
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
  /** Output bytes the caller already has (an attach's offset); 0 when absent. */
  offset?: number;
  /** How a broken stream is taken up again; absent: a break is the caller's to see. */
  resume?: Resume;
}

/** Re-attaching a command whose stream broke. */
export interface Resume {
  /** The attach request's path for the command `execId` from output byte `offset`. */
  attachPath: (execId: string, offset: number) => string;
  /** How many re-attaches one stream may make. */
  tries: number;
}

const EMPTY = Buffer.alloc(0);

/**
 * Where a stream stands across its connections: the command's id, the output bytes
 * received (what a re-attach starts from), and the re-attaches made.
 */
class Resumption {
  readonly #t: Transport;
  readonly #req: StreamRequest;
  execId = "";
  received: number;
  tries = 0;

  constructor(t: Transport, req: StreamRequest) {
    this.#t = t;
    this.#req = req;
    this.received = req.offset ?? 0;
  }

  /** The first connection: the request itself. */
  async open(): Promise<Exchange> {
    const exchange = await this.#t.streams.post(this.#req.path, this.#req.body, this.#req.subject);
    this.execId = exchange.headers.get("x-crucible-exec-id") ?? this.execId;
    return exchange;
  }

  /**
   * After `broken`: a new connection attached from the bytes received, or the error the
   * caller sees. Only a broken connection is taken up again; an answer from the daemon (the
   * command is gone, another client attached) ends the stream.
   */
  async reopen(broken: unknown): Promise<Exchange> {
    let last = broken;
    for (;;) {
      const resume = this.#req.resume;
      if (!(last instanceof ConnectionError) || last.code === "closed") throw last;
      if (resume === undefined || this.execId === "" || this.tries >= resume.tries) {
        const tries = this.tries ? ` and ${this.tries} re-attaches` : "";
        throw new ConnectionError(0, last.code, `the exec stream of ${this.execId || "a command"} broke after ${this.received} output bytes${tries}: ${last.message}`, { cause: last });
      }
      this.tries++;
      await new Promise((resolve) => setTimeout(resolve, 100 * 2 ** this.tries));
      try {
        return await this.#t.streams.post(resume.attachPath(this.execId, this.received), "", "exec");
      } catch (e) {
        last = e;
      }
    }
  }
}

/**
 * Runs a stream to its end and returns the result, handing output to the callbacks and
 * keeping it unless told not to. The hot path of `run`: frames are decoded from the socket's
 * reads as they come, with no queue, generator or stream object between.
 */
export async function collect(t: Transport, req: StreamRequest, o: CollectOptions): Promise<CommandResult> {
  const stream = new Resumption(t, req);
  let exchange = await stream.open();
  const keep = o.collect !== false;
  const onStdout = o.onStdout;
  const onStderr = o.onStderr;
  let out: Buffer[] | null = null;
  let err: Buffer[] | null = null;
  let doc: ExecResultDocument | undefined;
  const onFrame = (f: Frame): void => {
    const p = f.payload;
    switch (f.type) {
      case FrameType.Stdout:
        if (p.length === 0) return;
        stream.received += p.length;
        if (keep) (out ??= []).push(p);
        onStdout?.(p);
        return;
      case FrameType.Stderr:
        if (p.length === 0) return;
        stream.received += p.length;
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
  for (;;) {
    // A new decoder per connection: a frame cut by the break is sent again, whole.
    const decoder = new FrameDecoder("guest_to_host");
    try {
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
      break;
    } catch (e) {
      // A connection that breaks after the exit frame has lost nothing.
      if (doc !== undefined && decoder.sawExit) break;
      exchange = await stream.reopen(e);
    }
  }
  const result = new CommandResult(doc!, stream.execId, concat(out), concat(err));
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
    const stream = new Resumption(this.#t, this.#req);
    let exchange = await stream.open();
    for (;;) {
      this.#execId = stream.execId;
      try {
        for await (const ev of new FrameEvents(exchange, stream.execId)) {
          if (ev.type === "exit") {
            this.#result = ev.result;
            if (this.#throwOnError && !ev.result.ok) throw new CommandError(ev.result, this.#req.cmd);
          } else {
            stream.received += ev.data.length;
          }
          yield ev;
        }
        return;
      } catch (e) {
        if (this.#result !== undefined) throw e;
        exchange = await stream.reopen(e);
      }
    }
  }
}
