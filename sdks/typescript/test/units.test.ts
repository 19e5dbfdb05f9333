// The pieces that need no daemon: the tar writer (checked by GNU tar, another
// implementation), error mapping, address parsing, results.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, readlinkSync, rmSync, statSync, symlinkSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, describe, test } from "node:test";

import "./helpers/env.js";

import {
  AgentError,
  CacheBusy,
  CommandResult,
  Conflict,
  CrucibleError,
  EgressNotAllowed,
  ExecNotFound,
  FileNotFound,
  ImageNotFound,
  InvalidRequest,
  NotFound,
  SandboxNotFound,
  errorFromBody,
  parseHost,
} from "../src/index.js";
import { FrameType, encodeFrame } from "../src/codec.js";
import { modeFromHeader, mtimeFromHeader } from "../src/files.js";
import { InteractiveSession } from "../src/interactive.js";
import type { Pipe, PipeSink } from "../src/pipe.js";
import { tarSize, tarStream, treeEntries } from "../src/tar.js";
import { execRequest } from "../src/types.js";
import { FIXTURES_DIR } from "./helpers/paths.js";

const scratch = mkdtempSync(path.join(os.tmpdir(), "crucible-nodetest-units-"));
after(() => rmSync(scratch, { recursive: true, force: true }));

async function archive(dir: string): Promise<{ bytes: Buffer; declared: number }> {
  const entries = await treeEntries(dir);
  const parts: Buffer[] = [];
  for await (const b of tarStream(entries)) parts.push(b);
  return { bytes: Buffer.concat(parts), declared: tarSize(entries) };
}

describe("the tar writer", () => {
  test("GNU tar reads back the tree: names long and short, modes, links, empty files", { timeout: 30_000 }, async () => {
    const src = path.join(scratch, "src");
    const split = `${"d".repeat(90)}/${"e".repeat(90)}/file-${"f".repeat(60)}`;
    const pax = `${"p".repeat(120)}/${"q".repeat(120)}/${"r".repeat(120)}.txt`;
    const files: Record<string, Buffer> = {
      "a.txt": Buffer.from("a\n"),
      "empty": Buffer.alloc(0),
      "exactly-512": Buffer.alloc(512, 1),
      "sub/dir/b.bin": Buffer.from(Array.from({ length: 70_000 }, (_, i) => i % 256)),
      [split]: Buffer.from("split\n"),
      [pax]: Buffer.from("pax\n"),
      "ünï.txt": Buffer.from("utf-8\n"),
    };
    for (const [rel, data] of Object.entries(files)) {
      mkdirSync(path.dirname(path.join(src, rel)), { recursive: true });
      writeFileSync(path.join(src, rel), data);
    }
    writeFileSync(path.join(src, "x.sh"), "#!/bin/sh\n", { mode: 0o750 });
    mkdirSync(path.join(src, "nothing-here"));
    symlinkSync("sub/dir/b.bin", path.join(src, "short-link"));
    symlinkSync(`${"t".repeat(150)}/target`, path.join(src, "long-link"));

    const { bytes, declared } = await archive(src);
    assert.equal(bytes.length, declared, "tarSize() is what tarStream() writes");
    assert.equal(bytes.length % 512, 0);
    const tarFile = path.join(scratch, "out.tar");
    writeFileSync(tarFile, bytes);
    const out = path.join(scratch, "out");
    mkdirSync(out);
    // --warning=all: GNU tar complains about a bad checksum or header instead of guessing.
    execFileSync("tar", ["--warning=all", "-xf", tarFile, "-C", out], { stdio: ["ignore", "pipe", "pipe"], timeout: 20_000 });
    for (const [rel, data] of Object.entries(files)) assert.deepEqual(readFileSync(path.join(out, rel)), data, rel);
    assert.equal(statSync(path.join(out, "x.sh")).mode & 0o777, 0o750);
    assert.ok(statSync(path.join(out, "nothing-here")).isDirectory());
    assert.equal(readlinkSync(path.join(out, "short-link")), "sub/dir/b.bin");
    assert.equal(readlinkSync(path.join(out, "long-link")), `${"t".repeat(150)}/target`);
    const listing = execFileSync("tar", ["-tvf", tarFile], { encoding: "utf8", timeout: 20_000 });
    assert.match(listing, /root\/root/, "entries are owned by root");
  });

  test("a file that changes size under the writer is an error, not a corrupt archive", { timeout: 30_000 }, async () => {
    const dir = path.join(scratch, "shrink");
    mkdirSync(dir);
    writeFileSync(path.join(dir, "f"), Buffer.alloc(100_000));
    const entries = await treeEntries(dir);
    writeFileSync(path.join(dir, "f"), Buffer.alloc(10));
    await assert.rejects(async () => {
      for await (const _ of tarStream(entries)) void _;
    }, /shrank/);
  });
});

