// 100 commands over 10 sandboxes at once: the sandboxes are made in parallel, each takes
// every tenth command, all commands run concurrently, and every output is checked.
//
//   node concurrency.js [--sandboxes 10] [--commands 100]
//
// The daemon is $CRUCIBLE_HOST (a socket path or http://host:port; $CRUCIBLE_API_KEY over TCP).

import { parseArgs } from "node:util";

import { Crucible } from "@crucible/sdk";
import type { CommandResult, Sandbox } from "@crucible/sdk";

async function main(): Promise<number> {
  const { values } = parseArgs({ options: { sandboxes: { type: "string", default: "10" }, commands: { type: "string", default: "100" } } });
  const nSandboxes = Number(values.sandboxes);
  const nCommands = Number(values.commands);
  if (!(nSandboxes >= 1 && nCommands >= 1)) throw new Error("--sandboxes and --commands must be positive");

  await using client = new Crucible();
  const t0 = performance.now();
  const made = await Promise.allSettled(Array.from({ length: nSandboxes }, (_, i) => client.sandboxes.create({ labels: { example: "concurrency", n: String(i) } })));
  const sandboxes = made.flatMap((m) => (m.status === "fulfilled" ? [m.value] : []));
  try {
    const failed = made.find((m) => m.status === "rejected");
    if (failed) throw (failed as PromiseRejectedResult).reason;
    const created = performance.now();
    console.log(`${nSandboxes} sandboxes in ${(created - t0).toFixed(0)} ms`);

    const times: number[] = [];
    const run = async (sb: Sandbox, i: number): Promise<CommandResult> => {
      const start = performance.now();
      const r = await sb.run(["sh", "-c", `echo "command $0 in $(hostname)"; test $(( $0 % 7 )) -ne 0 || echo sevens >&2`, String(i)]);
      times.push(performance.now() - start);
      return r;
    };
    const results = await Promise.all(Array.from({ length: nCommands }, (_, i) => run(sandboxes[i % nSandboxes]!, i)));
    const elapsed = performance.now() - created;

    let bad = 0;
    results.forEach((r, i) => {
      const ok = r.ok && r.stdoutText.startsWith(`command ${i} in `) && (r.stderrText === "sevens\n") === (i % 7 === 0);
      if (!ok) {
        bad++;
        console.error(`command ${i}: ${r.describe()}: ${JSON.stringify(r.stdoutText)} ${JSON.stringify(r.stderrText)}`);
      }
    });
    times.sort((a, b) => a - b);
    const q = (p: number): string => times[Math.min(times.length - 1, Math.floor(p * times.length))]!.toFixed(1);
    console.log(`${nCommands} commands in ${elapsed.toFixed(0)} ms (${((nCommands / elapsed) * 1000).toFixed(0)}/s); each: p50 ${q(0.5)} ms, p90 ${q(0.9)} ms, max ${q(0.999)} ms`);
    console.log(bad === 0 ? "all outputs as expected" : `${bad} of ${nCommands} commands went wrong`);
    return bad === 0 ? 0 : 1;
  } finally {
    await Promise.allSettled(sandboxes.map((sb) => sb.kill()));
  }
}

main().then(
  (code) => process.exit(code),
  (e: unknown) => {
    console.error(`concurrency: ${String(e)}`);
    process.exit(125);
  },
);
