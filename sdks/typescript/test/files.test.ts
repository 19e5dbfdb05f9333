// Files against a real daemon: write/read, a tree uploaded and downloaded back, the refusals,
// a download's mode and time.

import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, symlinkSync, writeFileSync } from "node:fs";
import http from "node:http";
import type { AddressInfo } from "node:net";
import os from "node:os";
import path from "node:path";
import { after, before, describe, test } from "node:test";

import { ConnectionError, Crucible, FileNotFound, IsADirectory, RefusedEntry, Sandbox, SandboxNotFound } from "../src/index.js";
import { tarStream } from "../src/tar.js";
import type { TarEntry } from "../src/tar.js";
import { startDaemon } from "./helpers/daemon.js";
import type { Daemon } from "./helpers/daemon.js";

const T = { timeout: 60_000 };
let daemon: Daemon;
let client: Crucible;
let sb: Sandbox;
let local: string;

before(async () => {
  daemon = await startDaemon();
  client = new Crucible({ host: daemon.socket });
  sb = await client.sandboxes.create({ labels: { suite: "node-files" } });
  local = mkdtempSync(path.join(os.tmpdir(), "crucible-nodetest-files-"));
}, { timeout: 90_000 });

after(async () => {
  await sb?.[Symbol.asyncDispose]();
  await client?.close();
  await daemon?.stop();
  if (local) rmSync(local, { recursive: true, force: true });
}, { timeout: 90_000 });

async function tarOf(entries: TarEntry[]): Promise<Buffer> {
  const parts: Buffer[] = [];
  for await (const b of tarStream(entries)) parts.push(b);
  return Buffer.concat(parts);
}

describe("write and read", () => {
  test("text and binary round trip, the directory made on the way", T, async () => {
    const put = await sb.files.write("/work/notes/hello.txt", "hello, sandbox\n");
    assert.equal(put.files, 1);
    assert.deepEqual(put.written, ["hello.txt"]);
    assert.equal(await sb.files.readText("/work/notes/hello.txt"), "hello, sandbox\n");
    const bin = randomBytes(200_000);
    await sb.files.write("/work/bin.dat", bin, { mode: 0o600 });
    assert.deepEqual(await sb.files.read("/work/bin.dat"), bin);
    const st = await sb.run(["stat", "-c", "%a %u %s", "/work/bin.dat"]);
    assert.equal(st.stdoutText, `600 0 ${bin.length}\n`);
    // What a command writes, the files API reads.
    await sb.run("printf 'from a command' > /tmp/made-by-sh");
    assert.equal(await sb.files.readText("/tmp/made-by-sh"), "from a command");
    await sb.files.write("/tmp/empty", "");
    assert.equal((await sb.files.read("/tmp/empty")).length, 0);
  });

  test("a missing file is FileNotFound, a directory IsADirectory, a relative path a TypeError", T, async () => {
    await assert.rejects(sb.files.read("/no/such/file"), (e: unknown) => e instanceof FileNotFound && e.status === 404);
    await assert.rejects(sb.files.read("/etc"), (e: unknown) => e instanceof IsADirectory && e.status === 400);
    await assert.rejects(sb.files.read("etc/hostname"), TypeError);
    await assert.rejects(sb.files.write("/tmp/dir/", "x"), TypeError);
  });
});

