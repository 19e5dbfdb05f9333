#!/usr/bin/env python3
"""The Python code blocks of sdks/python/README.md, for type-checking and running them.

    python3 sdks/python/tools/readme_blocks.py OUT_DIR    # writes OUT_DIR/readme_NN.py

Each block is written verbatim to a file of its own, so that mypy --strict checks exactly what
a reader copies. The test suite (tests/test_readme.py) uses `blocks()` to run each block
against a real daemon and compare its output with the `text` block that follows it.
"""

from __future__ import annotations

import pathlib
import re
import sys
from dataclasses import dataclass
from typing import List, Optional

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
_FENCE = re.compile(r"^```(\w*)\s*$")
_NOT_RUN = re.compile(r"^<!-- not run: (.+) -->$")


@dataclass
class Block:
    index: int
    line: int
    code: str
    #: The text block right after it: what running it prints.
    output: Optional[str]
    #: Why it is only type-checked, when it is.
    not_run: Optional[str]


def blocks(readme: pathlib.Path = README) -> List[Block]:
    lines = readme.read_text().splitlines()
    found: List[Block] = []
    i = 0
    pending_not_run: Optional[str] = None
    while i < len(lines):
        marker = _NOT_RUN.match(lines[i])
        if marker:
            pending_not_run = marker.group(1)
            i += 1
            continue
        fence = _FENCE.match(lines[i])
        if not fence or not fence.group(1):
            if lines[i].strip():
                pending_not_run = None
            i += 1
            continue
        lang, start = fence.group(1), i + 1
        end = start
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        body = "\n".join(lines[start:end]) + "\n"
        i = end + 1
        if lang != "python":
            pending_not_run = None
            continue
        output = None
        j = i
        while j < len(lines) and not lines[j].strip():
            j += 1
        if j < len(lines) and lines[j].strip() == "```text":
            k = j + 1
            while k < len(lines) and lines[k].strip() != "```":
                k += 1
            output = "\n".join(lines[j + 1:k]) + "\n"
        found.append(Block(len(found), start, body, output, pending_not_run))
        pending_not_run = None
    return found


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = pathlib.Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for block in blocks():
        (out / f"readme_{block.index:02d}.py").write_text(block.code)
    print(f"wrote {len(blocks())} blocks to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
