// The entry point: one daemon, one connection pool, and the API's collections hanging off it.

import { Caches } from "./caches.js";
import { Images } from "./images.js";
import { Sandbox, connectSandbox, createSandbox } from "./sandbox.js";
import { DEFAULT_SOCKET, Transport, describeEndpoint, sandboxPath } from "./transport.js";
import type { Health, SandboxCreateOptions, SandboxInfo } from "./types.js";

export interface CrucibleOptions {
  /** A Unix socket path, `unix:PATH` or `http://host:port`; default `$CRUCIBLE_HOST`, else /run/crucible/crucible.sock. */
  host?: string;
  /** Sent as `Authorization: Bearer …`; default `$CRUCIBLE_API_KEY`. Required over TCP. */
  apiKey?: string;
  /** How long to wait for a connection (default 10 s). */
  connectTimeoutMs?: number;
  /** How long a request other than an exec stream waits for its answer (default 300 s). */
  requestTimeoutMs?: number;
}

export class Sandboxes {
  readonly #client: Crucible;

  constructor(client: Crucible) {
    this.#client = client;
  }

  create(options: SandboxCreateOptions = {}): Promise<Sandbox> {
    return createSandbox(this.#client, options);
  }

  connect(id: string): Promise<Sandbox> {
    return connectSandbox(this.#client, id);
  }

  /** The caller's sandboxes, oldest first. */
  async list(): Promise<SandboxInfo[]> {
    return (await this.#client.transport.json<{ sandboxes: SandboxInfo[] }>("GET", "/sandboxes")).sandboxes;
  }

  get(id: string): Promise<SandboxInfo> {
    return this.#client.transport.json<SandboxInfo>("GET", sandboxPath(id), undefined, "sandbox");
  }

  async delete(id: string): Promise<void> {
    await this.#client.transport.json<void>("DELETE", sandboxPath(id), undefined, "sandbox");
  }
}

export class Crucible implements AsyncDisposable {
  readonly transport: Transport;
  readonly sandboxes: Sandboxes;
  readonly images: Images;
  readonly caches: Caches;

  constructor(options: CrucibleOptions = {}) {
    this.transport = new Transport({
      host: options.host ?? (process.env["CRUCIBLE_HOST"] || DEFAULT_SOCKET),
      apiKey: options.apiKey ?? process.env["CRUCIBLE_API_KEY"],
      connectTimeoutMs: options.connectTimeoutMs ?? 10_000,
      requestTimeoutMs: options.requestTimeoutMs ?? 300_000,
    });
    this.sandboxes = new Sandboxes(this);
    this.images = new Images(this.transport);
    this.caches = new Caches(this.transport);
  }

  /** Where the daemon is, as `unix:PATH` or `http://host:port`. */
  get host(): string {
    return describeEndpoint(this.transport.endpoint);
  }

  /** `GET /healthz` (needs no key). */
  health(): Promise<Health> {
    return this.transport.json<Health>("GET", "/healthz");
  }

  /** The daemon's OpenAPI document, as it serves it. */
  openapi(): Promise<Record<string, unknown>> {
    return this.transport.json<Record<string, unknown>>("GET", "/openapi.json");
  }

  /** Closes the connection pool once requests under way are done. */
  close(): Promise<void> {
    return this.transport.close();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}