describe("errors", () => {
  const env = (code: string, message = "m"): string => JSON.stringify({ code, message });

  test("each code has its class, with status, code and message", () => {
    const e = errorFromBody(403, env("egress_not_allowed", "not within"));
    assert.ok(e instanceof EgressNotAllowed && e instanceof CrucibleError);
    assert.equal(e.status, 403);
    assert.equal(e.code, "egress_not_allowed");
    assert.equal(e.message, "not within");
    assert.equal(e.name, "EgressNotAllowed");
    assert.ok(errorFromBody(400, env("invalid_request")) instanceof InvalidRequest);
    assert.ok(errorFromBody(409, env("conflict")) instanceof Conflict);
    assert.ok(errorFromBody(409, env("cache_busy")) instanceof CacheBusy);
    assert.ok(errorFromBody(409, env("cache_busy")) instanceof Conflict);
    assert.ok(errorFromBody(502, env("agent_error")) instanceof AgentError);
    assert.ok(errorFromBody(404, env("exec_not_found")) instanceof ExecNotFound);
  });

  test("not_found is refined by what was asked for", () => {
    assert.ok(errorFromBody(404, env("not_found")) instanceof NotFound);
    assert.ok(errorFromBody(404, env("not_found"), "sandbox") instanceof SandboxNotFound);
    assert.ok(errorFromBody(404, env("not_found"), "image") instanceof ImageNotFound);
    assert.ok(errorFromBody(404, env("not_found", "no such file"), "file") instanceof FileNotFound);
    assert.ok(errorFromBody(404, env("not_found", 'no sandbox with id "sb-1"'), "file") instanceof SandboxNotFound);
    assert.ok(errorFromBody(404, env("not_found", "no running command"), "exec") instanceof ExecNotFound);
  });

  test("an unknown code or a body that is no envelope keeps the status", () => {
    const unknown = errorFromBody(418, env("teapot"));
    assert.equal(unknown.constructor, CrucibleError);
    assert.equal(unknown.code, "teapot");
    const html = errorFromBody(502, "<html>bad gateway</html>");
    assert.equal(html.status, 502);
    assert.equal(html.code, "unknown");
    assert.match(html.message, /bad gateway/);
    assert.equal(errorFromBody(500, "").message, "HTTP 500");
  });
});

describe("addresses", () => {
  test("socket paths, unix: and http://", () => {
    assert.deepEqual(parseHost("/run/crucible/crucible.sock"), { kind: "unix", path: "/run/crucible/crucible.sock" });
    assert.deepEqual(parseHost("unix:/tmp/s.sock"), { kind: "unix", path: "/tmp/s.sock" });
    assert.deepEqual(parseHost("http://127.0.0.1:7070"), { kind: "tcp", host: "127.0.0.1", port: 7070 });
    assert.deepEqual(parseHost("http://[::1]:7070/"), { kind: "tcp", host: "::1", port: 7070 });
    assert.deepEqual(parseHost("http://crucible.internal"), { kind: "tcp", host: "crucible.internal", port: 80 });
    assert.throws(() => parseHost(""), TypeError);
    assert.throws(() => parseHost("https://h:1"), /plain HTTP/);
    assert.throws(() => parseHost("http://h:1/x"), /nothing after it/);
  });
});

