// The exec path's own HTTP/1.1 against a scripted server on a Unix socket: framing split
// anywhere, error envelopes, connection reuse and retirement, and every way an answer can
// break. No daemon needed.

import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { after, before, describe, test } from "node:test";

import { ConnectionError, Crucible, FrameType, Sandbox, SandboxNotFound, TooManyRequests, encodeFrame } from "../src/index.js";
import { parseHead } from "../src/http1.js";
import { within } from "./helpers/daemon.js";

const T = { timeout: 20_000 };
const SB = "sb-0123456789abcdef";
const EXIT = encodeFrame(FrameType.Exit, Buffer.from(JSON.stringify({ exit_code: 3, signal: "", error: "", usage: null })));
const OUT = encodeFrame(FrameType.Stdout, Buffer.from("hello\n"));

/** What the scripted server does with each request it reads: the bytes to send back, in pieces, then maybe close. */
type Script = (n: number) => { pieces: Buffer[]; close?: boolean; silent?: boolean };

let dir: string;
let server: net.Server;
let script: Script;
let connections = 0;
let closed = 0;
let requests = 0;
/** The request line of each request the server read, in order. */
const requestLines: string[] = [];
const sockets = new Set<net.Socket>();
let sock: string;

function chunked(body: Buffer, sizes: number[]): Buffer {
  const parts: Buffer[] = [];
  let at = 0;
  for (const n of sizes) {
    const piece = body.subarray(at, at + n);
    at += n;
    parts.push(Buffer.from(`${piece.length.toString(16)}\r\n`), piece, Buffer.from("\r\n"));
  }
  if (at < body.length) parts.push(Buffer.from(`${(body.length - at).toString(16)}\r\n`), body.subarray(at), Buffer.from("\r\n"));
  parts.push(Buffer.from("0\r\n\r\n"));
  return Buffer.concat(parts);
}

const HEAD = "HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\nx-crucible-exec-id: ex-00000000000000aa\r\ntransfer-encoding: chunked\r\n\r\n";

/** Splits `b` into pieces of `n` bytes. */
function split(b: Buffer, n: number): Buffer[] {
  const out: Buffer[] = [];
  for (let i = 0; i < b.length; i += n) out.push(b.subarray(i, i + n));
  return out;
}

