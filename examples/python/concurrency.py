#!/usr/bin/env python3
"""100 commands over 10 sandboxes, concurrently, on asyncio.

    python3 examples/python/concurrency.py [--sandboxes 10] [--commands 100]

The sandboxes are created together, each command goes to one of them in turn (all in flight
at once: the daemon runs up to --max-execs per sandbox), and every sandbox is deleted at the
end, whatever happened. Exits non-zero if any command failed.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time

from crucible_sdk import AsyncClient, AsyncSandbox, RunResult


async def timed_run(sb: AsyncSandbox, i: int) -> tuple[RunResult, float]:
    started = time.perf_counter()
    result = await sb.run(["sh", "-c", f"echo $(( {i} * {i} ))"])
    return result, time.perf_counter() - started


async def main(sandboxes: int, commands: int) -> int:
    async with AsyncClient() as client:
        started = time.perf_counter()
        made = await asyncio.gather(
            *(AsyncSandbox.create(client=client, labels={"example": "concurrency"})
              for _ in range(sandboxes)), return_exceptions=True)
        boxes = [b for b in made if isinstance(b, AsyncSandbox)]
        try:
            failed = [e for e in made if isinstance(e, BaseException)]
            if failed:
                print(f"creating sandboxes failed: {failed[0]}", file=sys.stderr)
                return 2
            created = time.perf_counter() - started
            runs = await asyncio.gather(
                *(timed_run(boxes[i % len(boxes)], i) for i in range(commands)))
            wall = time.perf_counter() - started - created
        finally:
            await asyncio.gather(*(b.aclose() for b in boxes))
    wrong = [i for i, (r, _) in enumerate(runs) if r.stdout != f"{i * i}\n".encode()]
    latencies = sorted(t for _, t in runs)
    print(f"{commands} commands over {len(boxes)} sandboxes: {commands - len(wrong)} ok; "
          f"sandboxes ready in {created:.2f} s, commands done in {wall:.2f} s; "
          f"latency p50 {statistics.median(latencies) * 1e3:.1f} ms, "
          f"max {latencies[-1] * 1e3:.1f} ms")
    return 1 if wrong else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sandboxes", type=int, default=10)
    parser.add_argument("--commands", type=int, default=100)
    args = parser.parse_args()
    sys.exit(asyncio.run(main(args.sandboxes, args.commands)))
