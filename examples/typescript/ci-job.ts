// A CI job in a sandbox: check out a commit of a local repository (or take a plain directory),
// upload it, run the build and test steps with a persistent cache, stream their logs, and
// exit with the first failing step's status.
//
//   node ci-job.js --repo . --ref HEAD --image default \
//     --cache build-cache=/root/.cache \
//     --step 'build: make' --step 'test: make test'
//
// The daemon is $CRUCIBLE_HOST (a socket path or http://host:port; $CRUCIBLE_API_KEY over TCP).

import { spawn } from "node:child_process";
import { statSync } from "node:fs";
import { parseArgs } from "node:util";

import { Crucible, CrucibleError } from "@crucible/sdk";
import type { CacheMount } from "@crucible/sdk";

const WORKDIR = "/work/src";

interface Step {
  name: string;
  command: string;
}

function usage(message: string): never {
  console.error(`ci-job: ${message}`);
  console.error("usage: ci-job [--repo DIR] [--ref REF] [--image NAME] [--cache NAME=PATH]... [--allow HOST]... [--timeout S] --step 'NAME: COMMAND'...");
  process.exit(2);
}

function parseStep(s: string): Step {
  const colon = s.indexOf(":");
  if (colon <= 0) usage(`a step is 'NAME: COMMAND', got ${JSON.stringify(s)}`);
  return { name: s.slice(0, colon).trim(), command: s.slice(colon + 1).trim() };
}

function parseCache(s: string): CacheMount {
  const eq = s.indexOf("=");
  if (eq <= 0 || !s.slice(eq + 1).startsWith("/")) usage(`a cache is NAME=/ABSOLUTE/PATH, got ${JSON.stringify(s)}`);
  return { name: s.slice(0, eq), path: s.slice(eq + 1) };
}

/** `git archive` of the commit: a clean checkout as a tar stream, without the work tree's leftovers. */
function gitArchive(repo: string, ref: string): { stream: NodeJS.ReadableStream; done: Promise<void> } {
  const git = spawn("git", ["-C", repo, "archive", "--format=tar", ref], { stdio: ["ignore", "pipe", "pipe"] });
  let stderr = "";
  git.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
  const done = new Promise<void>((resolve, reject) => {
    git.once("error", reject);
    git.once("exit", (code) => (code === 0 ? resolve() : reject(new Error(`git archive ${ref} failed: ${stderr.trim()}`))));
  });
  return { stream: git.stdout, done };
}

async function main(): Promise<number> {
  const { values } = parseArgs({
    options: {
      repo: { type: "string", default: "." },
      ref: { type: "string" },
      image: { type: "string", default: "default" },
      cache: { type: "string", multiple: true, default: [] },
      allow: { type: "string", multiple: true, default: [] },
      step: { type: "string", multiple: true, default: [] },
      timeout: { type: "string", default: "3600" },
    },
  });
  const steps = values.step.map(parseStep);
  if (steps.length === 0) usage("no --step given");
  const timeoutS = Number(values.timeout);
  if (!Number.isInteger(timeoutS) || timeoutS < 0) usage(`--timeout must be whole seconds, got ${values.timeout}`);
  if (!statSync(values.repo, { throwIfNoEntry: false })?.isDirectory()) usage(`${values.repo} is not a directory`);

  await using client = new Crucible();
  await using sb = await client.sandboxes.create({
    image: values.image,
    caches: values.cache.map(parseCache),
    ...(values.allow.length > 0 ? { network: { allow: values.allow } } : {}),
    env: { CI: "true" },
    labels: { job: "ci-job" },
  });
  // Ctrl-C: leave through the `await using` cleanup rather than leave the sandbox behind.
  process.once("SIGINT", () => void sb.kill().finally(() => process.exit(130)));
  console.error(`ci-job: sandbox ${sb.id} (${values.image})`);

  if (values.ref !== undefined) {
    const { stream, done } = gitArchive(values.repo, values.ref);
    const [put] = await Promise.all([sb.files.uploadTar(stream as AsyncIterable<Uint8Array>, WORKDIR), done]);
    console.error(`ci-job: checked out ${values.ref}: ${put.files} files, ${put.bytes} bytes`);
  } else {
    const put = await sb.files.uploadDir(values.repo, WORKDIR);
    console.error(`ci-job: uploaded ${values.repo}: ${put.files} files, ${put.bytes} bytes`);
  }

  for (const step of steps) {
    console.error(`\n::group::${step.name}: ${step.command}`);
    const started = Date.now();
    const result = await sb.run(step.command, {
      cwd: WORKDIR,
      timeoutS,
      execId: `ci-${step.name.replace(/[^A-Za-z0-9._-]/g, "-")}`.slice(0, 128),
      onStdout: (d) => process.stdout.write(d),
      onStderr: (d) => process.stderr.write(d),
      collect: false,
    });
    console.error(`::endgroup:: ${step.name}: ${result.describe()} in ${((Date.now() - started) / 1000).toFixed(1)} s`);
    if (!result.ok) {
      console.error(`ci-job: step ${step.name} failed`);
      return result.exitCode > 0 ? result.exitCode : 1;
    }
  }
  console.error("ci-job: all steps passed");
  return 0;
}

main().then(
  (code) => process.exit(code),
  (e: unknown) => {
    console.error(`ci-job: ${e instanceof CrucibleError ? `${e.name}: ${e.message}` : String(e)}`);
    process.exit(125);
  },
);
