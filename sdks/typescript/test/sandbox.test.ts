// Sandboxes and one-shot commands against a real daemon: create, run, stream, errors, the
// commands that outlive their connection, signals, stats, disposal.

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import net from "node:net";
import { after, before, describe, test } from "node:test";

import {
  CommandError,
  ConnectionError,
  Crucible,
  EgressNotAllowed,
  ExecNotFound,
  InvalidRequest,
  Sandbox,
  SandboxNotFound,
} from "../src/index.js";
import { startDaemon, within } from "./helpers/daemon.js";
import type { Daemon } from "./helpers/daemon.js";

const T = { timeout: 60_000 };
let daemon: Daemon;
let client: Crucible;
let sb: Sandbox;

before(async () => {
  daemon = await startDaemon();
  client = new Crucible({ host: daemon.socket });
  sb = await client.sandboxes.create({ labels: { suite: "node-sandbox" }, env: { FROM_SANDBOX: "yes" } });
}, { timeout: 90_000 });

after(async () => {
  await sb?.[Symbol.asyncDispose]();
  await client?.close();
  await daemon?.stop();
}, { timeout: 90_000 });

describe("the daemon", () => {
  test("health answers", T, async () => {
    const h = await client.health();
    assert.equal(h.status, "ok");
    assert.equal(typeof h.sandboxes, "number");
  });

  test("host forms are parsed, a bad one is refused clearly", T, () => {
    assert.equal(new Crucible({ host: `unix:${daemon.socket}` }).host, `unix:${daemon.socket}`);
    assert.equal(new Crucible({ host: "http://127.0.0.1:7070" }).host, "http://127.0.0.1:7070");
    assert.throws(() => new Crucible({ host: "https://example.com" }), /plain HTTP/);
    assert.throws(() => new Crucible({ host: "http://h:1/path" }), /nothing after it/);
    assert.throws(() => new Crucible({ host: "ftp://h" }), /unsupported daemon address/);
  });

  test("an unreachable daemon is a ConnectionError", T, async () => {
    const nowhere = new Crucible({ host: `${daemon.dir}/no-such.sock` });
    await assert.rejects(nowhere.health(), (e: unknown) => e instanceof ConnectionError && e.status === 0 && /no-such\.sock/.test(e.message));
    await nowhere.close();
  });
});

describe("create and info", () => {
  test("the sandbox's info is what was asked", T, async () => {
    const info = await sb.info();
    assert.equal(info.id, sb.id);
    assert.match(sb.id, /^sb-[0-9a-f]{16}$/);
    assert.equal(info.state, "running");
    assert.deepEqual(info.labels, { suite: "node-sandbox" });
    assert.equal(info.owner, "unix");
    assert.ok((await client.sandboxes.list()).some((s) => s.id === sb.id));
    assert.equal((await client.sandboxes.get(sb.id)).id, sb.id);
    const again = await Sandbox.connect(sb.id, { client });
    assert.equal(again.id, sb.id);
  });

  test("Sandbox.create without a client takes CRUCIBLE_HOST", T, async () => {
    const saved = process.env["CRUCIBLE_HOST"];
    process.env["CRUCIBLE_HOST"] = daemon.socket;
    try {
      await using fromEnv = await Sandbox.create({ labels: { from: "env" } });
      assert.equal((await fromEnv.info()).labels["from"], "env");
      assert.equal((await fromEnv.run(["echo", "ok"])).stdoutText, "ok\n");
    } finally {
      if (saved === undefined) delete process.env["CRUCIBLE_HOST"];
      else process.env["CRUCIBLE_HOST"] = saved;
    }
  });

  test("memory, vcpus, ttl and user reach the sandbox", T, async () => {
    await using other = await Sandbox.create({ client, memoryMib: 256, vcpus: 2, ttlS: 120, user: "1234:1234" });
    const info = await other.info();
    assert.equal(info.memory_mib, 256);
    assert.equal(info.vcpus, 2);
    assert.ok(info.expires_at_ms - info.created_at_ms <= 121_000, `expires ${info.expires_at_ms - info.created_at_ms} ms after creation`);
    const id = await other.run(["id", "-u"]);
    assert.equal(id.stdoutText, "1234\n");
  });
});