describe("trees", () => {
  test("uploadDir then download: the same tree, links and modes included", T, async () => {
    const tree = path.join(local, "tree");
    // 216 bytes: ustar's prefix/name split; 336 bytes: a pax record.
    const long = `${"deep-directory-name/".repeat(8)}and-a-file-name-long-enough-to-need-more-than-ustar.txt`;
    const longer = `${"deep-directory-name/".repeat(14)}and-a-file-name-long-enough-to-need-more-than-ustar.txt`;
    const files: Record<string, Buffer> = {
      "README.md": Buffer.from("# a project\n"),
      "src/main.c": Buffer.from('int main(void) { return 0; }\n'),
      "src/data/blob.bin": randomBytes(300_000),
      "ünïcødé name.txt": Buffer.from("utf-8 names\n"),
      [long]: Buffer.from("a path of 200+ bytes\n"),
      [longer]: Buffer.from("a path of 300+ bytes\n"),
    };
    for (const [rel, data] of Object.entries(files)) {
      mkdirSync(path.dirname(path.join(tree, rel)), { recursive: true });
      writeFileSync(path.join(tree, rel), data);
    }
    writeFileSync(path.join(tree, "run.sh"), "#!/bin/sh\necho ran\n", { mode: 0o755 });
    mkdirSync(path.join(tree, "empty-dir"));
    symlinkSync("src/main.c", path.join(tree, "link-to-main"));
    const put = await sb.files.uploadDir(tree, "/work/project");
    assert.equal(put.files, Object.keys(files).length + 1);
    assert.equal(put.links, 1);
    assert.equal(put.refused, null);

    const listing = await sb.run(["sh", "-c", "cd /work/project && find . | sort"]);
    for (const rel of [...Object.keys(files), "run.sh", "empty-dir", "link-to-main"]) {
      assert.ok(listing.stdoutText.includes(`./${rel}\n`), `${rel} is in the sandbox:\n${listing.stdoutText}`);
    }
    assert.equal((await sb.run(["readlink", "/work/project/link-to-main"])).stdoutText, "src/main.c\n");
    assert.equal((await sb.run(["/work/project/run.sh"])).stdoutText, "ran\n");

    const back = path.join(local, "back");
    mkdirSync(back);
    for (const [i, [rel, data]] of Object.entries(files).entries()) {
      const to = path.join(back, `file-${i}`);
      assert.equal(await sb.files.download(`/work/project/${rel}`, to), data.length);
      assert.deepEqual(readFileSync(to), data, rel);
    }
  });

  test("a tree over 1 MiB streams", { timeout: 120_000 }, async () => {
    const tree = path.join(local, "big");
    mkdirSync(tree);
    const big = randomBytes(3 << 20);
    writeFileSync(path.join(tree, "big.bin"), big);
    writeFileSync(path.join(tree, "small.txt"), "small\n");
    const put = await sb.files.uploadDir(tree, "/work/big");
    assert.equal(put.bytes, big.length + 6);
    const sum = await sb.run(["sha256sum", "/work/big/big.bin"]);
    assert.equal(sum.stdoutText.split(" ")[0], createHash("sha256").update(big).digest("hex"));
  });

  test("uploading to an unknown sandbox is SandboxNotFound, not a broken pipe", { timeout: 120_000 }, async () => {
    const tree = path.join(local, "big");
    const ghost = new Sandbox(client, "sb-0123456789abcdef");
    await assert.rejects(ghost.files.uploadDir(tree, "/work"), SandboxNotFound);
  });

  test("an entry escaping its destination is RefusedEntry", T, async () => {
    const archive = await tarOf([{ type: "file", path: "../escape", mode: 0o644, mtimeMs: Date.now(), size: 1, source: Buffer.from("x") }]);
    await assert.rejects(sb.files.uploadTar(archive, "/work/jail"), (e: unknown) => e instanceof RefusedEntry && e.code === "refused_entry" && e.status === 400);
    assert.notEqual((await sb.run(["test", "-e", "/work/escape"])).exitCode, 0);
  });

  test("local mistakes are caught before anything is sent", T, async () => {
    await assert.rejects(sb.files.uploadDir(path.join(local, "missing"), "/work"), /no such directory/);
    await assert.rejects(sb.files.uploadDir(local, "work"), TypeError);
    const odd = path.join(local, "odd");
    mkdirSync(odd);
    execFileSync("mkfifo", [path.join(odd, "fifo")], { timeout: 10_000 });
    await assert.rejects(sb.files.uploadDir(odd, "/work/odd"), /only regular files, directories and symbolic links/);
  });
});

