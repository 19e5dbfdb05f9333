// The hijacked interactive exec: `POST …/exec?stdin=1` as the first request of a connection of
// its own; after a bare `HTTP/1.1 200 OK` head the connection is a raw frame stream both ways.
// undici cannot hand a connection over mid-response, so this speaks the little HTTP it needs.

import type net from "node:net";

import { ConnectionError, errorFromBody } from "./errors.js";
import type { Subject } from "./errors.js";
import { parseHead } from "./http1.js";
import type { Head } from "./http1.js";
import type { Pipe, PipeSink } from "./pipe.js";
import type { Transport } from "./transport.js";

const MAX_HEAD = 64 * 1024;

export interface HijackAnswer {
  pipe: Pipe;
  headers: Map<string, string>;
}

/** Sends the request and reads the answer's head; a non-200 answer rejects with its error class. */
export async function hijack(t: Transport, path: string, body: string, subject: Subject): Promise<HijackAnswer> {
  const socket = await t.connect();
  const payload = Buffer.from(body, "utf8");
  let head = `POST ${path} HTTP/1.1\r\nHost: ${t.authority}\r\nContent-Type: application/json\r\nContent-Length: ${payload.length}\r\n`;
  for (const [k, v] of Object.entries(t.authHeaders())) head += `${k}: ${v}\r\n`;
  socket.write(Buffer.concat([Buffer.from(`${head}\r\n`, "latin1"), payload]));
  let answer: { status: number; headers: Map<string, string>; rest: Buffer };
  try {
    answer = await readHead(socket, t.requestTimeoutMs);
  } catch (e) {
    socket.destroy();
    throw e;
  }
  if (answer.status !== 200) {
    const length = Number(answer.headers.get("content-length") ?? "0");
    let text: string;
    try {
      text = (await readBody(socket, answer.rest, length, t.requestTimeoutMs)).toString("utf8");
    } finally {
      socket.destroy();
    }
    throw errorFromBody(answer.status, text, subject);
  }
  return { pipe: new SocketPipe(socket, answer.rest), headers: answer.headers };
}

function readHead(socket: net.Socket, timeoutMs: number): Promise<{ status: number; headers: Map<string, string>; rest: Buffer }> {
  return new Promise((resolve, reject) => {
    let buf: Buffer = Buffer.alloc(0);
    const finish = (err: Error | null, value?: { status: number; headers: Map<string, string>; rest: Buffer }): void => {
      clearTimeout(timer);
      socket.off("data", onData);
      socket.off("end", onEnd);
      socket.off("error", onError);
      if (err) reject(err);
      else resolve(value!);
    };
    const onData = (chunk: Buffer): void => {
      buf = buf.length === 0 ? chunk : Buffer.concat([buf, chunk]);
      const end = buf.indexOf("\r\n\r\n");
      if (end < 0) {
        if (buf.length > MAX_HEAD) finish(new ConnectionError(0, "protocol_error", `the daemon's answer head exceeds ${MAX_HEAD} bytes`));
        return;
      }
      // Stop the flow before handing over: bytes after the head belong to the frame stream.
      socket.pause();
      let head: Head;
      try {
        head = parseHead(buf.toString("latin1", 0, end));
      } catch (e) {
        finish(e as Error);
        return;
      }
      finish(null, { ...head, rest: buf.subarray(end + 4) });
    };
    const onEnd = (): void => finish(new ConnectionError(0, "unreachable", "the daemon closed the connection before answering"));
    const onError = (e: Error): void => finish(new ConnectionError(0, "unreachable", `the connection broke before the daemon answered: ${e.message}`, { cause: e }));
    const timer = setTimeout(() => finish(new ConnectionError(0, "timeout", `the daemon did not answer within ${timeoutMs} ms`)), timeoutMs);
    socket.on("data", onData);
    socket.once("end", onEnd);
    socket.once("error", onError);
  });
}

function readBody(socket: net.Socket, rest: Buffer, length: number, timeoutMs: number): Promise<Buffer> {
  if (rest.length >= length) return Promise.resolve(rest.subarray(0, length));
  return new Promise((resolve) => {
    const parts = [rest];
    let have = rest.length;
    // An error answer whose body does not arrive still has its status: resolve with what came.
    const done = (): void => {
      clearTimeout(timer);
      socket.removeAllListeners("data");
      resolve(Buffer.concat(parts));
    };
    const timer = setTimeout(done, timeoutMs);
    socket.on("data", (chunk: Buffer) => {
      parts.push(chunk);
      have += chunk.length;
      if (have >= length) done();
    });
    socket.once("end", done);
    socket.once("error", done);
    socket.resume();
  });
}

class SocketPipe implements Pipe {
  readonly #socket: net.Socket;
  readonly #leftover: Buffer;
  #closed = false;

  constructor(socket: net.Socket, leftover: Buffer) {
    this.#socket = socket;
    this.#leftover = leftover;
  }

  write(data: Buffer): Promise<void> {
    return new Promise((resolve, reject) => {
      if (this.#closed || this.#socket.destroyed) {
        reject(new ConnectionError(0, "closed", "the session's connection is closed"));
        return;
      }
      this.#socket.write(data, (err) => (err ? reject(err) : resolve()));
    });
  }

  start(sink: PipeSink): void {
    const s = this.#socket;
    // A half-close of ours would kill the command (docs/api.md), so stdin ends with a frame,
    // never with end(); the daemon's EOF ends the stream.
    s.on("data", (chunk: Buffer) => sink.data(chunk));
    s.once("end", () => sink.end());
    s.on("error", (e) => {
      const why =
        (e as NodeJS.ErrnoException).syscall === "write"
          ? `the daemon closed the session's connection while stdin was being written (${e.message}), before its exit frame was read: ` +
            "the command ended on its own as its input was sent, and the socket went with what was left to read"
          : `the session's connection broke: ${e.message}`;
      sink.error(new ConnectionError(0, "unreachable", why, { cause: e }));
    });
    s.once("close", () => sink.end());
    if (this.#leftover.length > 0) sink.data(this.#leftover);
    s.resume();
  }

  pause(): void {
    this.#socket.pause();
  }

  resume(): void {
    this.#socket.resume();
  }

  close(): void {
    this.#closed = true;
    this.#socket.destroy();
  }
}
