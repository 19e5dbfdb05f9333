// Where things are, from the compiled file's place (build/test/helpers/) in the package.

import path from "node:path";
import { fileURLToPath } from "node:url";

// Loaded by every test file (directly or through the daemon helper): no CRUCIBLE_* of the
// caller's reaches a test.
import "./env.js";

/** sdks/typescript. */
export const PACKAGE_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../..");
/** The repository's root. */
export const REPO_ROOT = path.resolve(PACKAGE_DIR, "../..");
export const FIXTURES_DIR = path.join(REPO_ROOT, "fixtures");
