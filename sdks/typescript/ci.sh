#!/usr/bin/env bash
# The TypeScript SDK's checks, in the order CI runs them: install exactly what the lockfile
# says, fail on drift between docs/openapi.json and the generated types, build with
# tsc --strict (the library, then the examples against its declarations), and run the codec
# and end-to-end tests. The end-to-end tests start a real daemon: CRUCIBLE_BIN (default
# target/debug/crucible) and CRUCIBLE_IMAGE (default target/crucible/image), as root; they
# fail, never skip, when either is missing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

run() {
  echo "+ $*" >&2
  "$@"
}

echo "sdks/typescript: node $(node --version), npm $(npm --version)" >&2
run npm ci --no-audit --no-fund
run rm -rf dist build
run npm run check-types
run npm run build
run npm run build:examples
run npm run build:test
run node --test --test-concurrency=1 build/test/
