// The exec hot path's own HTTP/1.1: a POST with a JSON body, answered by a chunked frame
// stream, on kept-alive connections of its own. undici carries every other request; for this
// one its per-request cost (the request object, the llhttp parser, the body stream) measured
// about 0.1 ms at p50 on its own, the SDK's whole budget (bench/roundtrip.ts), while the
// answer's shape is fixed and small enough to parse here: a status line, a few headers, chunks.

import type net from "node:net";

import { ConnectionError, CrucibleError, errorFromBody } from "./errors.js";
import type { Subject } from "./errors.js";
import type { PipeSink, Source } from "./pipe.js";
import type { Transport } from "./transport.js";

const MAX_HEAD = 64 * 1024;
// The daemon answers a connection that sends no request for 30 s with a 408 and closes it;
// retire idle connections long before, so a request never meets that.
const IDLE_MS = 4_000;
const MAX_IDLE = 64;

export interface Head {
  status: number;
  headers: Map<string, string>;
}

/**
 * Parses an answer's head (the text before the blank line); a garbled one is a protocol
 * error. By hand rather than split and regex: it runs once per exec.
 */
export function parseHead(text: string): Head {
  const eol = text.indexOf("\r\n");
  const first = eol < 0 ? text : text.slice(0, eol);
  const status = first.startsWith("HTTP/1.") && first.charCodeAt(8) === 32 ? Number(first.slice(9, 12)) : NaN;
  if (!(status >= 100 && status <= 999) || (first.length > 12 && first.charCodeAt(12) !== 32)) {
    throw new CrucibleError(0, "protocol_error", `not an HTTP answer: ${JSON.stringify(first.slice(0, 80))}`);
  }
  const headers = new Map<string, string>();
  let at = eol < 0 ? text.length : eol + 2;
  while (at < text.length) {
    let end = text.indexOf("\r\n", at);
    if (end < 0) end = text.length;
    const colon = text.indexOf(":", at);
    if (colon > at && colon < end) headers.set(text.slice(at, colon).trim().toLowerCase(), text.slice(colon + 1, end).trim());
    at = end + 2;
  }
  return { status, headers };
}

/**
 * A connection and what it is doing. Its listeners are attached once: adding and removing
 * `data` listeners per request toggles the socket's flowing mode, which costs more than the
 * rest of a request's client side together.
 */
class Conn {
  readonly socket: net.Socket;
  current: Exchange | null = null;
  idleSince = 0;
  #pool: StreamConnections;

