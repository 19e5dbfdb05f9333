// The tests must not depend on the environment they are started from. A CRUCIBLE_API_KEY or
// CRUCIBLE_HOST of the caller's (a developer's shell, a CI job's) would otherwise become the
// default of every client a test makes without one, and reach the daemons and examples the
// tests start. So every CRUCIBLE_* variable is taken out of this process's environment as soon
// as a test file loads (every test file imports this module, directly or through the other
// helpers), before any test runs. The two that configure the tests themselves, CRUCIBLE_BIN
// and CRUCIBLE_IMAGE, are read first and kept here.

const PREFIX = "CRUCIBLE_";

/** $CRUCIBLE_BIN as the tests were started with it: the daemon binary to run. */
export const TEST_BIN: string | undefined = process.env["CRUCIBLE_BIN"] || undefined;
/** $CRUCIBLE_IMAGE as the tests were started with it: the image the daemon serves. */
export const TEST_IMAGE: string | undefined = process.env["CRUCIBLE_IMAGE"] || undefined;

for (const name of Object.keys(process.env)) {
  if (name.startsWith(PREFIX)) delete process.env[name];
}

/** This process's environment, which holds no CRUCIBLE_* variable, with `extra` over it. */
export function cleanEnv(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [name, value] of Object.entries(process.env)) {
    if (!name.startsWith(PREFIX)) env[name] = value;
  }
  return { ...env, ...extra };
}
