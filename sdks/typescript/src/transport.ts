// HTTP to one daemon: where it is (a Unix socket or TCP), the key to send, one undici Pool so
// that requests reuse connections, and the few request shapes the API uses. Errors leave here
// already mapped to CrucibleError classes.

import net from "node:net";
import { Pool, errors as undiciErrors } from "undici";
import type { Dispatcher } from "undici";

import { ConnectionError, CrucibleError, errorFromBody } from "./errors.js";
import type { Subject } from "./errors.js";
import { StreamConnections } from "./http1.js";

export const DEFAULT_SOCKET = "/run/crucible/crucible.sock";

export type Endpoint =
  | { kind: "unix"; path: string }
  | { kind: "tcp"; host: string; port: number };

/** `host`: a Unix socket path, `unix:PATH`, or `http://host:port`. */
export function parseHost(host: string): Endpoint {
  if (host === "") throw new TypeError("the daemon address is empty");
  if (host.startsWith("https://")) {
    throw new TypeError(`${host}: the daemon serves plain HTTP; put a TLS-terminating proxy in front and use http://`);
  }
  if (host.startsWith("http://")) {
    let url: URL;
    try {
      url = new URL(host);
    } catch {
      throw new TypeError(`invalid daemon address ${JSON.stringify(host)}: expected http://host:port`);
    }
    if ((url.pathname !== "/" && url.pathname !== "") || url.search || url.hash || url.username) {
      throw new TypeError(`invalid daemon address ${JSON.stringify(host)}: expected http://host:port, nothing after it`);
    }
    const hostname = url.hostname.startsWith("[") ? url.hostname.slice(1, -1) : url.hostname;
    return { kind: "tcp", host: hostname, port: url.port ? Number(url.port) : 80 };
  }
  if (/^[a-z][a-z0-9+.-]*:\/\//i.test(host)) {
    throw new TypeError(`unsupported daemon address ${JSON.stringify(host)}: expected a socket path, unix:PATH or http://host:port`);
  }
  return { kind: "unix", path: host.startsWith("unix:") ? host.slice("unix:".length) : host };
}

export function describeEndpoint(e: Endpoint): string {
  return e.kind === "unix" ? `unix:${e.path}` : `http://${e.host.includes(":") ? `[${e.host}]` : e.host}:${e.port}`;
}

export interface TransportOptions {
  host: string;
  apiKey?: string | undefined;
  /** How long to wait for a connection. */
  connectTimeoutMs: number;
  /** How long a JSON request may wait for its answer (creating a microVM takes seconds). */
  requestTimeoutMs: number;
}

export type Method = "GET" | "POST" | "DELETE";

export class Transport {
  readonly endpoint: Endpoint;
  /** The `Host` header value and the origin's authority. */
  readonly authority: string;
  readonly pool: Pool;
  /** Connections for exec and attach streams (the hot path, off undici: see http1.ts). */
  readonly streams: StreamConnections;
  readonly connectTimeoutMs: number;
  readonly requestTimeoutMs: number;
  readonly #apiKey: string | undefined;
  // Built once: the hot path (an exec) should not rebuild headers per call.
  readonly #jsonHeaders: Record<string, string>;
  readonly #plainHeaders: Record<string, string>;

  constructor(o: TransportOptions) {
    this.endpoint = parseHost(o.host);
    this.#apiKey = o.apiKey || undefined;
    this.connectTimeoutMs = o.connectTimeoutMs;
    this.requestTimeoutMs = o.requestTimeoutMs;
    const e = this.endpoint;
    this.authority = e.kind === "unix" ? "crucible" : describeEndpoint(e).slice("http://".length);
    this.pool = new Pool(`http://${this.authority}`, {
      connect: e.kind === "unix" ? { socketPath: e.path, timeout: o.connectTimeoutMs } : { timeout: o.connectTimeoutMs },
      // The daemon drops a connection that sends no request head for 30 s; let undici retire
      // idle ones well before that so a request never lands on a socket being closed.
      keepAliveTimeout: 4_000,
      keepAliveMaxTimeout: 20_000,
    });
    this.#plainHeaders = this.#apiKey ? { authorization: `Bearer ${this.#apiKey}` } : {};
    this.#jsonHeaders = { ...this.#plainHeaders, "content-type": "application/json" };
    // Last: it reads the headers above.
    this.streams = new StreamConnections(this);
  }

  get apiKey(): string | undefined {
    return this.#apiKey;
  }

