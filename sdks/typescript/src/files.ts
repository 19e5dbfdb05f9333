// A sandbox's files: uploads are tar archives extracted beneath a directory
// (`POST …/files?path=DIR`), downloads are one file each (`GET …/files?path=FILE`).

import { createWriteStream } from "node:fs";
import { chmod, rename, rm, utimes } from "node:fs/promises";
import type { IncomingHttpHeaders } from "node:http";
import path from "node:path";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";

import { ConnectionError, SandboxNotFound } from "./errors.js";
import { tarSize, tarStream, treeEntries } from "./tar.js";
import type { TarEntry } from "./tar.js";
import { inContainer, sandboxPath } from "./transport.js";
import type { Transport } from "./transport.js";
import type { FilesPutResult } from "./types.js";

const SMALL_UPLOAD = 1 << 20;

/** A tar archive: bytes, or a stream of them. */
export type TarSource = Uint8Array | Readable | AsyncIterable<Uint8Array>;

/** One header's value (undici gives them lower-cased; a repeated one, the first). */
function header(headers: IncomingHttpHeaders, name: string): string | undefined {
  const v = headers[name];
  return Array.isArray(v) ? v[0] : v;
}

/**
 * A downloaded file's permission bits from `X-Crucible-Mode` (octal, `0755`): only the
 * `0o777` bits, never setuid, setgid or sticky, which a sandbox must not plant on the host of
 * whoever downloads its files. `undefined` when the header is absent or not octal.
 */
export function modeFromHeader(value: string | undefined): number | undefined {
  const v = value?.trim();
  if (!v || !/^[0-7]{1,7}$/.test(v)) return undefined;
  return Number.parseInt(v, 8) & 0o777;
}

/** A downloaded file's modification time from `Last-Modified` (an HTTP date), in ms; `undefined` when absent or no date. */
export function mtimeFromHeader(value: string | undefined): number | undefined {
  const v = value?.trim();
  if (!v) return undefined;
  const ms = Date.parse(v);
  return Number.isFinite(ms) && ms >= 0 ? ms : undefined;
}

function absolute(p: string, what: string): string {
  if (typeof p !== "string" || !p.startsWith("/")) throw new TypeError(`${what} must be an absolute guest path, got ${JSON.stringify(p)}`);
  return p;
}

/** Files of a sandbox's own root, or of one of its containers. */
export class Files {
  readonly #t: Transport;
  readonly #id: string;
  readonly #container: string | undefined;

  constructor(t: Transport, sandboxId: string, container?: string) {
    this.#t = t;
    this.#id = sandboxId;
    this.#container = container;
  }

  #url(p: string): string {
    return inContainer(`${sandboxPath(this.#id, "/files")}?path=${encodeURIComponent(p)}`, this.#container);
  }

  /** Writes one file (its directory is created if missing). `mode` defaults to 0644. */
  async write(guestPath: string, data: string | Uint8Array, options: { mode?: number } = {}): Promise<FilesPutResult> {
    absolute(guestPath, "the file's path");
    const dir = path.posix.dirname(guestPath);
    const name = path.posix.basename(guestPath);
    if (name === "" || guestPath.endsWith("/")) throw new TypeError(`${JSON.stringify(guestPath)} names a directory, not a file`);
    const bytes = typeof data === "string" ? Buffer.from(data, "utf8") : data;
    const entry: TarEntry = { type: "file", path: name, mode: options.mode ?? 0o644, mtimeMs: Date.now(), size: bytes.length, source: bytes };
    return this.#upload(dir, [entry]);
  }

  /** Reads one file whole. */
  async read(guestPath: string): Promise<Buffer> {
    absolute(guestPath, "the file's path");
    const res = await this.#t.send("GET", this.#url(guestPath), undefined, this.#t.authHeaders(), "file", this.#t.requestTimeoutMs);
    try {
      return Buffer.from(await res.body.arrayBuffer());
    } catch (e) {
      throw this.#t.connectionError(e, `reading ${guestPath}`);
    }
  }

  /** Reads one file as UTF-8. */
  async readText(guestPath: string): Promise<string> {
    return (await this.read(guestPath)).toString("utf8");
  }

