#!/usr/bin/env bash
# The Python SDK's checks, in the order CI runs them: the generated models against
# docs/openapi.json, mypy --strict on the package, the README's blocks and examples/python,
# then the test suite against a real daemon ($CRUCIBLE_BIN serving $CRUCIBLE_IMAGE; see
# tests/conftest.py). Run from anywhere: bash sdks/python/ci.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"

python=${PYTHON:-python3}

# What the checks need, installed with pip when missing (a fresh machine has none of it).
need() {  # need MODULE PIP-SPEC
  if ! "$python" -c "import $1" >/dev/null 2>&1; then
    echo "ci.sh: $1 is missing: installing $2 with pip"
    "$python" -m pip install --quiet "$2"
  fi
}
need pytest 'pytest>=7'
need mypy 'mypy>=1.8'
need websockets 'websockets>=13'

echo "==> models: tools/gen_models.py --check"
"$python" sdks/python/tools/gen_models.py --check

echo "==> mypy --strict: the package"
"$python" -m mypy --strict sdks/python/crucible_sdk

blocks="$(mktemp -d)"
trap 'rm -rf "$blocks"' EXIT
"$python" sdks/python/tools/readme_blocks.py "$blocks" >/dev/null
echo "==> mypy --strict: the README's blocks and examples/python"
MYPYPATH=sdks/python "$python" -m mypy --strict "$blocks" examples/python

echo "==> pytest"
"$python" -m pytest -q sdks/python
