// Named caches: persistent, size-limited directories a sandbox mounts by name
// (`caches: [{ name, path }]` at create). Sandboxes at once each mount a copy as last
// saved; the first to end saves its copy back whole.

import type { Transport } from "./transport.js";
import type { CacheInfo } from "./types.js";

export class Caches {
  readonly #t: Transport;

  constructor(t: Transport) {
    this.#t = t;
  }

  /** The caller's caches (every cache over the Unix socket without a key). */
  async list(): Promise<CacheInfo[]> {
    return (await this.#t.json<{ caches: CacheInfo[] }>("GET", "/caches")).caches;
  }

  /** Deletes the caller's cache of that name on every backend; one in use is a Conflict. */
  async remove(name: string): Promise<void> {
    if (name === "") throw new TypeError("a cache name is required");
    await this.#t.json<void>("DELETE", `/caches/${encodeURIComponent(name)}`, undefined, "cache");
  }

  /** Deletes every cache of the caller's that no sandbox uses; returns those kept (in use). */
  async clear(): Promise<CacheInfo[]> {
    return (await this.#t.json<{ caches: CacheInfo[] }>("DELETE", "/caches")).caches;
  }
}