  /**
   * Uploads the contents of `localDir` beneath `guestDir` (created if missing), as
   * `tar -C localDir -c .` would: regular files, directories and symbolic links, owned by the
   * sandbox's root.
   */
  async uploadDir(localDir: string, guestDir: string): Promise<FilesPutResult> {
    absolute(guestDir, "the destination");
    return this.#upload(guestDir, await treeEntries(localDir));
  }

  /** Uploads a tar archive of your own, extracted beneath `guestDir`. */
  async uploadTar(archive: TarSource, guestDir: string): Promise<FilesPutResult> {
    absolute(guestDir, "the destination");
    if (archive instanceof Uint8Array) return this.#post(guestDir, Buffer.from(archive.buffer, archive.byteOffset, archive.length), archive.length);
    return this.#post(guestDir, archive instanceof Readable ? archive : Readable.from(archive), undefined);
  }

  /**
   * Downloads one file to `localPath`, streamed; the file appears there only once it is
   * complete, with the permission bits and modification time it has in the sandbox
   * (`X-Crucible-Mode`, `Last-Modified`), as `cp -p` and `crucible cp` keep them, but never
   * setuid, setgid or sticky. Without a header (or with one that does not parse), the file is
   * 0644 (less the umask), or timed when written. Returns its size.
   */
  async download(guestPath: string, localPath: string): Promise<number> {
    absolute(guestPath, "the file's path");
    const res = await this.#t.send("GET", this.#url(guestPath), undefined, this.#t.authHeaders(), "file", this.#t.requestTimeoutMs);
    const partial = `${localPath}.part-${process.pid}-${Date.now()}`;
    let bytes = 0;
    res.body.on("data", (c: Buffer) => (bytes += c.length));
    try {
      await pipeline(res.body, createWriteStream(partial, { mode: 0o644 }));
      // On the partial file, so that the file appears with its time and mode or not at all.
      const mtimeMs = mtimeFromHeader(header(res.headers, "last-modified"));
      if (mtimeMs !== undefined) await utimes(partial, mtimeMs / 1000, mtimeMs / 1000);
      const mode = modeFromHeader(header(res.headers, "x-crucible-mode"));
      if (mode !== undefined) await chmod(partial, mode);
      await rename(partial, localPath);
    } catch (e) {
      res.body.destroy();
      await rm(partial, { force: true });
      // A local file that cannot be written is this machine's error, not the daemon's.
      const local = e as NodeJS.ErrnoException;
      if (local?.syscall !== undefined && local.path !== undefined) {
        local.message = `downloading ${guestPath} to ${localPath}: ${local.message}`;
        throw local;
      }
      throw this.#t.connectionError(e, `downloading ${guestPath} to ${localPath}`);
    }
    return bytes;
  }

  async #upload(guestDir: string, entries: TarEntry[]): Promise<FilesPutResult> {
    const size = tarSize(entries);
    if (size <= SMALL_UPLOAD) {
      // Small archives go as one buffer: one write, and no stream machinery per file.
      const parts: Buffer[] = [];
      for await (const block of tarStream(entries)) parts.push(block);
      return this.#post(guestDir, Buffer.concat(parts, size), size);
    }
    return this.#post(guestDir, Readable.from(tarStream(entries), { objectMode: false }), size);
  }

  async #post(guestDir: string, body: Buffer | Readable, length: number | undefined): Promise<FilesPutResult> {
    const headers: Record<string, string> = { ...this.#t.authHeaders(), "content-type": "application/x-tar" };
    if (length !== undefined) headers["content-length"] = String(length);
    let res;
    try {
      res = await this.#t.send("POST", this.#url(guestDir), body, headers, "sandbox", this.#t.requestTimeoutMs);
    } catch (e) {
      throw await this.#explain(e);
    }
    return (await res.body.json()) as FilesPutResult;
  }

  /**
   * The daemon refuses an upload to a sandbox it does not know before reading the body, and
   * closes without draining it: a client still sending sees a broken pipe, not the 404. Ask
   * about the sandbox then, so the caller gets SandboxNotFound rather than EPIPE.
   */
  async #explain(e: unknown): Promise<unknown> {
    if (!(e instanceof ConnectionError)) return e;
    try {
      await this.#t.json("GET", sandboxPath(this.#id), undefined, "sandbox");
    } catch (probe) {
      if (probe instanceof SandboxNotFound) return probe;
    }
    return e;
  }
}
