// Images a sandbox can be made from: the built-in one and the caller's imports (a `docker
// save` archive, an OCI layout or archive, or a rootfs tarball, gzipped or not: the daemon
// tells them apart by content).

import { createReadStream } from "node:fs";
import { stat } from "node:fs/promises";
import { Readable } from "node:stream";

import type { Transport } from "./transport.js";
import type { ImageInfo, ImagesPruned } from "./types.js";

/** An archive: a local file's path, its bytes, or a stream of them. */
export type ImageSource = string | Uint8Array | Readable | AsyncIterable<Uint8Array>;

/** `/images/NAME`, where a name may hold `/` and `:` (`library/rust:1.80`). */
function imagePath(name: string): string {
  if (name === "") throw new TypeError("an image name is required");
  return `/images/${name.split("/").map(encodeURIComponent).join("/")}`;
}

export class Images {
  readonly #t: Transport;

  constructor(t: Transport) {
    this.#t = t;
  }

  /** Imports an archive as `name` (replacing the caller's image of that name), streamed. */
  async import(name: string, source: ImageSource): Promise<ImageInfo> {
    if (name === "") throw new TypeError("an image name is required");
    const headers: Record<string, string> = { ...this.#t.authHeaders(), "content-type": "application/x-tar" };
    let body: Uint8Array | Readable;
    if (typeof source === "string") {
      const st = await stat(source).catch((e: Error) => {
        throw new TypeError(`cannot import ${source}: ${e.message}`);
      });
      if (!st.isFile()) throw new TypeError(`cannot import ${source}: not a file (a directory is imported with \`crucible image import\`)`);
      headers["content-length"] = String(st.size);
      body = createReadStream(source);
    } else {
      if (source instanceof Uint8Array) {
        headers["content-length"] = String(source.length);
        body = source;
      } else {
        body = source instanceof Readable ? source : Readable.from(source);
      }
    }
    const res = await this.#t.send("POST", `/images?name=${encodeURIComponent(name)}`, body, headers, "image", this.#t.requestTimeoutMs);
    return (await res.body.json()) as ImageInfo;
  }

  /** The built-in image, then the caller's. */
  async list(): Promise<ImageInfo[]> {
    return (await this.#t.json<{ images: ImageInfo[] }>("GET", "/images")).images;
  }

  async get(name: string): Promise<ImageInfo> {
    return this.#t.json<ImageInfo>("GET", imagePath(name), undefined, "image");
  }

  /** Removes one image; one in use is a Conflict. */
  async remove(name: string): Promise<void> {
    await this.#t.json<void>("DELETE", imagePath(name), undefined, "image");
  }

  /**
   * Removes the caller's images no sandbox uses, whose name starts with `prefix` (default:
   * any) and that nobody took, released or imported for `unusedForS` seconds (default 0).
   */
  async prune(options: { unusedForS?: number; prefix?: string } = {}): Promise<ImagesPruned> {
    const q = new URLSearchParams();
    if (options.unusedForS !== undefined) q.set("unused_for_s", String(options.unusedForS));
    if (options.prefix !== undefined) q.set("prefix", options.prefix);
    const query = q.toString();
    return this.#t.json<ImagesPruned>("DELETE", query ? `/images?${query}` : "/images");
  }
}