describe("a download's headers", () => {
  test("X-Crucible-Mode gives the 0777 bits only; Last-Modified an HTTP date; anything else nothing", () => {
    assert.equal(modeFromHeader("0755"), 0o755);
    assert.equal(modeFromHeader("0644"), 0o644);
    assert.equal(modeFromHeader("4755"), 0o755);
    assert.equal(modeFromHeader("7777"), 0o777);
    assert.equal(modeFromHeader("0400"), 0o400);
    for (const bad of [undefined, "", " ", "rwxr-xr-x", "0x1ed", "-755", "0758", "12345670"]) assert.equal(modeFromHeader(bad), undefined, String(bad));
    assert.equal(mtimeFromHeader("Tue, 14 Nov 2023 22:13:20 GMT"), 1_700_000_000_000);
    for (const bad of [undefined, "", "not a date"]) assert.equal(mtimeFromHeader(bad), undefined, String(bad));
  });
});

describe("results", () => {
  test("ok, lost and describe() follow the exit document", () => {
    const r = (doc: object): CommandResult => new CommandResult({ exit_code: 0, ...doc }, "ex-1", Buffer.from("out"), Buffer.alloc(0));
    assert.equal(r({}).ok, true);
    assert.equal(r({}).describe(), "exit 0");
    assert.equal(r({}).stdoutText, "out");
    assert.equal(r({}).usage, null, "a missing usage is null, not zeroes");
    assert.equal(r({ exit_code: 2 }).describe(), "exit 2");
    const lost = r({ exit_code: -1, error: "the sandbox died" });
    assert.equal(lost.lost, true);
    assert.equal(lost.ok, false);
    assert.match(lost.describe(), /lost: the sandbox died/);
    const killed = r({ exit_code: -1, signal: "SIGKILL", oom_killed: true });
    assert.equal(killed.lost, false);
    assert.match(killed.describe(), /SIGKILL \(out of memory\)/);
    assert.match(r({ exit_code: -1, signal: "SIGKILL", timed_out: true }).describe(), /timed out/);
  });
});

describe("the create request", () => {
  test("camelCase options become the wire's fields, and only those given", async () => {
    const { createRequest } = await import("../src/types.js");
    assert.deepEqual(createRequest({}), {});
    assert.deepEqual(createRequest({ backend: "microvm", containerSlots: 2, diskMib: 128 }), {
      backend: "microvm",
      container_slots: 2,
      disk_mib: 128,
    });
  });
});

/** A session's pipe that keeps what is written, and lets a test play the daemon's side. */
class RecordingPipe implements Pipe {
  readonly written: Buffer[] = [];
  sink: PipeSink | null = null;

  write(data: Buffer): Promise<void> {
    this.written.push(Buffer.from(data));
    return Promise.resolve();
  }
  start(sink: PipeSink): void {
    this.sink = sink;
  }
  pause(): void {}
  resume(): void {}
  close(): void {}
}

