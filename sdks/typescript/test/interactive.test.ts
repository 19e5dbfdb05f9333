// Interactive sessions over both transports against a real daemon: the same assertions for
// the hijacked connection and the WebSocket.

import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import { after, before, describe, test } from "node:test";

import { ConnectionError, Crucible, InvalidRequest, Sandbox } from "../src/index.js";
import type { ExecEvent, InteractiveSession } from "../src/index.js";
import { startDaemon, within } from "./helpers/daemon.js";
import type { Daemon } from "./helpers/daemon.js";

const T = { timeout: 60_000 };
let daemon: Daemon;
let client: Crucible;
let sb: Sandbox;

before(async () => {
  daemon = await startDaemon();
  client = new Crucible({ host: daemon.socket });
  sb = await client.sandboxes.create({ labels: { suite: "node-interactive" } });
}, { timeout: 90_000 });

after(async () => {
  await sb?.[Symbol.asyncDispose]();
  await client?.close();
  await daemon?.stop();
}, { timeout: 90_000 });

/** The next event, with a deadline. */
async function next(it: AsyncIterator<ExecEvent>, what: string): Promise<ExecEvent> {
  const r = await within(15_000, it.next(), what);
  assert.ok(!r.done, `${what}: the session ended`);
  return r.value;
}

/** Output events until `needle` has appeared in them; all of it. */
async function readUntil(it: AsyncIterator<ExecEvent>, needle: string, what: string): Promise<string> {
  let got = "";
  while (!got.includes(needle)) {
    const ev = await next(it, `${what} (so far ${JSON.stringify(got)})`);
    assert.equal(ev.type, "stdout", `${what}: a terminal has no stderr (so far ${JSON.stringify(got)})`);
    if (ev.type === "stdout") got += ev.data.toString("utf8");
  }
  return got;
}

test("a one-shot command on a terminal: /dev/pts, its size, stderr merged into stdout", T, async () => {
  const r = await sb.run("tty; stty size; echo oops >&2", { tty: true, ttySize: { rows: 30, cols: 100 } });
  assert.equal(r.exitCode, 0, r.describe());
  const lines = r.stdoutText.split("\r\n");
  assert.match(lines[0] ?? "", /^\/dev\/pts\/\d+$/, r.stdoutText);
  assert.deepEqual(lines.slice(1), ["30 100", "oops", ""], r.stdoutText);
  assert.equal(r.stderr.length, 0, "a terminal merges stderr into stdout");
  let out = "";
  for await (const ev of sb.stream(["stty", "size"], { tty: true })) {
    assert.notEqual(ev.type, "stderr");
    if (ev.type === "stdout") out += ev.data.toString("utf8");
  }
  assert.equal(out, "24 80\r\n", "the default size");
  assert.equal((await sb.run("tty")).stdoutText.trim(), "not a tty");
  assert.throws(() => sb.run("true", { ttySize: { rows: 30, cols: 100 } }), (e: unknown) => e instanceof TypeError && /ttySize/.test(e.message));
});