describe("run", () => {
  test("collects stdout, stderr and the result", T, async () => {
    const r = await sb.run(["sh", "-c", "echo hi; echo err >&2; exit 3"], { env: { A: "1" } });
    assert.equal(r.stdoutText, "hi\n");
    assert.equal(r.stderrText, "err\n");
    assert.deepEqual(r.stdout, Buffer.from("hi\n"));
    assert.equal(r.exitCode, 3);
    assert.equal(r.signal, "");
    assert.equal(r.timedOut, false);
    assert.equal(r.oomKilled, false);
    assert.equal(r.error, "");
    assert.equal(r.ok, false);
    assert.ok(r.usage !== null, "usage is collected");
    assert.equal(typeof r.usage.cpu_user_ms, "number");
    assert.ok(r.durationMs >= 0);
    assert.match(r.execId, /^ex-[0-9a-f]{16}$/);
  });

  test("a string is run by /bin/sh, with env, cwd and the sandbox's env", T, async () => {
    const r = await sb.run('echo "$A $FROM_SANDBOX $(pwd)"', { env: { A: "from-run" }, cwd: "/tmp" });
    assert.equal(r.stdoutText, "from-run yes /tmp\n");
    assert.ok(r.ok);
  });

  test("binary output survives byte for byte", T, async () => {
    const r = await sb.run(["sh", "-c", "printf '\\000\\377\\200abc\\n'"]);
    assert.deepEqual(r.stdout, Buffer.from([0, 0xff, 0x80, 0x61, 0x62, 0x63, 0x0a]));
  });

  test("callbacks see output as it comes", T, async () => {
    const out: string[] = [];
    const err: string[] = [];
    const r = await sb.run(["sh", "-c", "echo one; echo two >&2; echo three"], {
      onStdout: (d) => out.push(d.toString()),
      onStderr: (d) => err.push(d.toString()),
      collect: false,
    });
    assert.equal(out.join(""), "one\nthree\n");
    assert.equal(err.join(""), "two\n");
    assert.equal(r.stdout.length, 0, "collect: false keeps nothing");
  });

  test("a deadline kills the command and says so", T, async () => {
    const r = await sb.run(["sleep", "30"], { timeoutS: 1 });
    assert.equal(r.timedOut, true);
    assert.equal(r.exitCode, -1);
    assert.equal(r.signal, "SIGKILL");
    assert.match(r.describe(), /timed out/);
  });

  test("throwOnError turns a failure into a CommandError carrying the result", T, async () => {
    await assert.rejects(sb.run(["sh", "-c", "exit 7"], { throwOnError: true }), (e: unknown) => {
      assert.ok(e instanceof CommandError);
      assert.equal(e.result.exitCode, 7);
      assert.match(e.message, /exit 7/);
      return true;
    });
    const ok = await sb.run(["true"], { throwOnError: true });
    assert.equal(ok.exitCode, 0);
  });

  test("a command that cannot start is a result with an error", T, async () => {
    const r = await sb.run(["/no/such/binary"]);
    assert.equal(r.exitCode, -1);
    assert.notEqual(r.error, "");
    assert.equal(r.lost, true);
  });

  test("user, groupAdd, rlimits and execId reach the command", T, async () => {
    const r = await sb.run(["sh", "-c", "id -u; id -G; ulimit -n"], {
      user: "4321:4321",
      groupAdd: ["99"],
      rlimits: [{ type: "RLIMIT_NOFILE", soft: 77, hard: 77 }],
      execId: "node-named",
    });
    assert.equal(r.stdoutText, "4321\n4321 99\n77\n", r.describe());
    assert.equal(r.execId, "node-named");
  });
});

describe("stream", () => {
  test("events arrive in order, the exit last", T, async () => {
    const events: string[] = [];
    const s = sb.stream(["sh", "-c", "echo a; sleep 0.05; echo b >&2; exit 4"]);
    for await (const ev of s) events.push(ev.type === "exit" ? `exit:${ev.result.exitCode}` : `${ev.type}:${ev.data.toString()}`);
    assert.deepEqual(events, ["stdout:a\n", "stderr:b\n", "exit:4"]);
    assert.equal(s.result?.exitCode, 4);
    assert.match(s.execId, /^ex-/);
  });

  test("64 MiB of stdout arrives whole (SHA-256)", { timeout: 120_000 }, async () => {
    // A pattern, not zeroes: a dropped or repeated chunk changes the hash.
    const size = 64 * 1024 * 1024;
    const line = Buffer.from("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ!?\n");
    const want = createHash("sha256");
    const block = Buffer.alloc(line.length * 1024);
    for (let i = 0; i < 1024; i++) line.copy(block, i * line.length);
    for (let left = size; left > 0; left -= block.length) want.update(block.subarray(0, Math.min(block.length, left)));
    const got = createHash("sha256");
    let bytes = 0;
    let exit = -2;
    const script = `yes '${line.toString().trimEnd()}' | head -c ${size}`;
    for await (const ev of sb.stream(["sh", "-c", script])) {
      if (ev.type === "stdout") {
        got.update(ev.data);
        bytes += ev.data.length;
      } else if (ev.type === "exit") exit = ev.result.exitCode;
    }
    assert.equal(bytes, size);
    assert.equal(exit, 0);
    assert.equal(got.digest("hex"), want.digest("hex"));
  });

  test("run collects a large output too", { timeout: 120_000 }, async () => {
    const r = await sb.run(["head", "-c", String(8 << 20), "/dev/zero"]);
    assert.equal(r.stdout.length, 8 << 20);
    assert.ok(r.stdout.every((b) => b === 0));
  });

  test("throwOnError on a stream throws after the output", T, async () => {
    const seen: string[] = [];
    await assert.rejects(async () => {
      for await (const ev of sb.stream(["sh", "-c", "echo x; exit 2"], { throwOnError: true })) {
        if (ev.type === "stdout") seen.push(ev.data.toString());
      }
    }, CommandError);
    assert.deepEqual(seen, ["x\n"]);
  });
});

