// A real daemon for the end-to-end tests, started as sdks/python/tests/conftest.py starts it:
// the binary from $CRUCIBLE_BIN (default target/debug/crucible), the image from
// $CRUCIBLE_IMAGE (default target/crucible/image), a private socket, state and data
// directories, egress allowed only to a blob server on 127.0.0.1 that the tests start. A
// missing binary or image fails the suite with how to build it; nothing is skipped.

import { spawn } from "node:child_process";
import type { ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, rmSync, statSync } from "node:fs";
import http from "node:http";
import type { AddressInfo } from "node:net";
import os from "node:os";
import path from "node:path";

import { TEST_BIN, TEST_IMAGE, cleanEnv } from "./env.js";
import { REPO_ROOT } from "./paths.js";

/** 1 MiB of a pattern no compression or zero page hides. */
export const BLOB = Buffer.from(Array.from({ length: 1 << 20 }, (_, i) => (i * 7919 + 13) % 251));

export interface BlobServer {
  port: number;
  /** Requests served, by path. */
  hits: Map<string, number>;
  close(): Promise<void>;
}

export async function startBlobServer(): Promise<BlobServer> {
  const hits = new Map<string, number>();
  const server = http.createServer((req, res) => {
    hits.set(req.url ?? "", (hits.get(req.url ?? "") ?? 0) + 1);
    // The proxy forwards absolute-URI requests as origin-form; accept both.
    const p = (req.url ?? "").replace(/^http:\/\/[^/]+/, "");
    if (p !== "/blob") {
      res.writeHead(404).end();
      return;
    }
    res.writeHead(200, { "content-length": String(BLOB.length), "content-type": "application/octet-stream" });
    res.end(BLOB);
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(0, "127.0.0.1", resolve);
  });
  return {
    port: (server.address() as AddressInfo).port,
    hits,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

export interface Daemon {
  socket: string;
  dir: string;
  binary: string;
  image: string;
  blob: BlobServer;
  /** Everything the daemon wrote to stderr so far. */
  log(): string;
  stop(): Promise<void>;
}

export function daemonPaths(): { binary: string; image: string } {
  const binary = TEST_BIN ?? path.join(REPO_ROOT, "target/debug/crucible");
  const image = TEST_IMAGE ?? path.join(REPO_ROOT, "target/crucible/image");
  if (!existsSync(binary) || !statSync(binary).isFile()) {
    throw new Error(`the crucible binary ${binary} is missing: run \`cargo build -p crucible-cli\`, or set CRUCIBLE_BIN to one`);
  }
  if (!existsSync(path.join(image, "rootfs/init"))) {
    throw new Error(`no image at ${image} (no rootfs/init): run \`cargo xtask build-image\`, or set CRUCIBLE_IMAGE to one`);
  }
  return { binary, image };
}

export interface DaemonOptions {
  /** More `crucible serve` flags. */
  args?: string[];
  /** Environment of its own (CRUCIBLE_API_KEYS, say): the only CRUCIBLE_* variables it sees. */
  env?: Record<string, string>;
}

export async function startDaemon(options: DaemonOptions = {}): Promise<Daemon> {
  const { binary, image } = daemonPaths();
  const blob = await startBlobServer();
  const dir = mkdtempSync(path.join(os.tmpdir(), "crucible-nodetest-"));
  const socket = path.join(dir, "crucible.sock");
  const env = cleanEnv(options.env);
  const args = [
    "serve",
    "--socket", socket,
    "--image", image,
    "--state-dir", path.join(dir, "state"),
    "--data-dir", path.join(dir, "data"),
    "--egress-allow", `127.0.0.1:${blob.port}`,
    "--cgroup-parent", `crucible-nodetest-${process.pid}`,
    // A cache's default size counts whole against a budget taken from the host's free disk:
    // a small one keeps the tests from depending on how full the machine is.
    "--cache-mib", "256",
    ...(options.args ?? []),
  ];
  const proc = spawn(binary, args, { env, stdio: ["ignore", "ignore", "pipe"] });
  let stderr = "";
  proc.stderr!.on("data", (c: Buffer) => (stderr += c.toString("utf8")));
  const exited = new Promise<number | null>((resolve) => proc.once("exit", (code) => resolve(code)));
  let gone = false;
  void exited.then(() => (gone = true));
  const deadline = Date.now() + 20_000;
  while (!existsSync(socket)) {
    if (gone || Date.now() > deadline) {
      proc.kill("SIGKILL");
      await blob.close();
      rmSync(dir, { recursive: true, force: true });
      throw new Error(`the daemon did not start (${gone ? "it exited" : "no socket within 20 s"}): ${binary} ${args.join(" ")}\n${stderr}`);
    }
    await new Promise((r) => setTimeout(r, 20));
  }
  return {
    socket,
    dir,
    binary,
    image,
    blob,
    log: () => stderr,
    stop: () => stopDaemon(proc, exited, blob, dir),
  };
}

async function stopDaemon(proc: ChildProcess, exited: Promise<number | null>, blob: BlobServer, dir: string): Promise<void> {
  if (proc.exitCode === null && proc.signalCode === null) {
    proc.kill("SIGTERM");
    const timer = setTimeout(() => proc.kill("SIGKILL"), 30_000);
    await exited;
    clearTimeout(timer);
  }
  await blob.close();
  rmSync(dir, { recursive: true, force: true });
}

/** A TCP port free on 127.0.0.1 a moment ago. */
export async function freePort(): Promise<number> {
  const server = http.createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as AddressInfo).port;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

/** Rejects when `p` takes longer than `ms`: every wait in the tests has a deadline. */
export function within<T>(ms: number, p: Promise<T>, what: string): Promise<T> {
  let timer: NodeJS.Timeout;
  return Promise.race([
    p.finally(() => clearTimeout(timer)),
    new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`${what}: no answer within ${ms} ms`)), ms);
    }),
  ]);
}