describe("download keeps mode and time", () => {
  test("a file's permission bits and mtime come down with it, never setuid", T, async () => {
    await sb.files.write("/work/keep/tool", "#!/bin/sh\necho tool\n", { mode: 0o755 });
    await sb.files.write("/work/keep/suid", "#!/bin/sh\necho suid\n", { mode: 0o755 });
    const prep = await sb.run(["sh", "-c", "chmod 4755 /work/keep/suid && touch -d @1700000000 /work/keep/tool /work/keep/suid && stat -c '%a %Y' /work/keep/tool /work/keep/suid"]);
    assert.equal(prep.exitCode, 0, prep.stderrText);
    assert.equal(prep.stdoutText, "755 1700000000\n4755 1700000000\n");

    for (const name of ["tool", "suid"]) {
      const to = path.join(local, `kept-${name}`);
      assert.equal(await sb.files.download(`/work/keep/${name}`, to), `#!/bin/sh\necho ${name}\n`.length);
      const st = statSync(to);
      assert.equal(st.mode & 0o7777, 0o755, `${name}: 0755, setuid, setgid and sticky dropped`);
      assert.equal(Math.floor(st.mtimeMs / 1000), 1700000000, `${name}: the sandbox's mtime`);
      assert.equal(Math.floor(st.atimeMs / 1000), 1700000000, `${name}: atime set with it`);
    }
    // A mode that takes the owner's bits away still comes down whole.
    await sb.run(["chmod", "0400", "/work/keep/tool"]);
    const ro = path.join(local, "kept-ro");
    await sb.files.download("/work/keep/tool", ro);
    assert.equal(statSync(ro).mode & 0o7777, 0o400);
    // A local directory that is not there is a local error, naming the paths, not the daemon's.
    const nowhere = path.join(local, "no-such-dir", "tool");
    await assert.rejects(sb.files.download("/work/keep/tool", nowhere), (e: unknown) => {
      const err = e as NodeJS.ErrnoException;
      assert.ok(!(e instanceof ConnectionError), String(e));
      assert.equal(err.code, "ENOENT");
      assert.match(err.message, /downloading \/work\/keep\/tool to .*no-such-dir/);
      return true;
    });
  });

  test("without X-Crucible-Mode and Last-Modified, or with them garbled, the file is 0644 and timed now", T, async () => {
    // A daemon of our own, that answers any download with these headers.
    const answers: Record<string, Record<string, string>> = {
      "/absent": {},
      "/garbled": { "x-crucible-mode": "rwxr-xr-x", "last-modified": "not a date" },
      "/empty": { "x-crucible-mode": "", "last-modified": "" },
    };
    const server = http.createServer((req, res) => {
      const asked = new URL(req.url ?? "/", "http://x").searchParams.get("path") ?? "";
      const headers = answers[asked];
      if (headers === undefined) {
        res.writeHead(404, { "content-type": "application/json" }).end(JSON.stringify({ error: { code: "not_found", message: "no such file" } }));
        return;
      }
      res.writeHead(200, { ...headers, "content-type": "application/octet-stream", "content-length": "5" }).end("hello");
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const fake = new Crucible({ host: `http://127.0.0.1:${(server.address() as AddressInfo).port}` });
    try {
      const reference = path.join(local, "reference-0644");
      writeFileSync(reference, "", { mode: 0o644 });
      const expected = statSync(reference).mode & 0o7777;
      const ghost = new Sandbox(fake, "sb-0123456789abcdef");
      for (const asked of Object.keys(answers)) {
        const to = path.join(local, `plain${asked.replace("/", "-")}`);
        const start = Date.now();
        assert.equal(await ghost.files.download(asked, to), 5);
        assert.equal(readFileSync(to, "utf8"), "hello");
        const st = statSync(to);
        assert.equal(st.mode & 0o7777, expected, asked);
        assert.ok(st.mtimeMs >= start - 2_000 && st.mtimeMs <= Date.now() + 2_000, `${asked}: timed now, not ${st.mtime.toISOString()}`);
      }
    } finally {
      await fake.close();
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    }
  });
});