  /** Headers for a request made outside undici (hijack, WebSocket). */
  authHeaders(): Record<string, string> {
    return { ...this.#plainHeaders };
  }

  /**
   * A request whose answer is wanted whole: JSON (or nothing, for 204s). Non-2xx answers
   * throw the envelope's error class.
   */
  async json<T>(method: Method, path: string, body?: unknown, subject?: Subject): Promise<T> {
    const res = await this.send(
      method,
      path,
      body === undefined ? undefined : JSON.stringify(body),
      body === undefined ? this.#plainHeaders : this.#jsonHeaders,
      subject,
      this.requestTimeoutMs,
    );
    const text = await readText(res, this);
    if (text === "") return undefined as T;
    try {
      return JSON.parse(text) as T;
    } catch (e) {
      throw new CrucibleError(res.statusCode, "protocol_error", `${method} ${path}: the answer is not JSON: ${(e as Error).message}`);
    }
  }

  /**
   * Any request: `timeoutMs` bounds the wait for the answer's head and between body chunks
   * (0 for exec streams, where a command may print nothing for hours).
   */
  async send(
    method: Method,
    path: string,
    body: Dispatcher.DispatchOptions["body"],
    headers: Record<string, string>,
    subject: Subject | undefined,
    timeoutMs: number,
  ): Promise<Dispatcher.ResponseData> {
    let res: Dispatcher.ResponseData;
    try {
      res = await this.pool.request({
        method,
        path,
        body: body ?? null,
        headers,
        headersTimeout: timeoutMs,
        bodyTimeout: timeoutMs,
      });
    } catch (e) {
      throw this.connectionError(e, `${method} ${path}`);
    }
    if (res.statusCode >= 400) {
      const text = await readText(res, this);
      throw errorFromBody(res.statusCode, text, subject);
    }
    return res;
  }

  /** A fresh connection of its own (the hijacked exec must be its connection's first request). */
  connect(): Promise<net.Socket> {
    const e = this.endpoint;
    return new Promise((resolve, reject) => {
      const socket = e.kind === "unix" ? net.connect({ path: e.path }) : net.connect({ host: e.host, port: e.port });
      const timer = setTimeout(() => {
        socket.destroy();
        reject(new ConnectionError(0, "unreachable", `cannot connect to the crucible daemon at ${describeEndpoint(e)}: no connection within ${this.connectTimeoutMs} ms`));
      }, this.connectTimeoutMs);
      socket.once("connect", () => {
        clearTimeout(timer);
        socket.removeAllListeners("error");
        socket.setNoDelay(true);
        resolve(socket);
      });
      socket.once("error", (err) => {
        clearTimeout(timer);
        reject(this.connectionError(err, "connect"));
      });
    });
  }

  /** undici and socket failures as ConnectionError, keeping our own errors as they are. */
  connectionError(e: unknown, what: string): CrucibleError {
    if (e instanceof CrucibleError) return e;
    const err = e as Error & { code?: string };
    const detail = err?.message || String(e);
    if (e instanceof undiciErrors.HeadersTimeoutError || e instanceof undiciErrors.BodyTimeoutError) {
      return new ConnectionError(0, "timeout", `${what}: the daemon at ${describeEndpoint(this.endpoint)} did not answer in time (${detail})`, { cause: e });
    }
    return new ConnectionError(0, "unreachable", `${what}: cannot reach the crucible daemon at ${describeEndpoint(this.endpoint)}: ${detail}${err?.code && !detail.includes(err.code) ? ` (${err.code})` : ""}`, { cause: e });
  }

  async close(): Promise<void> {
    this.streams.close();
    await this.pool.close();
  }
}

async function readText(res: Dispatcher.ResponseData, t: Transport): Promise<string> {
  try {
    return await res.body.text();
  } catch (e) {
    throw t.connectionError(e, "reading the answer");
  }
}

/** `/sandboxes/{id}…` with the id escaped. */
export function sandboxPath(id: string, tail = ""): string {
  return `/sandboxes/${encodeURIComponent(id)}${tail}`;
}

/** `path` addressed to one of the sandbox's containers (`?container=NAME`); as it is for none. */
export function inContainer(path: string, container: string | undefined): string {
  if (container === undefined) return path;
  return `${path}${path.includes("?") ? "&" : "?"}container=${encodeURIComponent(checkContainerName(container))}`;
}

/** A container's name as the caller gave it, refused at once when it cannot be one. */
export function checkContainerName(name: string): string {
  if (typeof name !== "string" || name === "") throw new TypeError(`a container's name must be a non-empty string, got ${JSON.stringify(name)}`);
  return name;
}