describe("terminals", () => {
  test("tty and ttySize become the request's tty and tty_size, checked before sending", () => {
    assert.deepEqual(execRequest(["sh"], {}), { cmd: ["sh"] });
    assert.deepEqual(execRequest(["sh"], { tty: false }), { cmd: ["sh"] });
    assert.deepEqual(execRequest(["sh"], { tty: true }), { cmd: ["sh"], tty: true });
    assert.deepEqual(execRequest(["sh"], { tty: true, ttySize: { rows: 30, cols: 100 } }), { cmd: ["sh"], tty: true, tty_size: { rows: 30, cols: 100 } });
    assert.deepEqual(execRequest(["sh"], { tty: true, ttySize: { rows: 0, cols: 65535 } }).tty_size, { rows: 0, cols: 65535 });
    assert.throws(() => execRequest(["sh"], { ttySize: { rows: 30, cols: 100 } }), (e: unknown) => e instanceof TypeError && /ttySize/.test(e.message));
    assert.throws(() => execRequest(["sh"], { tty: true, ttySize: { rows: -1, cols: 100 } }), (e: unknown) => e instanceof TypeError && /ttySize\.rows/.test(e.message));
    assert.throws(() => execRequest(["sh"], { tty: true, ttySize: { rows: 30, cols: 65536 } }), (e: unknown) => e instanceof TypeError && /ttySize\.cols/.test(e.message));
    assert.throws(() => execRequest(["sh"], { tty: true, ttySize: { rows: 2.5, cols: 100 } }), (e: unknown) => e instanceof TypeError && /ttySize\.rows/.test(e.message));
    assert.throws(() => execRequest(["sh"], { tty: "yes" as unknown as boolean }), (e: unknown) => e instanceof TypeError && /tty/.test(e.message));
  });

  test("resize() sends the resize frames tty_session.bin holds, byte for byte", async () => {
    const pipe = new RecordingPipe();
    const s = new InteractiveSession(pipe, "ex-1", ["sh"], "hijack", true);
    assert.equal(s.tty, true);
    await s.resize(40, 120);
    await s.send("stty size\r");
    await s.resize(50, 132);
    await s.send(Buffer.from("exit\r"));
    await s.closeStdin();
    assert.deepEqual(Buffer.concat(pipe.written), readFileSync(path.join(FIXTURES_DIR, "tty_session.bin")));
    s.close();
  });

  test("resize() checks its arguments and the session's terminal, and sends nothing when it throws", async () => {
    const pipe = new RecordingPipe();
    const s = new InteractiveSession(pipe, "ex-1", ["sh"], "websocket", true);
    const cases: Array<[unknown, unknown, string]> = [
      [-1, 80, "rows"], [65536, 80, "rows"], [1.5, 80, "rows"], [Number.NaN, 80, "rows"], ["24", 80, "rows"],
      [24, -1, "cols"], [24, 1e9, "cols"], [24, undefined, "cols"], [24, null, "cols"],
    ];
    for (const [rows, cols, named] of cases) {
      await assert.rejects(s.resize(rows as number, cols as number), (e: unknown) => e instanceof TypeError && e.message.startsWith(`${named} must be an integer from 0 to 65535`), `${String(rows)}x${String(cols)}`);
    }
    await s.resize(0, 65535);
    assert.deepEqual(pipe.written, [encodeFrame(FrameType.Resize, Buffer.from('{"rows":0,"cols":65535}'))]);
    const plain = new InteractiveSession(pipe, "ex-2", ["cat"], "hijack");
    assert.equal(plain.tty, false);
    await assert.rejects(plain.resize(24, 80), (e: unknown) => e instanceof TypeError && /needs a terminal/.test(e.message) && /tty: true/.test(e.message));
    assert.equal(pipe.written.length, 1, "nothing sent for a session without a terminal");
    s.close();
    plain.close();
  });

  test("resize() after the command ended does nothing", async () => {
    const pipe = new RecordingPipe();
    const s = new InteractiveSession(pipe, "ex-1", ["sh"], "hijack", true);
    const exit = Buffer.from(JSON.stringify({ exit_code: 0, duration_ms: 1, signal: "", timed_out: false, oom_killed: false, error: "", usage: null }));
    pipe.sink!.data(encodeFrame(FrameType.Exit, exit));
    pipe.sink!.end();
    assert.equal((await s.wait()).exitCode, 0);
    await s.resize(30, 90);
    assert.deepEqual(pipe.written, []);
  });

  test("a resize frame from the daemon is a protocol error, not an event", async () => {
    const pipe = new RecordingPipe();
    const s = new InteractiveSession(pipe, "ex-1", ["sh"], "hijack", true);
    pipe.sink!.data(encodeFrame(FrameType.Resize, Buffer.from('{"rows":1,"cols":1}')));
    await assert.rejects(s.wait(), (e: unknown) => e instanceof CrucibleError && e.code === "protocol_error" && /type 6/.test(e.message));
  });
});
