// A small streaming tar writer (POSIX ustar, with pax records for what ustar cannot hold),
// for uploads. Our own rather than a package: an upload needs only regular files, directories
// and symbolic links, the tar packages on npm bring far more (extraction, gzip, a stream
// framework of their own) for a path that must stay auditable, and writing a header is a
// page of code. The archive's exact size is known up front, so the upload can carry a
// Content-Length instead of a chunked body.

import { open, lstat, readdir, readlink } from "node:fs/promises";
import path from "node:path";

const BLOCK = 512;
const MAX_OCTAL_SIZE = 0o77777777777; // 11 octal digits: 8 GiB - 1
const CHUNK = 64 * 1024;

export type TarEntry =
  | { type: "directory"; path: string; mode: number; mtimeMs: number }
  | { type: "symlink"; path: string; mode: number; mtimeMs: number; target: string }
  | { type: "file"; path: string; mode: number; mtimeMs: number; size: number; source: string | Uint8Array };

/** The entries for the contents of `dir` (not `dir` itself), parents before children, names sorted. */
export async function treeEntries(dir: string): Promise<TarEntry[]> {
  const root = await lstat(dir).catch((e: NodeJS.ErrnoException) => {
    throw new TypeError(`cannot upload ${dir}: ${e.code === "ENOENT" ? "no such directory" : e.message}`);
  });
  if (!root.isDirectory()) throw new TypeError(`cannot upload ${dir}: not a directory`);
  const entries: TarEntry[] = [];
  async function walk(abs: string, rel: string): Promise<void> {
    const names = (await readdir(abs)).sort();
    for (const name of names) {
      const childAbs = path.join(abs, name);
      const childRel = rel === "" ? name : `${rel}/${name}`;
      const st = await lstat(childAbs);
      const mode = st.mode & 0o7777;
      if (st.isDirectory()) {
        entries.push({ type: "directory", path: childRel, mode, mtimeMs: st.mtimeMs });
        await walk(childAbs, childRel);
      } else if (st.isFile()) {
        entries.push({ type: "file", path: childRel, mode, mtimeMs: st.mtimeMs, size: st.size, source: childAbs });
      } else if (st.isSymbolicLink()) {
        entries.push({ type: "symlink", path: childRel, mode, mtimeMs: st.mtimeMs, target: await readlink(childAbs) });
      } else {
        // The agent refuses device nodes and FIFOs; better to say which file than to fail mid-upload.
        throw new TypeError(`cannot upload ${childAbs}: only regular files, directories and symbolic links can be uploaded`);
      }
    }
  }
  await walk(dir, "");
  return entries;
}

/** The archive's size in bytes, as tarStream() will write it. */
export function tarSize(entries: readonly TarEntry[]): number {
  let n = 2 * BLOCK;
  for (const e of entries) {
    const pax = paxRecords(e);
    if (pax.length > 0) n += BLOCK + padded(pax.length);
    n += BLOCK;
    if (e.type === "file") n += padded(e.size);
  }
  return n;
}

/** The archive, block by block; a file that changes size while it is read is an error. */
export async function* tarStream(entries: readonly TarEntry[]): AsyncGenerator<Buffer> {
  for (const e of entries) {
    const pax = paxRecords(e);
    if (pax.length > 0) {
      yield header({ name: paxName(e.path), type: "x", mode: 0o644, size: pax.length, mtimeMs: e.mtimeMs, linkname: "" });
      yield pad(pax);
    }
    const name = e.type === "directory" ? `${e.path}/` : e.path;
    yield header({
      name,
      type: e.type === "file" ? "0" : e.type === "directory" ? "5" : "2",
      mode: e.mode,
      size: e.type === "file" ? e.size : 0,
      mtimeMs: e.mtimeMs,
      linkname: e.type === "symlink" ? e.target : "",
    });
    if (e.type === "file") yield* fileBlocks(e);
  }
  yield Buffer.alloc(2 * BLOCK);
}

async function* fileBlocks(e: Extract<TarEntry, { type: "file" }>): AsyncGenerator<Buffer> {
  if (typeof e.source !== "string") {
    if (e.source.length !== e.size) throw new Error(`${e.path}: ${e.source.length} bytes given for a declared ${e.size}`);
    if (e.size > 0) yield Buffer.from(e.source.buffer, e.source.byteOffset, e.source.length);
    const tail = padded(e.size) - e.size;
    if (tail > 0) yield Buffer.alloc(tail);
    return;
  }
  const fh = await open(e.source, "r");
  try {
    let left = e.size;
    while (left > 0) {
      const buf = Buffer.allocUnsafe(Math.min(CHUNK, left));
      const { bytesRead } = await fh.read(buf, 0, buf.length, null);
      if (bytesRead === 0) throw new Error(`${e.source} shrank while it was being uploaded (${e.size - left} of ${e.size} bytes read)`);
      left -= bytesRead;
      yield bytesRead === buf.length ? buf : buf.subarray(0, bytesRead);
    }
    if ((await fh.stat()).size !== e.size) throw new Error(`${e.source} changed size while it was being uploaded`);
  } finally {
    await fh.close();
  }
  const tail = padded(e.size) - e.size;
  if (tail > 0) yield Buffer.alloc(tail);
}

