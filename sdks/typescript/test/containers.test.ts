// Containers in a sandbox against a real daemon: a service reached on localhost from the
// sandbox's own root, commands, files, stats and signals addressed to a container, its log,
// and the typed errors of a missing container and of one that never gets ready.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { Conflict, ContainerNotFound, ContainerNotReady, Crucible } from "../src/index.js";
import type { ContainerRequest } from "../src/index.js";
import { startDaemon } from "./helpers/daemon.js";
import type { Daemon } from "./helpers/daemon.js";

const T = { timeout: 60_000 };
let daemon: Daemon;
let client: Crucible;

const service: ContainerRequest = {
  name: "svc",
  command: ["/bin/sh", "-c", "echo svc up; echo svc warn >&2; while true; do echo pong | nc -l -p 7000; done"],
  ready: { tcp_port: 7000 },
  shared: [{ name: "work", path: "/data" }],
};

before(async () => {
  daemon = await startDaemon();
  client = new Crucible({ host: daemon.socket });
}, { timeout: 90_000 });

after(async () => {
  await client?.close();
  await daemon?.stop();
}, { timeout: 90_000 });

describe("containers", () => {
  test("a service, a shared directory and commands in a container", T, async () => {
    await using sb = await client.sandboxes.create({ containers: [service], shared: [{ name: "work", path: "/work" }] });
    assert.deepEqual((await sb.containers()).map((c) => [c.name, c.state]), [["svc", "ready"]]);
    const reply = await sb.run("nc 127.0.0.1 7000 < /dev/null");
    assert.equal(reply.stdoutText, "pong\n");

    const svc = sb.container("svc");
    assert.equal((await svc.info()).state, "ready");
    const ran = await svc.run("echo in-svc > /data/note && hostname");
    assert.equal(ran.stdoutText.trim(), sb.id);
    assert.equal((await sb.files.read("/work/note")).toString(), "in-svc\n");
    await svc.files.write("/tmp/only-here", "svc's own\n");
    assert.equal((await svc.files.read("/tmp/only-here")).toString(), "svc's own\n");
    assert.equal((await sb.run("test -e /tmp/only-here")).exitCode, 1);

    const own = await svc.stats();
    const whole = await sb.stats();
    assert.ok(own.pids.current >= 2, JSON.stringify(own));
    assert.equal(own.memory.limit_bytes, whole.memory.limit_bytes);

    const long = svc.stream("sleep 300", { execId: "long-one" });
    const done = (async () => {
      let signal = "";
      for await (const ev of long) if (ev.type === "exit") signal = ev.result.signal;
      return signal;
    })();
    for (let i = 0; i < 100 && !(await svc.execs()).some((e) => e.exec_id === "long-one"); i++) {
      await new Promise((r) => setTimeout(r, 50));
    }
    assert.equal((await svc.execStatus("long-one")).state, "running");
    await svc.signal("SIGTERM", { execId: "long-one" });
    assert.equal(await done, "SIGTERM");

    const log = await svc.logs();
    assert.deepEqual([log.stdout.toString(), log.stderr.toString(), log.exit], ["svc up\n", "svc warn\n", undefined]);

    await svc.remove();
    assert.deepEqual(await sb.containers(), []);
    await assert.rejects(svc.run("true"), ContainerNotFound);
    assert.equal((await sb.run("echo root runs on")).stdoutText, "root runs on\n");
  });

  test("a missing container and one never ready are typed errors", T, async () => {
    await using sb = await client.sandboxes.create({ containers: [service] });
    await assert.rejects(sb.container("nope").run("true"), ContainerNotFound);
    await assert.rejects(sb.container("nope").info(), ContainerNotFound);
    await assert.rejects(sb.container("nope").logs(), ContainerNotFound);
    assert.throws(() => sb.container(""), TypeError);
    const broken: ContainerRequest = { name: "broken", command: ["/bin/sh", "-c", "echo bye; exit 3"], ready: { tcp_port: 7001 } };
    await assert.rejects(client.sandboxes.create({ containers: [broken] }), (e: unknown) => {
      assert.ok(e instanceof ContainerNotReady, String(e));
      assert.match(e.message, /broken/);
      assert.match(e.message, /bye/);
      return true;
    });
  });

  test("a container added to a running sandbox", T, async () => {
    await using sb = await client.sandboxes.create({ shared: [{ name: "work", path: "/work" }] });
    const svc = await sb.addContainer(service);
    assert.equal((await svc.info()).state, "ready");
    assert.equal((await sb.run("nc 127.0.0.1 7000 < /dev/null")).stdoutText, "pong\n");
    await svc.run("echo added > /data/note");
    assert.equal((await sb.files.read("/work/note")).toString(), "added\n");
    await assert.rejects(sb.addContainer(service), Conflict);
    const late: ContainerRequest = { name: "late", command: ["/bin/sh", "-c", "echo bye; exit 3"], ready: { tcp_port: 7002 } };
    await assert.rejects(sb.addContainer(late), (e: unknown) => {
      assert.ok(e instanceof ContainerNotReady, String(e));
      assert.match(e.message, /bye/);
      return true;
    });
    assert.deepEqual((await sb.containers()).map((c) => [c.name, c.state, c.exit_code]), [["svc", "ready", undefined], ["late", "exited", 3]]);
  });
});
