// The exec round trip of `true` through the SDK, next to the same request written by hand
// on a kept-alive socket of the same daemon and sandbox, interleaved in one process so that
// both see the same machine load. The difference is what the SDK costs.
//
//   npm run bench                        # starts a daemon ($CRUCIBLE_BIN, $CRUCIBLE_IMAGE)
//   CRUCIBLE_HOST=/path/to.sock npm run bench   # or measures an existing one
//   BENCH_ROUNDS=2000 npm run bench
//   BENCH_SAMPLES_JSON=FILE …            # also writes every round's times (ms) as
//                                        # {"sdk": […], "raw": […]} (for `cargo xtask bench`)

import { renameSync, writeFileSync } from "node:fs";
import net from "node:net";

import { Crucible } from "../src/index.js";
import { startDaemon } from "../test/helpers/daemon.js";
import type { Daemon } from "../test/helpers/daemon.js";

const ROUNDS = Number(process.env["BENCH_ROUNDS"] ?? 2000);
const WARMUP = Math.min(200, ROUNDS);

/** A minimal HTTP/1.1 client for one request shape: POST, then a chunked answer read to its last chunk. */
class RawExec {
  readonly #socket: net.Socket;
  readonly #request: Buffer;
  #buf: Buffer = Buffer.alloc(0);
  #done: ((err?: Error) => void) | null = null;

  private constructor(socket: net.Socket, request: Buffer) {
    this.#socket = socket;
    this.#request = request;
    socket.on("data", (chunk: Buffer) => {
      this.#buf = this.#buf.length === 0 ? chunk : Buffer.concat([this.#buf, chunk]);
      if (this.#complete()) {
        this.#buf = Buffer.alloc(0);
        const done = this.#done;
        this.#done = null;
        done?.();
      }
    });
    socket.on("error", (e) => this.#done?.(e));
    socket.on("close", () => this.#done?.(new Error("the daemon closed the connection")));
    // A daemon that stops answering fails the bench instead of holding it.
    socket.setTimeout(30_000, () => socket.destroy(new Error("no answer from the daemon for 30 s")));
  }

  static async open(socketPath: string, sandboxId: string): Promise<RawExec> {
    const socket = net.connect({ path: socketPath });
    await new Promise<void>((resolve, reject) => {
      socket.once("connect", resolve);
      socket.once("error", reject);
    });
    socket.setNoDelay(true);
    const body = JSON.stringify({ cmd: ["true"] });
    const request = Buffer.from(
      `POST /sandboxes/${sandboxId}/exec HTTP/1.1\r\nHost: crucible\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`,
    );
    return new RawExec(socket, request);
  }

  run(): Promise<void> {
    return new Promise((resolve, reject) => {
      this.#done = (err) => (err ? reject(err) : resolve());
      this.#socket.write(this.#request);
    });
  }

  /** Whether the buffer holds a whole 200 answer: head, chunks, the zero chunk. */
  #complete(): boolean {
    const b = this.#buf;
    const head = b.indexOf("\r\n\r\n");
    if (head < 0) return false;
    if (b.toString("latin1", 0, 12) !== "HTTP/1.1 200") throw new Error(`unexpected answer: ${b.toString("latin1", 0, 200)}`);
    let at = head + 4;
    for (;;) {
      const eol = b.indexOf("\r\n", at);
      if (eol < 0) return false;
      const size = parseInt(b.toString("latin1", at, eol), 16);
      if (size === 0) return b.length >= eol + 4;
      at = eol + 2 + size + 2;
      if (at > b.length) return false;
    }
  }

  close(): void {
    this.#socket.destroy();
  }
}

function quantile(sorted: number[], q: number): number {
  const i = Math.min(sorted.length - 1, Math.max(0, Math.round(q * (sorted.length - 1))));
  return sorted[i]!;
}

const ms = (ns: bigint): number => Number(ns) / 1e6;

async function main(): Promise<void> {
  let daemon: Daemon | undefined;
  let host = process.env["CRUCIBLE_HOST"];
  if (!host) {
    daemon = await startDaemon();
    host = daemon.socket;
  }
  const socketPath = host.startsWith("unix:") ? host.slice(5) : host;
  if (socketPath.startsWith("http://")) throw new Error("the raw side speaks over a Unix socket: point CRUCIBLE_HOST at one");
  const client = new Crucible({ host: socketPath });
  const sb = await client.sandboxes.create({ labels: { bench: "sdk-roundtrip" } });
  const raw = await RawExec.open(socketPath, sb.id);
  try {
    const sdkRun = async (): Promise<number> => {
      const t0 = process.hrtime.bigint();
      const r = await sb.run(["true"]);
      const t = ms(process.hrtime.bigint() - t0);
      if (r.exitCode !== 0) throw new Error(`true exited ${r.exitCode}: ${r.describe()}`);
      return t;
    };
    const rawRun = async (): Promise<number> => {
      const t0 = process.hrtime.bigint();
      await raw.run();
      return ms(process.hrtime.bigint() - t0);
    };
    for (let i = 0; i < WARMUP; i++) {
      await sdkRun();
      await rawRun();
    }
    const sdk: number[] = [];
    const direct: number[] = [];
    const diff: number[] = [];
    for (let i = 0; i < ROUNDS; i++) {
      // Alternate which goes first, so neither always follows the other's tail.
      let a: number;
      let b: number;
      if (i % 2 === 0) {
        a = await sdkRun();
        b = await rawRun();
      } else {
        b = await rawRun();
        a = await sdkRun();
      }
      sdk.push(a);
      direct.push(b);
      diff.push(a - b);
    }
    const samplesFile = process.env["BENCH_SAMPLES_JSON"];
    if (samplesFile) {
      writeFileSync(`${samplesFile}.partial`, JSON.stringify({ sdk, raw: direct }));
      renameSync(`${samplesFile}.partial`, samplesFile);
    }
    for (const xs of [sdk, direct, diff]) xs.sort((x, y) => x - y);
    const fmt = (x: number): string => x.toFixed(3).padStart(8);
    const figures = {
      rounds: ROUNDS,
      sdk: { p50: quantile(sdk, 0.5), p90: quantile(sdk, 0.9) },
      raw: { p50: quantile(direct, 0.5), p90: quantile(direct, 0.9) },
      overhead_p50: quantile(sdk, 0.5) - quantile(direct, 0.5),
      paired_diff_p50: quantile(diff, 0.5),
    };
    console.log(`exec round trip of \`true\`, ${ROUNDS} interleaved rounds, sandbox ${sb.id} on ${host}`);
    console.log(`             p50 ms   p90 ms`);
    console.log(`  sdk      ${fmt(figures.sdk.p50)} ${fmt(figures.sdk.p90)}`);
    console.log(`  raw http ${fmt(figures.raw.p50)} ${fmt(figures.raw.p90)}`);
    console.log(`  overhead ${fmt(figures.overhead_p50)}          (p50 sdk - p50 raw; median of paired differences ${figures.paired_diff_p50.toFixed(3)} ms)`);
    console.log(`  target: overhead <= 0.100 ms at p50: ${figures.overhead_p50 <= 0.1 ? "met" : "MISSED"}`);
    console.log(JSON.stringify(figures));
  } finally {
    raw.close();
    await sb.kill();
    await client.close();
    await daemon?.stop();
  }
}

main().catch((e: unknown) => {
  console.error(e);
  process.exit(1);
});
