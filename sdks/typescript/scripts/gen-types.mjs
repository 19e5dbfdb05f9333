// Generates src/generated/openapi.ts from docs/openapi.json, or with --check regenerates it
// into a temporary file and fails on any difference, so that an API change the SDK has not
// picked up fails CI instead of drifting. One script for both, so the two cannot disagree on
// the generator's options.
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, relative } from "node:path";
import { fileURLToPath } from "node:url";

const pkg = join(dirname(fileURLToPath(import.meta.url)), "..");
const spec = join(pkg, "../../docs/openapi.json");
const committed = join(pkg, "src/generated/openapi.ts");
const cli = join(pkg, "node_modules/openapi-typescript/bin/cli.js");
const check = process.argv.includes("--check");

function generate(out) {
  // --default-non-nullable=false: a field with a default may be absent on the wire
  // (docs/protocol.md: "readers should default missing ones"), and a request need not send it.
  execFileSync(process.execPath, [cli, spec, "--output", out, "--default-non-nullable=false"], {
    cwd: pkg,
    stdio: ["ignore", "ignore", "inherit"],
  });
}

if (!check) {
  generate(committed);
  console.log(`wrote ${relative(process.cwd(), committed)}`);
  process.exit(0);
}

const dir = mkdtempSync(join(tmpdir(), "crucible-gen-types-"));
try {
  const fresh = join(dir, "openapi.ts");
  generate(fresh);
  const want = readFileSync(fresh, "utf8");
  let have = "";
  try {
    have = readFileSync(committed, "utf8");
  } catch {
    // Missing counts as drift.
  }
  if (want !== have) {
    const a = have.split("\n");
    const b = want.split("\n");
    let i = 0;
    while (i < a.length && i < b.length && a[i] === b[i]) i++;
    console.error(`src/generated/openapi.ts is out of date with docs/openapi.json (first difference at line ${i + 1}):`);
    console.error(`  committed: ${a[i] ?? "<end of file>"}`);
    console.error(`  generated: ${b[i] ?? "<end of file>"}`);
    console.error("run `npm run gen-types` and commit the result");
    process.exit(1);
  }
  console.log("src/generated/openapi.ts matches docs/openapi.json");
} finally {
  rmSync(dir, { recursive: true, force: true });
}
