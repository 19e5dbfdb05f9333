// examples/typescript run for real against the test daemon, as compiled by
// tsconfig.examples.json (npm test builds them first; a missing build fails here).

import assert from "node:assert/strict";
import { execFile, execFileSync } from "node:child_process";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, before, test } from "node:test";
import { promisify } from "node:util";

import { Crucible } from "../src/index.js";
import { startDaemon } from "./helpers/daemon.js";
import type { Daemon } from "./helpers/daemon.js";
import { cleanEnv } from "./helpers/env.js";
import { PACKAGE_DIR } from "./helpers/paths.js";

const run = promisify(execFile);
const EXAMPLES = path.join(PACKAGE_DIR, "build/examples");
let daemon: Daemon;
let repo: string;

before(async () => {
  for (const name of ["ci-job.js", "concurrency.js"]) {
    assert.ok(existsSync(path.join(EXAMPLES, name)), `${EXAMPLES}/${name} is missing: run \`npm run build && npm run build:examples\``);
  }
  daemon = await startDaemon();
  repo = mkdtempSync(path.join(os.tmpdir(), "crucible-nodetest-repo-"));
  writeFileSync(path.join(repo, "build.sh"), "echo building; mkdir -p out && echo artifact > out/a\n");
  writeFileSync(path.join(repo, "test.sh"), "test -f out/a && echo tests pass\n");
  const git = (...args: string[]): void => {
    execFileSync("git", ["-C", repo, "-c", "user.email=ci@example.invalid", "-c", "user.name=ci", ...args], { stdio: "ignore", timeout: 20_000 });
  };
  git("init", "-q");
  git("add", ".");
  git("commit", "-q", "-m", "a commit");
  // Not in the commit: a checkout of it must not carry this along.
  writeFileSync(path.join(repo, "untracked.txt"), "leftover\n");
}, { timeout: 90_000 });

after(async () => {
  await daemon?.stop();
  if (repo) rmSync(repo, { recursive: true, force: true });
}, { timeout: 90_000 });

function env(): NodeJS.ProcessEnv {
  return cleanEnv({ CRUCIBLE_HOST: daemon.socket });
}

async function leftovers(): Promise<number> {
  const c = new Crucible({ host: daemon.socket });
  try {
    return (await c.sandboxes.list()).length;
  } finally {
    await c.close();
  }
}

test("concurrency.ts: 100 commands over 10 sandboxes, all outputs checked, nothing left behind", { timeout: 120_000 }, async () => {
  const { stdout } = await run(process.execPath, [path.join(EXAMPLES, "concurrency.js")], { env: env(), timeout: 110_000 });
  assert.match(stdout, /^10 sandboxes in \d+ ms$/m);
  assert.match(stdout, /^100 commands in \d+ ms/m);
  assert.match(stdout, /^all outputs as expected$/m);
  assert.equal(await leftovers(), 0);
});

test("ci-job.ts: a checkout built and tested with a cache; a failing step fails the job", { timeout: 120_000 }, async () => {
  const args = [path.join(EXAMPLES, "ci-job.js"), "--repo", repo, "--ref", "HEAD", "--cache", "node-ci=/root/.cache"];
  const ok = await run(process.execPath, [...args, "--step", "build: sh build.sh", "--step", "test: sh test.sh && test ! -e untracked.txt"], { env: env(), timeout: 110_000 });
  assert.equal(ok.stdout, "building\ntests pass\n");
  assert.match(ok.stderr, /checked out HEAD: 2 files/);
  assert.match(ok.stderr, /all steps passed/);
  const failing = run(process.execPath, [...args, "--step", "build: sh build.sh", "--step", "fail: echo broken >&2; exit 3", "--step", "never: echo never"], { env: env(), timeout: 110_000 });
  await assert.rejects(failing, (e: unknown) => {
    const err = e as { code?: number; stdout?: string; stderr?: string };
    assert.equal(err.code, 3, "the job exits with the failing step's status");
    assert.equal(err.stdout, "building\n");
    assert.match(err.stderr ?? "", /broken\n/);
    assert.match(err.stderr ?? "", /step fail failed/);
    return true;
  });
  // The cache is the daemon's now, and the job's sandboxes are gone.
  const c = new Crucible({ host: daemon.socket });
  try {
    assert.ok((await c.caches.list()).some((k) => k.name === "node-ci"));
  } finally {
    await c.close();
  }
  assert.equal(await leftovers(), 0);
});