describe("errors are mapped to their classes", () => {
  test("an unknown sandbox is SandboxNotFound, everywhere", T, async () => {
    const ghost = "sb-0123456789abcdef";
    const isNotFound = (e: unknown): boolean => e instanceof SandboxNotFound && e.status === 404 && e.code === "not_found";
    await assert.rejects(Sandbox.connect(ghost, { client }), isNotFound);
    await assert.rejects(client.sandboxes.get(ghost), isNotFound);
    const g = new Sandbox(client, ghost);
    await assert.rejects(g.run(["true"]), isNotFound);
    await assert.rejects(g.info(), isNotFound);
    await assert.rejects(g.kill(), isNotFound);
    await assert.rejects(g.files.read("/etc/hostname"), isNotFound);
    await assert.rejects(g.files.write("/tmp/x", "x"), isNotFound);
    await assert.rejects(g.interactive(["cat"]), isNotFound);
    await assert.rejects(g.interactive(["cat"], { transport: "websocket" }), isNotFound);
    await assert.rejects(g.execs(), isNotFound);
    await assert.rejects(g.stats(), isNotFound);
  });

  test("a network rule outside the operator's is EgressNotAllowed", T, async () => {
    await assert.rejects(client.sandboxes.create({ network: { allow: ["example.com"] } }), (e: unknown) => {
      assert.ok(e instanceof EgressNotAllowed, String(e));
      assert.equal(e.status, 403);
      assert.equal(e.code, "egress_not_allowed");
      assert.match(e.message, /example\.com/);
      return true;
    });
  });

  test("a bad request is InvalidRequest naming the field", T, async () => {
    await assert.rejects(client.sandboxes.create({ memoryMib: 1 }), (e: unknown) => e instanceof InvalidRequest && e.status === 400 && /memory_mib/.test(e.message));
    await assert.rejects(sb.run(["true"], { cwd: "relative" }), (e: unknown) => e instanceof InvalidRequest && /cwd/.test(e.message));
    await assert.rejects(sb.run([""]), (e: unknown) => e instanceof InvalidRequest);
    await assert.rejects(Sandbox.connect("not-an-id", { client }), (e: unknown) => e instanceof InvalidRequest && e.status === 400);
    assert.throws(() => sb.stream([]), TypeError);
  });
});

