#!/usr/bin/env python3
"""The exec round trip of `true` through the sync SDK next to a raw HTTP request.

    python3 sdks/python/bench/roundtrip.py [--host ADDR] [--sandbox ID] [-n 2000]
        [--samples-json FILE]

Both go over the same socket path to the same sandbox, each on a kept-alive connection of
its own, interleaved in one process (the order alternates every round so that drift in the
machine's load falls on both alike). The raw side writes a prepared request and reads until
the chunked body's last chunk: what any client must at least do. The difference is what the
SDK adds: building the ExecRequest, the HTTP head, parsing the answer, decoding frames, the
ExecResult and the RunResult. Without --sandbox a sandbox is created and deleted.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import socket
import statistics
import sys
import time
from typing import List

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from crucible_sdk import Client, Sandbox  # noqa: E402
from crucible_sdk._address import Address, parse_address  # noqa: E402


class Raw:
    """A raw HTTP/1.1 exec over one kept-alive socket."""

    def __init__(self, address: Address, sandbox_id: str, api_key: str | None) -> None:
        if address.is_unix:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.connect(address.path)
        else:
            self.sock = socket.create_connection((address.host, address.port))
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.settimeout(30)
        body = json.dumps({"cmd": ["true"]}).encode()
        auth = f"Authorization: Bearer {api_key}\r\n" if api_key else ""
        self.request = (f"POST /sandboxes/{sandbox_id}/exec HTTP/1.1\r\nHost: crucible\r\n"
                        f"Content-Type: application/json\r\n{auth}"
                        f"Content-Length: {len(body)}\r\n\r\n").encode() + body

    def exec_true(self) -> None:
        self.sock.sendall(self.request)
        buf = b""
        while not buf.endswith(b"\r\n0\r\n\r\n"):
            data = self.sock.recv(65536)
            if not data:
                raise RuntimeError("the daemon closed the connection")
            buf += data
        if not buf.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"unexpected answer {buf[:200]!r}")


def pct(values: List[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default=None, help="daemon address (default $CRUCIBLE_HOST)")
    parser.add_argument("--sandbox", default=None, help="an existing sandbox id")
    parser.add_argument("-n", type=int, default=2000, help="rounds (default 2000)")
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--samples-json", default=None, metavar="FILE",
                        help="also write every round's times (ms) as "
                             '{"sdk": [...], "raw": [...]} to FILE (for `cargo xtask bench`)')
    args = parser.parse_args()

    client = Client(args.host, timeout=30, stream_timeout=30)
    sb = (Sandbox.connect(args.sandbox, client=client) if args.sandbox
          else Sandbox.create(client=client, labels={"bench": "sdk-roundtrip"}))
    try:
        raw = Raw(parse_address(args.host), sb.id, client.api_key)
        sdk_times: List[float] = []
        raw_times: List[float] = []
        # CPU time this thread spent per call (user + system): what the SDK costs, without
        # the waiting, which the wall clock mixes with the machine's load.
        sdk_cpu: List[float] = []
        raw_cpu: List[float] = []
        clock = time.perf_counter
        cpu = time.thread_time
        for i in range(args.warmup + args.n):
            first_sdk = i % 2 == 0
            for which in ((0, 1) if first_sdk else (1, 0)):
                c, t = cpu(), clock()
                if which == 0:
                    result = sb.run(["true"])
                    elapsed, used = clock() - t, cpu() - c
                    if result.exit_code != 0:
                        raise RuntimeError(f"`true` failed: {result}")
                    if i >= args.warmup:
                        sdk_times.append(elapsed)
                        sdk_cpu.append(used)
                else:
                    raw.exec_true()
                    elapsed, used = clock() - t, cpu() - c
                    if i >= args.warmup:
                        raw_times.append(elapsed)
                        raw_cpu.append(used)
        diffs = [s - r for s, r in zip(sdk_times, raw_times)]
        if args.samples_json:
            samples = {"sdk": [t * 1e3 for t in sdk_times], "raw": [t * 1e3 for t in raw_times]}
            partial = args.samples_json + ".partial"
            with open(partial, "w") as out:
                json.dump(samples, out)
            os.replace(partial, args.samples_json)
        ms = 1e3
        print(f"exec round trip of `true`, {args.n} interleaved rounds, sandbox {sb.id} "
              f"({sb.info.backend}) at {client.address}")
        print(f"  sdk  p50 {pct(sdk_times, 50) * ms:7.3f} ms   p90 {pct(sdk_times, 90) * ms:7.3f} ms")
        print(f"  raw  p50 {pct(raw_times, 50) * ms:7.3f} ms   p90 {pct(raw_times, 90) * ms:7.3f} ms")
        print(f"  overhead  p50 {(pct(sdk_times, 50) - pct(raw_times, 50)) * ms:+.3f} ms   "
              f"p90 {(pct(sdk_times, 90) - pct(raw_times, 90)) * ms:+.3f} ms   "
              f"median of paired differences {statistics.median(diffs) * ms:+.3f} ms")
        print(f"  cpu per call (this thread)  sdk {statistics.mean(sdk_cpu) * 1e6:.0f} us   "
              f"raw {statistics.mean(raw_cpu) * 1e6:.0f} us")
        budget = 0.1
        overhead = (pct(sdk_times, 50) - pct(raw_times, 50)) * ms
        print(f"  target: overhead <= {budget} ms at p50: "
              f"{'met' if overhead <= budget else 'MISSED'}")
    finally:
        sb.close()
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