  constructor(socket: net.Socket, pool: StreamConnections) {
    this.socket = socket;
    this.#pool = pool;
    socket.on("data", (buf: Buffer) => {
      if (this.current !== null) this.current.data(buf);
      // Anything the daemon says to an idle connection (a 408) retires it.
      else this.#drop();
    });
    socket.on("end", () => (this.current !== null ? this.current.eof() : this.#drop()));
    socket.on("close", () => (this.current !== null ? this.current.eof() : this.#drop()));
    socket.on("error", (e) => (this.current !== null ? this.current.broken(e) : this.#drop()));
  }

  #drop(): void {
    this.socket.destroy();
    this.#pool.forget(this);
  }
}

/** Kept-alive connections for frame-stream requests. */
export class StreamConnections {
  readonly #t: Transport;
  readonly #idle: Conn[] = [];
  // Requests waiting for their answer's head, checked against their deadline by the sweep.
  readonly #waiting = new Set<Exchange>();
  #sweep: NodeJS.Timeout | null = null;
  #closed = false;

  // The head's lines that never change, built once.
  readonly #fixed: string;

  constructor(t: Transport) {
    this.#t = t;
    const auth = t.authHeaders()["authorization"];
    this.#fixed = `Host: ${t.authority}\r\n${auth ? `Authorization: ${auth}\r\n` : ""}Content-Type: application/json\r\n`;
  }

  /**
   * Sends `POST path` with `body` and waits for the answer's head: a 2xx resolves with the
   * exchange (its body not yet flowing: start() it), anything else rejects with the
   * envelope's error class.
   */
  async post(path: string, body: string, subject: Subject): Promise<Exchange> {
    if (this.#closed) throw new ConnectionError(0, "closed", "the client is closed");
    let conn = this.#idle.pop();
    const now = Date.now();
    while (conn !== undefined && now - conn.idleSince > IDLE_MS) {
      conn.socket.destroy();
      conn = this.#idle.pop();
    }
    conn ??= new Conn(await this.#t.connect(), this);
    conn.socket.ref();
    const head = `POST ${path} HTTP/1.1\r\n${this.#fixed}Content-Length: ${Buffer.byteLength(body)}\r\n\r\n`;
    const exchange = new Exchange(conn, this, `POST ${path}`, subject, now + this.#t.requestTimeoutMs);
    conn.current = exchange;
    this.#waiting.add(exchange);
    this.#startSweep();
    // One write for head and body: the daemon reads the request whole in one wakeup.
    conn.socket.write(head + body);
    await exchange.head;
    return exchange;
  }

  /** The head came (or the exchange ended): no deadline to watch any more. */
  answered(e: Exchange): void {
    this.#waiting.delete(e);
  }

  /** Takes a connection back once its answer was read whole. */
  release(conn: Conn): void {
    conn.current = null;
    if (this.#closed || conn.socket.destroyed || this.#idle.length >= MAX_IDLE) {
      conn.socket.destroy();
      return;
    }
    conn.idleSince = Date.now();
    // An idle connection must not keep the process alive.
    conn.socket.unref();
    // Backpressure may have paused it at the end of its answer; idle, it must hear a close.
    if (conn.socket.isPaused()) conn.socket.resume();
    this.#idle.push(conn);
  }

  forget(conn: Conn): void {
    const i = this.#idle.indexOf(conn);
    if (i >= 0) this.#idle.splice(i, 1);
  }

  #startSweep(): void {
    if (this.#sweep !== null) return;
    // One timer for every deadline and idle connection, rather than one per request: the
    // precision a 300 s deadline or a 4 s idle limit needs is a second.
    this.#sweep = setInterval(() => {
      const now = Date.now();
      for (const e of this.#waiting) e.checkDeadline(now);
      for (const c of this.#idle.filter((c) => now - c.idleSince > IDLE_MS)) {
        c.socket.destroy();
        this.forget(c);
      }
      if (this.#waiting.size === 0 && this.#idle.length === 0) {
        clearInterval(this.#sweep!);
        this.#sweep = null;
      }
    }, 1_000);
    this.#sweep.unref();
  }

  close(): void {
    this.#closed = true;
    for (const c of this.#idle.splice(0)) c.socket.destroy();
  }
}

const enum Body {
  Chunked,
  Length,
  UntilClose,
}

const enum Chunk {
  Size,
  Data,
  DataEnd,
  Trailer,
}

/**
 * One request's answer. Body bytes go to the sink as views into the socket's reads (no copy);
 * the connection goes back to the pool when the last chunk is read.
 */
export class Exchange implements Source {
  readonly head: Promise<Head>;
  readonly #conn: Conn;
  readonly #socket: net.Socket;
  readonly #pool: StreamConnections;
  readonly #deadline: number;
  readonly #what: string;
  readonly #subject: Subject;
  #resolveHead!: (h: Head) => void;
  #rejectHead!: (e: Error) => void;
  #headBuf: Buffer | null = null;
  #status = 0;
  #headers: Map<string, string> = new Map();
  #mode: Body = Body.Chunked;
  #chunk: Chunk = Chunk.Size;
  #line = "";
  #left = 0;
  // The chunk size line being read.
  #size = 0;
  #digits = 0;
  #lineBytes = 0;
  #inExtension = false;
  #keepAlive = true;
  #inHead = true;
  #done = false;
  #sink: PipeSink | null = null;
  #early: Buffer[] = [];
  #earlyEnd = false;
  // A failure before start(), handed to the sink when it starts.
  #pendingError: Error | null = null;
  // An error answer's body, collected for its envelope.
  #errorBody: Buffer[] | null = null;

  constructor(conn: Conn, pool: StreamConnections, what: string, subject: Subject, deadline: number) {
    this.#conn = conn;
    this.#socket = conn.socket;
    this.#pool = pool;
    this.#deadline = deadline;
    this.#what = what;
    this.#subject = subject;
    this.head = new Promise<Head>((resolve, reject) => {
      this.#resolveHead = resolve;
      this.#rejectHead = reject;
    });
  }

  /** Fails the request if its head is late (called by the pool's sweep). */
  checkDeadline(now: number): void {
    if (this.#inHead && now > this.#deadline) {
      this.#fail(new ConnectionError(0, "timeout", `${this.#what}: the daemon did not answer in time`));
    }
  }

  broken(e: Error): void {
    this.#fail(new ConnectionError(0, "unreachable", `${this.#what}: the connection broke: ${e.message}`, { cause: e }));
  }

  get status(): number {
    return this.#status;
  }

  get headers(): Map<string, string> {
    return this.#headers;
  }

  /** Starts delivering the body to `sink`: first what came with the head. */
  start(sink: PipeSink): void {
    this.#sink = sink;
    for (const b of this.#early.splice(0)) sink.data(b);
    if (this.#pendingError !== null) sink.error(this.#pendingError);
    else if (this.#earlyEnd) sink.end();
  }

  pause(): void {
    this.#socket.pause();
  }

  resume(): void {
    this.#socket.resume();
  }

  /** Abandons the answer: the connection is closed (the command runs on unless started with `onDisconnect: "kill"`). */
  close(): void {
    if (this.#done) return;
    this.#done = true;
    this.#pool.answered(this);
    this.#socket.destroy();
  }

  data(buf: Buffer): void {
    if (this.#done) return;
    let at = 0;
    if (this.#inHead) {
      const b = this.#headBuf === null ? buf : Buffer.concat([this.#headBuf, buf]);
      const end = b.indexOf("\r\n\r\n");
      if (end < 0) {
        if (b.length > MAX_HEAD) this.#fail(new CrucibleError(0, "protocol_error", `${this.#what}: the answer's head exceeds ${MAX_HEAD} bytes`));
        else this.#headBuf = b;
        return;
      }
      this.#headBuf = null;
      let head: Head;
      try {
        head = parseHead(b.toString("latin1", 0, end));
      } catch (e) {
        this.#fail(e as Error);
        return;
      }
      this.#inHead = false;
      this.#status = head.status;
      this.#headers = head.headers;
      const te = head.headers.get("transfer-encoding");
      const cl = head.headers.get("content-length");
      if (te !== undefined) {
        if (!/(^|,)\s*chunked\s*$/i.test(te)) {
          this.#fail(new CrucibleError(0, "protocol_error", `${this.#what}: unsupported transfer-encoding ${te}`));
          return;
        }
        this.#mode = Body.Chunked;
      } else if (cl !== undefined && /^\d+$/.test(cl)) {
        this.#mode = Body.Length;
        this.#left = Number(cl);
      } else {
        this.#mode = Body.UntilClose;
        this.#keepAlive = false;
      }
      if (/\bclose\b/i.test(head.headers.get("connection") ?? "")) this.#keepAlive = false;
      if (head.status < 200 || head.status >= 300) this.#errorBody = [];
      else {
        this.#pool.answered(this);
        this.#resolveHead(head);
      }
      at = end + 4;
      if (this.#mode === Body.Length && this.#left === 0) {
        this.#complete(b, at);
        return;
      }
      if (at < b.length) this.#body(b, at);
      return;
    }
    this.#body(buf, 0);
  }

  #body(buf: Buffer, at: number): void {
    const end = buf.length;
    if (this.#mode !== Body.Chunked) {
      const n = this.#mode === Body.Length ? Math.min(this.#left, end - at) : end - at;
      this.#deliver(at === 0 && n === end ? buf : buf.subarray(at, at + n));
      if (this.#mode === Body.Length) {
        this.#left -= n;
        if (this.#left === 0) this.#complete(buf, at + n);
      }
      return;
    }
    while (at < end && !this.#done) {
      switch (this.#chunk) {
        case Chunk.Size: {
          // Byte by byte: hex digits, then an extension to skip, up to the LF. No strings made.
          while (at < end) {
            const c = buf[at++]!;
            this.#lineBytes++;
            if (c === 10) break;
            if (this.#lineBytes > 1024) {
              this.#fail(new CrucibleError(0, "protocol_error", `${this.#what}: a chunk size line over 1 KiB`));
              return;
            }
            if (this.#inExtension || c === 13) continue;
            const v = c >= 48 && c <= 57 ? c - 48 : c >= 97 && c <= 102 ? c - 87 : c >= 65 && c <= 70 ? c - 55 : -1;
            if (v >= 0 && this.#digits < 12) {
              this.#size = this.#size * 16 + v;
              this.#digits++;
            } else if ((c === 59 || c === 32 || c === 9) && this.#digits > 0) {
              this.#inExtension = true;
            } else {
              this.#fail(new CrucibleError(0, "protocol_error", `${this.#what}: a bad chunk size line (byte ${c})`));
              return;
            }
          }
          if (buf[at - 1] !== 10) return;
          if (this.#digits === 0) {
            this.#fail(new CrucibleError(0, "protocol_error", `${this.#what}: a bad chunk size line (no digits)`));
            return;
          }
          const size = this.#size;
          this.#size = 0;
          this.#digits = 0;
          this.#lineBytes = 0;
          this.#inExtension = false;
          if (size === 0) this.#chunk = Chunk.Trailer;
          else {
            this.#left = size;
            this.#chunk = Chunk.Data;
          }
          break;
        }
        case Chunk.Data: {
          const n = Math.min(this.#left, end - at);
          this.#deliver(buf.subarray(at, at + n));
          at += n;
          this.#left -= n;
          if (this.#left === 0) {
            this.#chunk = Chunk.DataEnd;
            this.#left = 2;
          }
          break;
        }
        case Chunk.DataEnd: {
          // The CRLF after a chunk's data.
          const n = Math.min(this.#left, end - at);
          at += n;
          this.#left -= n;
          if (this.#left === 0) this.#chunk = Chunk.Size;
          break;
        }
        case Chunk.Trailer: {
          const nl = buf.indexOf(10, at);
          if (nl < 0) {
            this.#line += buf.toString("latin1", at, end);
            if (this.#line.length > 8192) this.#fail(new CrucibleError(0, "protocol_error", `${this.#what}: trailers over 8 KiB`));
            return;
          }
          const line = (this.#line + buf.toString("latin1", at, nl)).replace(/\r$/, "");
          this.#line = "";
          at = nl + 1;
          if (line === "") {
            this.#complete(buf, at);
            return;
          }
          break;
        }
      }
    }
  }

  #deliver(piece: Buffer): void {
    if (piece.length === 0) return;
    if (this.#errorBody !== null) this.#errorBody.push(Buffer.from(piece));
    else if (this.#sink !== null) this.#sink.data(piece);
    else this.#early.push(piece);
  }

  #complete(buf: Buffer, at: number): void {
    this.#done = true;
    this.#pool.answered(this);
    // Bytes past the answer mean the connection is in a state we did not ask for.
    if (this.#keepAlive && at === buf.length) this.#pool.release(this.#conn);
    else this.#socket.destroy();
    if (this.#errorBody !== null) {
      this.#rejectHead(errorFromBody(this.#status, Buffer.concat(this.#errorBody).toString("utf8"), this.#subject));
      return;
    }
    if (this.#sink !== null) this.#sink.end();
    else this.#earlyEnd = true;
  }

  eof(): void {
    if (this.#done) return;
    if (!this.#inHead && this.#mode === Body.UntilClose) {
      this.#complete(Buffer.alloc(0), 0);
      return;
    }
    this.#fail(
      new ConnectionError(0, "unreachable", this.#inHead ? `${this.#what}: the daemon closed the connection before answering` : `${this.#what}: the connection closed in the middle of the answer`),
    );
  }

  #fail(e: Error): void {
    if (this.#done) return;
    this.#done = true;
    this.#pool.answered(this);
    this.#socket.destroy();
    if (this.#inHead || this.#errorBody !== null) {
      // An error answer cut short still has its status to report.
      if (this.#errorBody !== null && this.#status >= 400) {
        this.#rejectHead(errorFromBody(this.#status, Buffer.concat(this.#errorBody).toString("utf8"), this.#subject));
      } else this.#rejectHead(e);
      return;
    }
    if (this.#sink !== null) this.#sink.error(e);
    else this.#pendingError = e;
  }
}
