// The daemon over TCP with API keys: what needs a key, what a key sees, and the exec
// transports (one-shot, hijacked, WebSocket) and files carrying the Bearer header.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { Crucible, Sandbox, SandboxNotFound, Unauthorized } from "../src/index.js";
import { freePort, startDaemon } from "./helpers/daemon.js";
import type { Daemon } from "./helpers/daemon.js";

const T = { timeout: 60_000 };
let daemon: Daemon;
let host: string;

before(async () => {
  const port = await freePort();
  host = `http://127.0.0.1:${port}`;
  daemon = await startDaemon({ args: ["--listen", `127.0.0.1:${port}`], env: { CRUCIBLE_API_KEYS: "ci:ci-secret-key,dev:dev-secret-key" } });
  // The socket appears before TCP may: wait until it answers.
  const probe = new Crucible({ host });
  const deadline = Date.now() + 10_000;
  for (;;) {
    try {
      await probe.health();
      break;
    } catch (e) {
      if (Date.now() > deadline) throw e;
      await new Promise((r) => setTimeout(r, 50));
    }
  }
  await probe.close();
}, { timeout: 90_000 });

after(async () => {
  await daemon?.stop();
}, { timeout: 90_000 });

test("without a key, or with a wrong one, requests are Unauthorized; health needs none", T, async () => {
  const anonymous = new Crucible({ host, apiKey: "" });
  assert.equal((await anonymous.health()).status, "ok");
  await assert.rejects(anonymous.sandboxes.list(), (e: unknown) => e instanceof Unauthorized && e.status === 401 && e.code === "unauthorized");
  const wrong = new Crucible({ host, apiKey: "not-a-key" });
  await assert.rejects(wrong.sandboxes.create(), Unauthorized);
  await assert.rejects(new Sandbox(wrong, "sb-0123456789abcdef").run(["true"]), Unauthorized);
  await assert.rejects(new Sandbox(wrong, "sb-0123456789abcdef").interactive(["cat"]), Unauthorized);
  // Over the socket a wrong key is refused too, never taken as the socket's user.
  const socketWrong = new Crucible({ host: daemon.socket, apiKey: "not-a-key" });
  await assert.rejects(socketWrong.sandboxes.list(), Unauthorized);
  await Promise.all([anonymous.close(), wrong.close(), socketWrong.close()]);
});

test("with a key: run, stream, both interactive transports and files; another key sees nothing", T, async () => {
  const ci = new Crucible({ host, apiKey: "ci-secret-key" });
  const dev = new Crucible({ host, apiKey: "dev-secret-key" });
  assert.equal(ci.host, host);
  {
    await using sb = await ci.sandboxes.create({ labels: { suite: "node-tcp" } });
    assert.equal((await sb.info()).owner, "ci");
    const r = await sb.run(["sh", "-c", "echo over tcp; exit 4"]);
    assert.equal(r.stdoutText, "over tcp\n");
    assert.equal(r.exitCode, 4);
    let streamed = "";
    for await (const ev of sb.stream(["echo", "streamed"])) if (ev.type === "stdout") streamed += ev.data.toString();
    assert.equal(streamed, "streamed\n");
    for (const transport of ["hijack", "websocket"] as const) {
      const s = await sb.interactive(["cat"], { transport });
      await s.send(`via ${transport}\n`);
      await s.closeStdin();
      assert.equal((await s.wait()).stdoutText, `via ${transport}\n`);
    }
    await sb.files.write("/tmp/tcp.txt", "file over tcp");
    assert.equal(await sb.files.readText("/tmp/tcp.txt"), "file over tcp");

    // Another key: the sandbox does not exist for it, on every route.
    const theirs = new Sandbox(dev, sb.id);
    await assert.rejects(theirs.info(), SandboxNotFound);
    await assert.rejects(theirs.run(["true"]), SandboxNotFound);
    await assert.rejects(theirs.interactive(["cat"], { transport: "websocket" }), SandboxNotFound);
    await assert.rejects(theirs.files.read("/tmp/tcp.txt"), SandboxNotFound);
    assert.equal((await dev.sandboxes.list()).some((s) => s.id === sb.id), false);
    // The socket without a key sees every sandbox.
    const root = new Crucible({ host: daemon.socket });
    assert.ok((await root.sandboxes.list()).some((s) => s.id === sb.id && s.owner === "ci"));
    await root.close();
  }
  assert.equal((await ci.sandboxes.list()).length, 0, "await using deleted it");
  await Promise.all([ci.close(), dev.close()]);
});