describe("commands that outlive their connection", () => {
  test("a stream left early runs on; execs lists it, attach collects the rest", T, async () => {
    const script = "echo first; while [ ! -e /tmp/go ]; do sleep 0.02; done; echo second; exit 6";
    const s = sb.stream(["sh", "-c", script], { execId: "node-keep" });
    for await (const ev of s) {
      assert.deepEqual(ev, { type: "stdout", data: Buffer.from("first\n") });
      break;
    }
    const deadline = Date.now() + 10_000;
    let status = await sb.execStatus("node-keep");
    while (status.attached && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 20));
      status = await sb.execStatus("node-keep");
    }
    assert.equal(status.state, "running");
    assert.equal(status.attached, false);
    assert.equal(status.keep, true);
    assert.ok((await sb.execs()).some((e) => e.exec_id === "node-keep"));
    await sb.run(["touch", "/tmp/go"]);
    let out = "";
    const a = sb.attach("node-keep", { offset: "first\n".length });
    for await (const ev of a) if (ev.type === "stdout") out += ev.data.toString();
    assert.equal(out, "second\n");
    assert.equal(a.result?.exitCode, 6);
    assert.equal(a.result?.outputDroppedBytes, 0);
    assert.equal(a.result?.execId, "node-keep");
    await assert.rejects(async () => {
      for await (const _ of sb.attach("node-keep")) void _;
    }, (e: unknown) => e instanceof ExecNotFound && e.code === "exec_not_found");
    await assert.rejects(sb.execStatus("node-never"), ExecNotFound);
  });

  test("run and stream re-attach when their connection breaks mid-stream", T, async () => {
    const script = "for i in $(seq 1 300); do echo line$i; sleep 0.002; done; exit 3";
    const want = Array.from({ length: 300 }, (_, i) => `line${i + 1}\n`).join("");
    for (const how of ["run", "stream"] as const) {
      const proxy = await cuttingProxy(daemon.socket, `${daemon.dir}/cut-${how}.sock`, 600);
      const through = new Crucible({ host: proxy.path });
      try {
        // Not Sandbox.connect: its GET would be the connection the proxy cuts.
        const s = new Sandbox(through, sb.id);
        if (how === "run") {
          const r = await s.run(script);
          assert.equal(r.stdout.toString(), want);
          assert.equal(r.exitCode, 3);
        } else {
          const stream = s.stream(script);
          let out = "";
          for await (const ev of stream) if (ev.type === "stdout") out += ev.data.toString();
          assert.equal(out, want);
          assert.equal(stream.result?.exitCode, 3);
        }
        assert.ok(proxy.cut(), `${how}: the stream was never cut`);
        assert.ok(proxy.connections() >= 2, `${how}: no re-attach (${proxy.connections()} connections)`);
      } finally {
        await through.close();
        proxy.close();
      }
    }
    // Without resumes the break is the caller's to see.
    const proxy = await cuttingProxy(daemon.socket, `${daemon.dir}/cut-none.sock`, 600);
    const through = new Crucible({ host: proxy.path });
    try {
      const s = new Sandbox(through, sb.id);
      await assert.rejects(s.run(script, { resumes: 0 }), (e: unknown) => e instanceof ConnectionError && /middle of the answer/.test(e.message));
    } finally {
      await through.close();
      proxy.close();
    }
  });

  test("signal by exec id reaches that command only; stats answer", T, async () => {
    const s = await sb.interactive(["sh", "-c", "echo up; exec sleep 1000"], { execId: "node-sig" });
    const it = s[Symbol.asyncIterator]();
    const first = await within(10_000, it.next(), "the first output");
    assert.deepEqual(first.value, { type: "stdout", data: Buffer.from("up\n") });
    await sb.signal("SIGTERM", { execId: "node-sig" });
    let last = await within(10_000, it.next(), "the exit");
    while (!last.done && last.value.type !== "exit") last = await within(10_000, it.next(), "the exit");
    assert.ok(!last.done && last.value.type === "exit");
    assert.equal(last.value.result.signal, "SIGTERM");
    await assert.rejects(sb.signal(15, { execId: "node-sig" }), (e: unknown) => e instanceof ExecNotFound && e.status === 404);
    await assert.rejects(sb.signal(0), TypeError);
    const stats = await sb.stats();
    assert.ok(stats.pids.current >= 1);
    assert.ok(stats.memory.limit_bytes > 0);
  });
});

describe("disposal", () => {
  test("await using deletes the sandbox at the end of its scope", T, async () => {
    let id = "";
    {
      await using scoped = await Sandbox.create({ client });
      id = scoped.id;
      assert.equal((await scoped.run(["true"])).exitCode, 0);
    }
    await assert.rejects(client.sandboxes.get(id), SandboxNotFound);
    // Disposing what is gone already is no error; kill() is.
    const gone = new Sandbox(client, id);
    await gone[Symbol.asyncDispose]();
    await assert.rejects(gone.kill(), SandboxNotFound);
  });

  test("a client disposes its pool", T, async () => {
    let c: Crucible;
    {
      await using scoped = new Crucible({ host: daemon.socket });
      c = scoped;
      await scoped.health();
    }
    await assert.rejects(c.health(), ConnectionError);
  });
});

/**
 * A Unix-socket proxy to the daemon that cuts its first connection once `cut` bytes of the
 * daemon's answer went through: a network blip in the middle of a stream.
 */
async function cuttingProxy(upstream: string, path: string, cut: number): Promise<{ path: string; connections: () => number; cut: () => boolean; close: () => void }> {
  let n = 0;
  let wasCut = false;
  const sockets = new Set<net.Socket>();
  const server = net.createServer((client) => {
    const first = n++ === 0;
    const server = net.connect({ path: upstream });
    sockets.add(client).add(server);
    client.pipe(server);
    let passed = 0;
    server.on("data", (chunk: Buffer) => {
      if (!first) {
        client.write(chunk);
        return;
      }
      const room = cut - passed;
      if (room > 0) client.write(chunk.subarray(0, room));
      passed += chunk.length;
      if (passed >= cut) {
        wasCut = true;
        client.destroy();
        server.destroy();
      }
    });
    const end = (): void => {
      client.destroy();
      server.destroy();
    };
    server.on("end", end).on("error", end);
    client.on("end", end).on("error", end);
  });
  await new Promise<void>((resolve, reject) => server.listen(path, resolve).once("error", reject));
  return {
    path,
    connections: () => n,
    cut: () => wasCut,
    close: () => {
      server.close();
      for (const s of sockets) s.destroy();
    },
  };
}
