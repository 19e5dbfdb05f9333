#!/usr/bin/env python3
"""A/B of namespace sandbox creation between two builds of crucible, with bwrap beside them.

Starts two daemons (A and B: a `crucible` binary and an image directory each, e.g. the build
before a change and after it), then alternates N sequential creates on each (POST /sandboxes
until 201, then an untimed DELETE) and N bwrap one-shots of `true`, so that all three see the
same machine load. Prints p50/p90 of each and the ratios. Needs root (namespace sandboxes).

    scripts/ab-create.py --a OLD/crucible --a-image OLD_IMAGE --b target/release/crucible \\
        --b-image target/crucible/image [-n 500]
"""
import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import tempfile
import time


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost")
        self.socket_path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(self.socket_path)


def start(binary, image, name, workdir):
    d = os.path.join(workdir, name)
    os.makedirs(d)
    sock = os.path.join(d, "s.sock")
    proc = subprocess.Popen(
        [binary, "serve", "--socket", sock, "--state-dir", os.path.join(d, "state"),
         "--data-dir", os.path.join(d, "data"),
         "--image", image, "--cgroup-parent", f"crucible-ab-{name}-{os.getpid()}"],
        stderr=subprocess.DEVNULL)
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            conn = UnixConnection(sock)
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                return proc, sock
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"daemon {name} ({binary}) did not come up")


def create_ms(sock):
    conn = UnixConnection(sock)
    t = time.perf_counter()
    conn.request("POST", "/sandboxes", body="{}")
    response = conn.getresponse()
    body = response.read()
    elapsed = (time.perf_counter() - t) * 1000
    if response.status != 201:
        raise SystemExit(f"create failed: {response.status} {body!r}")
    conn.request("DELETE", f"/sandboxes/{json.loads(body)['id']}")
    conn.getresponse().read()
    conn.close()
    return elapsed


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--a", required=True, help="crucible binary A")
    p.add_argument("--a-image", required=True, help="image directory for A")
    p.add_argument("--b", required=True, help="crucible binary B")
    p.add_argument("--b-image", required=True, help="image directory for B")
    p.add_argument("-n", type=int, default=300, help="creates per build (default 300)")
    args = p.parse_args()
    rootfs = os.path.join(args.b_image, "rootfs")
    bwrap = ["bwrap", "--tmpfs", "/", "--ro-bind", f"{rootfs}/bin", "/bin", "--proc", "/proc",
             "--dev", "/dev", "--tmpfs", "/tmp", "--unshare-all", "--die-with-parent",
             "/bin/true"]
    with tempfile.TemporaryDirectory(prefix="crucible-ab-") as workdir:
        a = start(args.a, args.a_image, "a", workdir)
        b = start(args.b, args.b_image, "b", workdir)
        samples = {"A": [], "B": [], "bwrap": []}
        try:
            for _ in range(args.n):
                samples["A"].append(create_ms(a[1]))
                samples["B"].append(create_ms(b[1]))
                t = time.perf_counter()
                subprocess.run(bwrap, check=True)
                samples["bwrap"].append((time.perf_counter() - t) * 1000)
        finally:
            for proc, _ in (a, b):
                proc.terminate()
                proc.wait()
    p50 = {k: statistics.median(v) for k, v in samples.items()}
    for k, v in samples.items():
        v.sort()
        print(f"{k:6} p50 {p50[k]:.2f} ms  p90 {v[int(len(v) * 0.9)]:.2f} ms  n={len(v)}")
    print(f"B/A {p50['B'] / p50['A']:.2f}  B/bwrap {p50['B'] / p50['bwrap']:.2f}  "
          f"A/bwrap {p50['A'] / p50['bwrap']:.2f}")


if __name__ == "__main__":
    main()