function padded(n: number): number {
  return Math.ceil(n / BLOCK) * BLOCK;
}

function pad(b: Buffer): Buffer {
  const out = Buffer.alloc(padded(b.length));
  b.copy(out);
  return out;
}

/** Where ustar's name/prefix split can hold `name`: [prefix, name], or null. */
function split(name: string): [string, string] | null {
  const bytes = Buffer.byteLength(name);
  if (bytes <= 100) return ["", name];
  if (bytes > 256) return null;
  // The prefix ends at a slash; try the longest prefix that fits so the name part is short.
  for (let i = name.lastIndexOf("/"); i > 0; i = name.lastIndexOf("/", i - 1)) {
    const prefix = name.slice(0, i);
    const rest = name.slice(i + 1);
    if (Buffer.byteLength(prefix) <= 155 && Buffer.byteLength(rest) <= 100 && rest !== "") return [prefix, rest];
  }
  return null;
}

function paxRecords(e: TarEntry): Buffer {
  const records: string[] = [];
  const name = e.type === "directory" ? `${e.path}/` : e.path;
  if (split(name) === null) records.push(paxRecord("path", name));
  if (e.type === "symlink" && Buffer.byteLength(e.target) > 100) records.push(paxRecord("linkpath", e.target));
  if (e.type === "file" && e.size > MAX_OCTAL_SIZE) records.push(paxRecord("size", String(e.size)));
  return Buffer.from(records.join(""), "utf8");
}

/** `"<len> key=value\n"`, where len counts the whole record, its own digits included. */
function paxRecord(key: string, value: string): string {
  const body = ` ${key}=${value}\n`;
  const bodyLen = Buffer.byteLength(body);
  let len = bodyLen + String(bodyLen).length;
  if (String(len).length + bodyLen !== len) len = bodyLen + String(len).length;
  return `${len}${body}`;
}

function paxName(p: string): string {
  // The pax header's own name only has to fit; readers replace it with the record's path.
  const base = `PaxHeaders/${path.posix.basename(p)}`;
  return Buffer.byteLength(base) <= 100 ? base : "PaxHeaders/entry";
}

interface Header {
  name: string;
  type: "0" | "2" | "5" | "x";
  mode: number;
  size: number;
  mtimeMs: number;
  linkname: string;
}

function header(h: Header): Buffer {
  const b = Buffer.alloc(BLOCK);
  const [prefix, name] = split(h.name) ?? ["", truncate(h.name, 100)];
  b.write(name, 0, 100, "utf8");
  octal(b, 100, 8, h.mode & 0o7777);
  octal(b, 108, 8, 0); // uid: root inside the sandbox, whoever owns the file here
  octal(b, 116, 8, 0); // gid
  octal(b, 124, 12, h.size > MAX_OCTAL_SIZE ? 0 : h.size);
  octal(b, 136, 12, Math.min(Math.max(0, Math.floor(h.mtimeMs / 1000)), MAX_OCTAL_SIZE));
  b.fill(0x20, 148, 156); // the checksum counts its own field as spaces
  b.write(h.type, 156, 1, "latin1");
  b.write(truncate(h.linkname, 100), 157, 100, "utf8");
  b.write("ustar\0", 257, 6, "latin1");
  b.write("00", 263, 2, "latin1");
  b.write("root", 265, 32, "latin1");
  b.write("root", 297, 32, "latin1");
  b.write(prefix, 345, 155, "utf8");
  let sum = 0;
  for (let i = 0; i < BLOCK; i++) sum += b[i]!;
  b.write(`${sum.toString(8).padStart(6, "0")}\0 `, 148, 8, "latin1");
  return b;
}

function octal(b: Buffer, at: number, width: number, value: number): void {
  b.write(`${value.toString(8).padStart(width - 1, "0")}\0`, at, width, "latin1");
}

/** The longest prefix of `s` within `max` UTF-8 bytes (the pax record carries the whole). */
function truncate(s: string, max: number): string {
  if (Buffer.byteLength(s) <= max) return s;
  let out = "";
  for (const ch of s) {
    if (Buffer.byteLength(out + ch) > max) break;
    out += ch;
  }
  return out;
}
