// Egress, caches and images against a real daemon: a sandbox with a cache and a network
// reaching a local HTTP server through its proxy, the cache outliving it, images imported
// from bytes, a path and a stream.

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { createReadStream, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import { gzipSync } from "node:zlib";

import { CacheNotFound, Conflict, Crucible, ImageNotFound, InvalidImage, InvalidRequest, Sandbox } from "../src/index.js";
import { tarStream, treeEntries } from "../src/tar.js";
import { BLOB, startDaemon } from "./helpers/daemon.js";
import type { Daemon } from "./helpers/daemon.js";

const T = { timeout: 90_000 };
let daemon: Daemon;
let client: Crucible;
let local: string;

before(async () => {
  local = mkdtempSync(path.join(os.tmpdir(), "crucible-nodetest-storage-"));
  mkdirSync(path.join(local, "volume"));
  writeFileSync(path.join(local, "volume", "tool.txt"), "from the operator\n");
  daemon = await startDaemon({ args: ["--volume", `node-vol=${path.join(local, "volume")}:ro`] });
  client = new Crucible({ host: daemon.socket });
}, { timeout: 90_000 });

after(async () => {
  await client?.close();
  await daemon?.stop();
  if (local) rmSync(local, { recursive: true, force: true });
}, { timeout: 90_000 });

describe("egress and caches", () => {
  test("a sandbox with a cache and a network fetches through its proxy; the cache outlives it", T, async () => {
    const port = daemon.blob.port;
    const cache = { name: "node-pip", path: "/root/.cache/pip", size_mib: 64 };
    const blobSha = createHash("sha256").update(BLOB).digest("hex");
    {
      await using sb = await Sandbox.create({ client, caches: [cache], network: { allow: [`127.0.0.1:${port}`] } });
      const info = await sb.info();
      assert.deepEqual(info.network?.allow, [`127.0.0.1:${port}`]);
      const got = await sb.run(["sh", "-c", `wget -q -O /root/.cache/pip/blob http://127.0.0.1:${port}/blob && sha256sum /root/.cache/pip/blob`]);
      assert.equal(got.exitCode, 0, got.stderrText);
      assert.equal(got.stdoutText.split(" ")[0], blobSha);
      // Straight to stdout too: the proxy's bytes are the server's.
      const direct = await sb.run(["wget", "-q", "-O-", `http://127.0.0.1:${port}/blob`]);
      assert.deepEqual(direct.stdout, BLOB);
      const denied = await sb.run(["sh", "-c", "wget -q -O- http://example.com/ 2>&1"]);
      assert.notEqual(denied.exitCode, 0);
      assert.match(denied.stdoutText, /403/);
      const net = (await sb.info()).network!;
      assert.equal(net.connections, 2);
      assert.ok(net.denied >= 1);
      assert.ok(net.bytes_in >= 2 * BLOB.length);
      assert.ok(daemon.blob.hits.size > 0, "the blob server was reached");
      const listed = (await client.caches.list()).find((c) => c.name === "node-pip");
      assert.equal(listed?.in_use_by, sb.id);
      // No delete while it is in use; a second sandbox shares it, on a copy as last saved
      // (empty: the first has not ended), and only reads it here (save: false).
      await assert.rejects(client.caches.remove("node-pip"), (e: unknown) => e instanceof Conflict && e.status === 409);
      {
        await using reader = await Sandbox.create({ client, caches: [{ ...cache, save: false }] });
        const seen = await reader.run(["sh", "-c", "ls /root/.cache/pip | grep -v lost+found; echo reader > /root/.cache/pip/reader"]);
        assert.equal(seen.stdoutText, "", "a copy as last saved, without the first's writes");
        const both = (await client.caches.list()).find((c) => c.name === "node-pip");
        assert.deepEqual(both?.users, [sb.id, reader.id]);
      }
    }
    const kept = (await client.caches.list()).find((c) => c.name === "node-pip");
    assert.ok(kept, "the cache outlives its sandbox");
    assert.equal(kept.size_mib, 64);
    assert.equal(kept.in_use_by ?? undefined, undefined);
    {
      await using again = await Sandbox.create({ client, caches: [cache] });
      const sum = await again.run(["sha256sum", "/root/.cache/pip/blob"]);
      assert.equal(sum.stdoutText.split(" ")[0], blobSha, "the next sandbox finds what the last one cached");
      assert.equal((await again.run(["test", "-e", "/root/.cache/pip/reader"])).exitCode, 1, "a reader's writes are never saved");
      assert.equal((await again.run(["wget", "-q", "-O-", `http://127.0.0.1:${port}/blob`])).exitCode === 0, false, "no network was asked for");
    }
    assert.deepEqual(await client.caches.clear(), []);
    assert.equal((await client.caches.list()).some((c) => c.name === "node-pip"), false);
    await assert.rejects(client.caches.remove("node-pip"), (e: unknown) => e instanceof CacheNotFound && e.status === 404);
  });
});

describe("volumes and disk", () => {
  test("an operator's volume is mounted read-only; a disk-backed layer has its size", T, async () => {
    {
      await using sb = await Sandbox.create({ client, volumes: [{ name: "node-vol", path: "/opt/vol" }], diskMib: 128 });
      assert.equal((await sb.run(["cat", "/opt/vol/tool.txt"])).stdoutText, "from the operator\n");
      const write = await sb.run("echo x > /opt/vol/new 2>&1");
      assert.notEqual(write.exitCode, 0, "the volume is read-only");
      const info = await sb.info();
      assert.equal(info.disk_mib, 128);
      const df = await sb.run(["df", "-m", "/tmp"]);
      assert.equal(df.exitCode, 0, df.stderrText);
    }
    await assert.rejects(Sandbox.create({ client, volumes: [{ name: "undeclared", path: "/opt/x" }] }), (e: unknown) => e instanceof InvalidRequest && /node-vol/.test(e.message));
  });
});

describe("images", () => {
  let archive: Buffer;

  before(async () => {
    // A rootfs tarball of the built image's tree plus one marker file, gzipped.
    const entries = await treeEntries(path.join(daemon.image, "rootfs"));
    entries.push({ type: "file", path: "etc/from-node", mode: 0o644, mtimeMs: Date.now(), size: 5, source: Buffer.from("node\n") });
    const parts: Buffer[] = [];
    for await (const b of tarStream(entries)) parts.push(b);
    archive = gzipSync(Buffer.concat(parts));
  }, { timeout: 60_000 });

  test("import from bytes, a path and a stream; run it; remove, prune", T, async () => {
    const info = await client.images.import("node-rootfs", archive);
    assert.equal(info.name, "node-rootfs");
    assert.equal(info.format, "rootfs");
    assert.equal(info.layers.length, 1);
    assert.ok((await client.images.list()).some((i) => i.name === "node-rootfs"));
    assert.equal((await client.images.get("node-rootfs")).name, "node-rootfs");

    const file = path.join(local, "rootfs.tar.gz");
    writeFileSync(file, archive);
    assert.equal((await client.images.import("node-from-path", file)).format, "rootfs");
    assert.equal((await client.images.import("node-from-stream", createReadStream(file))).format, "rootfs");

    {
      await using sb = await Sandbox.create({ client, image: "node-rootfs" });
      const r = await sb.run(["cat", "/etc/from-node"]);
      assert.equal(r.stdoutText, "node\n", r.stderrText);
      await assert.rejects(client.images.remove("node-rootfs"), (e: unknown) => e instanceof Conflict && e.status === 409);
      assert.deepEqual((await client.images.prune({ prefix: "node-rootfs" })).removed, [], "in use: kept");
    }
    assert.deepEqual((await client.images.prune({ unusedForS: 3600, prefix: "node-" })).removed, [], "all used just now");
    const pruned = await client.images.prune({ prefix: "node-from-" });
    assert.deepEqual(pruned.removed.sort(), ["node-from-path", "node-from-stream"]);
    await client.images.remove("node-rootfs");
    await assert.rejects(client.images.get("node-rootfs"), (e: unknown) => e instanceof ImageNotFound && e.status === 404);
    await assert.rejects(client.images.remove("node-rootfs"), ImageNotFound);
  });

  test("an archive that is not an image is InvalidImage; a missing file a TypeError", T, async () => {
    await assert.rejects(client.images.import("node-bad", Buffer.from("not an image archive".repeat(100))), (e: unknown) => e instanceof InvalidImage && e.code === "invalid_image");
    // An empty tar (its end-of-archive blocks only) holds nothing a sandbox could run.
    await assert.rejects(client.images.import("node-empty", Buffer.alloc(1024)), (e: unknown) => e instanceof InvalidImage && /holds no files/.test(e.message));
    await assert.rejects(client.images.import("node-bad", path.join(local, "nope.tar")), TypeError);
    await assert.rejects(client.images.import("", archive), TypeError);
  });
});
