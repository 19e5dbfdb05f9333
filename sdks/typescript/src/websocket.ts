// The WebSocket interactive exec: `GET …/exec` with an upgrade, the ExecRequest as the first
// message, then binary messages whose concatenated payloads are the frame stream each way
// (a frame may span messages, a message may hold several: the session decodes the bytes).

import WebSocket from "ws";

import {
  AgentError,
  ConnectionError,
  CrucibleError,
  InvalidRequest,
  TooManyRequests,
  errorFromBody,
} from "./errors.js";
import type { Subject } from "./errors.js";
import type { Pipe, PipeSink } from "./pipe.js";
import type { Transport } from "./transport.js";

/** Opens the socket and sends the request; pre-upgrade HTTP errors reject with their class. */
export function openWebSocket(t: Transport, path: string, request: string, subject: Subject): Promise<Pipe> {
  const e = t.endpoint;
  const url = e.kind === "unix" ? `ws+unix://${e.path}:${path}` : `ws://${t.authority}${path}`;
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(url, {
      headers: t.authHeaders(),
      handshakeTimeout: t.requestTimeoutMs,
      perMessageDeflate: false,
      // The daemon refuses messages over 8 MiB; it never sends one that big either.
      maxPayload: 8 << 20,
    });
    let settled = false;
    const fail = (err: Error): void => {
      if (settled) return;
      settled = true;
      ws.terminate();
      reject(err);
    };
    ws.once("unexpected-response", (_req, res) => {
      const parts: Buffer[] = [];
      res.on("data", (c: Buffer) => parts.push(c));
      res.once("end", () => fail(errorFromBody(res.statusCode ?? 0, Buffer.concat(parts).toString("utf8"), subject)));
      res.once("error", () => fail(errorFromBody(res.statusCode ?? 0, Buffer.concat(parts).toString("utf8"), subject)));
    });
    ws.once("error", (err) => fail(t.connectionError(err, `GET ${path} (WebSocket)`)));
    ws.once("open", () => {
      if (settled) return;
      settled = true;
      ws.removeAllListeners("error");
      const pipe = new WebSocketPipe(ws);
      ws.send(request, { binary: false }, (err) => {
        if (err) pipe.fail(err);
      });
      resolve(pipe);
    });
  });
}

/** A close before the exit frame, as the error its code stands for (docs/protocol.md). */
export function closeError(code: number, reason: string): CrucibleError {
  const why = reason ? `: ${reason}` : "";
  switch (code) {
    case 1008:
      return new InvalidRequest(0, "invalid_request", `the daemon refused the request (WebSocket close 1008)${why}`);
    case 1011:
      return new AgentError(0, "agent_error", `the sandbox's agent was unreachable or lost (WebSocket close 1011)${why}`);
    case 1013:
      return new TooManyRequests(0, "too_many_requests", `the sandbox's exec limit is reached (WebSocket close 1013)${why}`);
    default:
      return new ConnectionError(0, "unreachable", `the WebSocket closed with ${code} before the exit frame${why}`);
  }
}

class WebSocketPipe implements Pipe {
  readonly #ws: WebSocket;
  #sink: PipeSink | null = null;
  // Anything before start(): the daemon may answer before the session is listening.
  #early: Array<() => void> = [];

  constructor(ws: WebSocket) {
    this.#ws = ws;
    ws.on("message", (data, isBinary) => {
      this.#deliver((sink) => {
        if (!isBinary) {
          sink.error(new CrucibleError(0, "protocol_error", "the daemon sent a text message in the frame stream"));
          return;
        }
        sink.data(toBuffer(data));
      });
    });
    ws.once("close", (code, reason) => {
      this.#deliver((sink) => (code === 1000 ? sink.end() : sink.end(closeError(code, reason.toString("utf8")))));
    });
    ws.on("error", (err) => this.fail(err));
  }

  fail(err: Error): void {
    this.#deliver((sink) => sink.error(new ConnectionError(0, "unreachable", `the session's WebSocket broke: ${err.message}`, { cause: err })));
  }

  #deliver(f: (sink: PipeSink) => void): void {
    if (this.#sink) f(this.#sink);
    else this.#early.push(() => f(this.#sink!));
  }

  write(data: Buffer): Promise<void> {
    return new Promise((resolve, reject) => {
      if (this.#ws.readyState !== WebSocket.OPEN) {
        reject(new ConnectionError(0, "closed", "the session's WebSocket is closed"));
        return;
      }
      this.#ws.send(data, { binary: true }, (err) => (err ? reject(err) : resolve()));
    });
  }

  start(sink: PipeSink): void {
    this.#sink = sink;
    const early = this.#early;
    this.#early = [];
    for (const f of early) f();
  }

  pause(): void {
    this.#ws.pause();
  }

  resume(): void {
    this.#ws.resume();
  }

  close(): void {
    if (this.#ws.readyState === WebSocket.OPEN || this.#ws.readyState === WebSocket.CONNECTING) this.#ws.terminate();
  }
}

function toBuffer(data: WebSocket.RawData): Buffer {
  if (Buffer.isBuffer(data)) return data;
  if (Array.isArray(data)) return Buffer.concat(data);
  return Buffer.from(data);
}
