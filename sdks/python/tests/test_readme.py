"""Every Python block of the README runs against the test daemon and prints what the README
says it prints (blocks marked `not run` are type-checked by ci.sh only, and say why)."""

import os
import pathlib
import subprocess
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tools"))
from readme_blocks import blocks  # noqa: E402

PACKAGE = pathlib.Path(__file__).resolve().parents[1]
BLOCKS = blocks()
RUN = [b for b in BLOCKS if b.not_run is None]


def test_the_readme_has_runnable_blocks_and_says_why_others_are_not():
    assert len(RUN) >= 12, [b.line for b in BLOCKS]
    for block in BLOCKS:
        assert block.not_run is None or len(block.not_run) > 10, block


def test_the_quick_starts_are_five_lines_of_code_sync_and_async():
    sync, asynchronous = BLOCKS[0], BLOCKS[1]
    assert "AsyncSandbox" not in sync.code and "AsyncSandbox" in asynchronous.code
    for block in (sync, asynchronous):
        lines = [line for line in block.code.splitlines() if line.strip()]
        assert len(lines) <= 5, f"README line {block.line}: {len(lines)} lines of code"
        assert block.not_run is None and block.output, "a quick start runs and shows its output"


@pytest.mark.parametrize("block", RUN, ids=lambda b: f"line{b.line}")
def test_readme_block(daemon, block, tmp_path):
    script = tmp_path / "block.py"
    script.write_text(block.code)
    env = dict(os.environ, CRUCIBLE_HOST=str(daemon),
               PYTHONPATH=os.pathsep.join([str(PACKAGE), os.environ.get("PYTHONPATH", "")]))
    env.pop("CRUCIBLE_API_KEY", None)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, f"README line {block.line}:\n{done.stderr}"
    if block.output is not None:
        assert done.stdout == block.output, f"README line {block.line}"