for (const transport of ["hijack", "websocket"] as const) {
  describe(`interactive over ${transport}`, () => {
    test("a terminal: stty size follows resize(), exit ends the shell", T, async () => {
      const s = await sb.interactive(["sh"], { transport, tty: true });
      assert.equal(s.tty, true);
      const it = s[Symbol.asyncIterator]();
      await s.send("stty size\r");
      const before = await readUntil(it, "24 80\r\n", "the first size");
      assert.match(before, /stty size/, "the terminal echoes what is typed");
      await s.resize(50, 132);
      await s.send("stty size\r");
      await readUntil(it, "50 132\r\n", "the size after resize()");
      await s.send("exit\r");
      let exit: ExecEvent | undefined;
      for (;;) {
        const r = await within(15_000, it.next(), "the exit");
        if (r.done) break;
        assert.notEqual(r.value.type, "stderr");
        if (r.value.type === "exit") exit = r.value;
      }
      assert.equal(exit?.type === "exit" && exit.result.exitCode, 0);
      await s.resize(10, 10); // the command has ended: nothing to resize, no error
    });

    test("a terminal sized at the start; resize() refused without one", T, async () => {
      const s = await sb.interactive(["sh", "-c", "stty size; read line; stty size"], { transport, tty: true, ttySize: { rows: 40, cols: 120 } });
      const it = s[Symbol.asyncIterator]();
      await readUntil(it, "40 120\r\n", "the size asked for");
      await s.resize(41, 121);
      await s.send("\r");
      await readUntil(it, "41 121\r\n", "the size after resize()");
      assert.equal((await within(15_000, s.wait(), "the result")).exitCode, 0);
      const plain = await sb.interactive(["cat"], { transport });
      await assert.rejects(plain.resize(24, 80), (e: unknown) => e instanceof TypeError && /needs a terminal/.test(e.message));
      await plain.send("still here\n");
      await plain.closeStdin();
      assert.equal((await within(15_000, plain.wait(), "cat")).stdoutText, "still here\n");
    });

    test("echo: what is sent comes back, line by line, then the exit", T, async () => {
      const s: InteractiveSession = await sb.interactive(["cat"], { transport });
      assert.equal(s.transport, transport);
      const it = s[Symbol.asyncIterator]();
      await s.send("hello\n");
      assert.deepEqual(await next(it, "the first echo"), { type: "stdout", data: Buffer.from("hello\n") });
      await s.send(Buffer.from("second line\n"));
      assert.deepEqual(await next(it, "the second echo"), { type: "stdout", data: Buffer.from("second line\n") });
      await s.closeStdin();
      const exit = await next(it, "the exit");
      assert.equal(exit.type, "exit");
      assert.equal(exit.type === "exit" && exit.result.exitCode, 0);
      assert.ok((await within(5_000, it.next(), "the end")).done);
      const r = await s.wait();
      assert.equal(r.exitCode, 0);
      assert.equal(r.stdout.length, 0, "the iteration consumed the output");
    });

    test("wait() collects stdout and stderr of a shell fed on stdin", T, async () => {
      const s = await sb.interactive(["sh"], { transport, env: { WHO: transport } });
      await s.send("cd /tmp\necho $PWD $WHO\necho oops >&2\nexit 5\n");
      await s.closeStdin();
      const r = await within(15_000, s.wait(), "the result");
      assert.equal(r.stdoutText, `/tmp ${transport}\n`);
      assert.equal(r.stderrText, "oops\n");
      assert.equal(r.exitCode, 5);
      assert.notEqual(r.execId, "");
      await assert.rejects(s.send("late"), TypeError);
    });

    test("4 MiB in and out through cat, unchanged (SHA-256)", { timeout: 120_000 }, async () => {
      const data = randomBytes(4 << 20);
      const s = await sb.interactive(["cat"], { transport });
      // Read while writing: cat's output would otherwise fill the pipes and stall the input.
      const done = s.wait();
      for (let i = 0; i < data.length; i += 300_000) await s.send(data.subarray(i, i + 300_000));
      await s.closeStdin();
      const r = await within(60_000, done, "cat's result");
      assert.equal(r.exitCode, 0);
      assert.equal(r.stdout.length, data.length);
      assert.equal(createHash("sha256").update(r.stdout).digest("hex"), createHash("sha256").update(data).digest("hex"));
    });

    test("closeStdin() and send() after the command ended on its own", T, async () => {
      for (let i = 0; i < 5; i++) {
        const s = await sb.interactive(["sh", "-c", `exit ${i}`], { transport });
        // Long enough for the exit frame and the daemon's close to arrive first. (Sooner is a
        // race the daemon's close decides: see the README, "Interactive sessions".)
        await new Promise((r) => setTimeout(r, 100));
        await s.closeStdin();
        const r = await within(15_000, s.wait(), `round ${i}`);
        assert.equal(r.exitCode, i, r.describe());
        await assert.rejects(s.send("too late"), TypeError, "stdin closed by closeStdin()");
      }
      const done = await sb.interactive(["true"], { transport });
      await within(15_000, done.wait(), "true");
      await assert.rejects(done.send("too late"), (e: unknown) => e instanceof ConnectionError && /has ended/.test(e.message));
    });

    test("close() ends the session and kills the command", T, async () => {
      const s = await sb.interactive(["sh", "-c", "echo ready; exec sleep 1000"], { transport, execId: `node-close-${transport}` });
      const it = s[Symbol.asyncIterator]();
      assert.deepEqual(await next(it, "ready"), { type: "stdout", data: Buffer.from("ready\n") });
      s.close();
      await assert.rejects(within(5_000, it.next(), "after close"), /closed/);
      // The daemon kills an interactive command whose connection drops.
      const deadline = Date.now() + 10_000;
      let running = true;
      while (running && Date.now() < deadline) {
        running = (await sb.execs()).some((e) => e.exec_id === `node-close-${transport}` && e.state === "running");
        if (running) await new Promise((r) => setTimeout(r, 50));
      }
      assert.equal(running, false, "the command still runs after its session closed");
    });

    test("a request that fails validation is InvalidRequest", T, async () => {
      const attempt = async (): Promise<void> => {
        const s = await sb.interactive(["cat"], { transport, cwd: "relative/dir" });
        await s.wait();
      };
      await assert.rejects(within(15_000, attempt(), "the refusal"), (e: unknown) => e instanceof InvalidRequest && /cwd/.test(e.message));
    });
  });
}

test("await using closes a session", T, async () => {
  let s: InteractiveSession;
  {
    await using scoped = await sb.interactive(["sleep", "1000"], { transport: "websocket" });
    s = scoped;
  }
  await assert.rejects(s.wait(), /closed/);
});