before(async () => {
  dir = mkdtempSync(path.join(os.tmpdir(), "crucible-nodetest-http1-"));
  sock = path.join(dir, "s.sock");
  server = net.createServer((s) => {
    connections++;
    sockets.add(s);
    s.on("close", () => {
      sockets.delete(s);
      closed++;
    });
    let buf = "";
    s.on("data", async (d) => {
      buf += d.toString("latin1");
      for (;;) {
        const end = buf.indexOf("\r\n\r\n");
        if (end < 0) return;
        const m = /content-length: (\d+)/i.exec(buf.slice(0, end));
        const len = m ? Number(m[1]) : 0;
        if (buf.length < end + 4 + len) return;
        requestLines.push(buf.slice(0, buf.indexOf("\r\n")));
        buf = buf.slice(end + 4 + len);
        const { pieces, close, silent } = script(requests++);
        if (silent) return;
        for (const p of pieces) {
          s.write(p);
          // Separate reads on the client: a piece per event-loop turn.
          await new Promise((r) => setTimeout(r, 1));
        }
        if (close) s.end();
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(sock, resolve));
}, { timeout: 90_000 });

after(async () => {
  for (const s of sockets) s.destroy();
  await new Promise<void>((resolve) => server.close(() => resolve()));
  rmSync(dir, { recursive: true, force: true });
}, { timeout: 90_000 });

function client(requestTimeoutMs = 5_000): Crucible {
  return new Crucible({ host: sock, requestTimeoutMs });
}

describe("the exec path's HTTP/1.1", () => {
  test("chunked answers split anywhere decode to the same result", T, async () => {
    const c = client();
    const sandbox = new Sandbox(c, SB);
    const body = Buffer.concat([OUT, EXIT]);
    for (const pieceSize of [1, 3, 7, 64, 100_000]) {
      for (const chunkSizes of [[1], [5, 9], [body.length]]) {
        script = () => ({ pieces: split(Buffer.concat([Buffer.from(HEAD), chunked(body, chunkSizes)]), pieceSize) });
        const r = await within(5_000, sandbox.run(["x"]), `pieces of ${pieceSize}`);
        assert.equal(r.stdoutText, "hello\n");
        assert.equal(r.exitCode, 3);
        assert.equal(r.execId, "ex-00000000000000aa");
      }
    }
    await c.close();
  });

  test("one connection serves request after request; a closing answer is not reused", T, async () => {
    const c = client();
    const sandbox = new Sandbox(c, SB);
    const before = connections;
    script = () => ({ pieces: [Buffer.from(HEAD), chunked(EXIT, [])] });
    for (let i = 0; i < 5; i++) await within(5_000, sandbox.run(["x"]), "a kept-alive run");
    assert.equal(connections - before, 1, "one connection for five requests");
    script = () => ({ pieces: [Buffer.from(HEAD.replace("transfer-encoding: chunked", "connection: close\r\ntransfer-encoding: chunked")), chunked(EXIT, [])] });
    await within(5_000, sandbox.run(["x"]), "a closing run");
    script = () => ({ pieces: [Buffer.from(HEAD), chunked(EXIT, [])] });
    await within(5_000, sandbox.run(["x"]), "the next run");
    assert.equal(connections - before, 2, "a new connection after connection: close");
    await c.close();
  });

  test("an idle connection the server closed is not used again", T, async () => {
    const c = client();
    const sandbox = new Sandbox(c, SB);
    script = () => ({ pieces: [Buffer.from(HEAD), chunked(EXIT, [])] });
    await within(5_000, sandbox.run(["x"]), "the first run");
    const before = connections;
    for (const s of sockets) s.end();
    await new Promise((r) => setTimeout(r, 50));
    await within(5_000, sandbox.run(["x"]), "the run after the close");
    assert.equal(connections - before, 1);
    await c.close();
  });

  test("error answers are the envelope's class, whether by length or chunked", T, async () => {
    const c = client();
    const sandbox = new Sandbox(c, SB);
    const env = JSON.stringify({ code: "not_found", message: `no sandbox with id "${SB}"` });
    script = () => ({ pieces: split(Buffer.from(`HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: ${env.length}\r\n\r\n${env}`), 10) });
    await assert.rejects(sandbox.run(["x"]), (e: unknown) => e instanceof SandboxNotFound && e.status === 404);
    const busy = JSON.stringify({ code: "too_many_requests", message: "exec cap" });
    script = () => ({ pieces: [Buffer.from(`HTTP/1.1 429 Too Many Requests\r\ntransfer-encoding: chunked\r\n\r\n`), chunked(Buffer.from(busy), [4])] });
    await assert.rejects(sandbox.run(["x"]), (e: unknown) => e instanceof TooManyRequests && e.status === 429);
    // And the connection is still good for the next request.
    script = () => ({ pieces: [Buffer.from(HEAD), chunked(EXIT, [])] });
    assert.equal((await within(5_000, sandbox.run(["x"]), "after errors")).exitCode, 3);
    await c.close();
  });

  test("an answer cut short is a ConnectionError, never a result", T, async () => {
    const c = client();
    const sandbox = new Sandbox(c, SB);
    const whole = Buffer.concat([Buffer.from(HEAD), chunked(Buffer.concat([OUT, EXIT]), [3])]);
    for (const cut of [5, HEAD.length, HEAD.length + 4, whole.length - 8]) {
      script = () => ({ pieces: [whole.subarray(0, cut)], close: true });
      await assert.rejects(within(5_000, sandbox.run(["x"], { resumes: 0 }), `cut at ${cut}`), (e: unknown) => e instanceof ConnectionError, `cut at ${cut}`);
    }
    // Cut after the exit frame, in the chunked body's last chunk: nothing was lost.
    script = () => ({ pieces: [whole.subarray(0, whole.length - 3)], close: true });
    assert.equal((await within(5_000, sandbox.run(["x"], { resumes: 0 }), "cut after the exit")).exitCode, 3);
    // A whole HTTP answer whose frame stream lacks its exit frame is the codec's error.
    script = () => ({ pieces: [Buffer.from(HEAD), chunked(OUT, [])] });
    await assert.rejects(sandbox.run(["x"]), (e: unknown) => (e as { kind?: string }).kind === "missing_exit");
    await c.close();
  });

  test("a cut answer is re-attached from the output received, and each try counts", T, async () => {
    const c = client();
    const sandbox = new Sandbox(c, SB);
    const cutAfterOut = Buffer.concat([Buffer.from(HEAD), Buffer.from(`${OUT.length.toString(16)}\r\n`), OUT, Buffer.from("\r\n")]);
    const first = requests;
    script = (n) => (n === first ? { pieces: [cutAfterOut], close: true } : { pieces: [Buffer.from(HEAD), chunked(EXIT, [])] });
    const r = await within(5_000, sandbox.run(["x"]), "the re-attached run");
    assert.equal(r.stdout.toString(), "hello\n");
    assert.equal(r.exitCode, 3);
    assert.equal(requestLines.at(-1), `POST /sandboxes/${SB}/execs/ex-00000000000000aa/attach?offset=6 HTTP/1.1`);
    // A stream does the same.
    const again = requests;
    script = (n) => (n === again ? { pieces: [cutAfterOut], close: true } : { pieces: [Buffer.from(HEAD), chunked(EXIT, [])] });
    const events: string[] = [];
    for await (const ev of sandbox.stream(["x"])) events.push(ev.type === "exit" ? `exit ${ev.result.exitCode}` : ev.data.toString());
    assert.deepEqual(events, ["hello\n", "exit 3"]);
    // Every try cut: the break comes out after the tries allowed, saying how far it got.
    script = () => ({ pieces: [cutAfterOut], close: true });
    const before = requests;
    await assert.rejects(within(5_000, sandbox.run(["x"], { resumes: 2 }), "the exhausted run"), (e: unknown) => e instanceof ConnectionError && /broke after 18 output bytes and 2 re-attaches/.test(e.message));
    assert.equal(requests - before, 3);
    // A command that dies with its connection is never re-attached.
    const lone = requests;
    await assert.rejects(within(5_000, sandbox.run(["x"], { onDisconnect: "kill" }), "the kill run"), ConnectionError);
    assert.equal(requests - lone, 1);
    await c.close();
  });

  test("garbage is a protocol error; a silent server meets the deadline", { timeout: 20_000 }, async () => {
    const c = client(300);
    const sandbox = new Sandbox(c, SB);
    script = () => ({ pieces: [Buffer.from("SSH-2.0-OpenSSH\r\n\r\n")] });
    await assert.rejects(within(5_000, sandbox.run(["x"]), "garbage"), /not an HTTP answer/);
    script = () => ({ pieces: [Buffer.from("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n")] });
    await assert.rejects(within(5_000, sandbox.run(["x"]), "a bad chunk"), /bad chunk size/);
    script = () => ({ pieces: [], silent: true });
    const t0 = Date.now();
    await assert.rejects(within(5_000, sandbox.run(["x"]), "the deadline"), (e: unknown) => e instanceof ConnectionError && e.code === "timeout");
    assert.ok(Date.now() - t0 < 3_000);
    await c.close();
  });

  test("a stream left early closes its connection", T, async () => {
    const c = client();
    const sandbox = new Sandbox(c, SB);
    // An answer still streaming: one chunk, no last chunk.
    script = () => ({ pieces: [Buffer.from(`${HEAD}${OUT.length.toString(16)}\r\n`), OUT, Buffer.from("\r\n")] });
    const closedBefore = closed;
    for await (const ev of sandbox.stream(["x"])) {
      assert.equal(ev.type, "stdout");
      break;
    }
    const deadline = Date.now() + 5_000;
    while (closed === closedBefore && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10));
    assert.equal(closed, closedBefore + 1, "the abandoned connection is closed");
    await c.close();
  });
});

describe("parseHead", () => {
  test("status and headers, case-folded", () => {
    const h = parseHead("HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nX-Crucible-Exec-Id:  ex-1 \r\nodd line");
    assert.equal(h.status, 201);
    assert.equal(h.headers.get("content-type"), "application/json");
    assert.equal(h.headers.get("x-crucible-exec-id"), "ex-1");
    assert.equal(h.headers.size, 2);
    assert.equal(parseHead("HTTP/1.0 404").status, 404);
    assert.throws(() => parseHead("HTTP/2 200"), /not an HTTP answer/);
    assert.throws(() => parseHead("HTTP/1.1 2000 OK"), /not an HTTP answer/);
    assert.throws(() => parseHead("ICY 200 OK"), /not an HTTP answer/);
  });
});
