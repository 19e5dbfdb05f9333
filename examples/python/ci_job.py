#!/usr/bin/env python3
"""A CI job in a crucible sandbox: check out a local tree, upload it, build and test it with a
cache, stream the logs, and exit non-zero when a step fails.

    python3 examples/python/ci_job.py ./my-repo --ref HEAD \
        --build 'sh ci/build.sh' --test 'sh ci/test.sh' --cache ci-cache:/cache

The daemon is $CRUCIBLE_HOST (default: the local socket). A git repository is checked out at
--ref (so uncommitted changes do not leak into the build); any other directory is uploaded as
it is. Each step runs in /src with $CACHE_DIR pointing at the cache, which outlives the
sandbox: the next job's build finds what this one left there.
"""

from __future__ import annotations

import argparse
import pathlib
import subprocess
import sys
import tarfile
import tempfile
import time

from crucible_sdk import CacheMount, CrucibleError, Sandbox


def checkout(source: pathlib.Path, ref: str, into: pathlib.Path) -> pathlib.Path:
    """The tree to upload: `ref` of a git repository, or the directory itself."""
    if not (source / ".git").exists():
        return source
    archive = into / "checkout.tar"
    with open(archive, "wb") as out:
        subprocess.run(["git", "-C", str(source), "archive", "--format=tar", ref],
                       stdout=out, check=True)
    tree = into / "tree"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    return tree


def main() -> int:
    parser = argparse.ArgumentParser(description="Build and test a tree in a sandbox.")
    parser.add_argument("source", type=pathlib.Path, help="a local directory or git repository")
    parser.add_argument("--ref", default="HEAD", help="what to check out of a git repository")
    parser.add_argument("--build", default="sh ci/build.sh", help="the build step (sh -c)")
    parser.add_argument("--test", default="sh ci/test.sh", help="the test step (sh -c)")
    parser.add_argument("--cache", default="ci-cache:/cache", metavar="NAME:PATH")
    parser.add_argument("--image", default=None)
    parser.add_argument("--memory-mib", type=int, default=1024)
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per step")
    args = parser.parse_args()

    name, _, path = args.cache.partition(":")
    if not name or not path.startswith("/"):
        parser.error("--cache takes NAME:/absolute/path")

    def log(data: bytes) -> None:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()

    def log_err(data: bytes) -> None:
        sys.stderr.buffer.write(data)
        sys.stderr.buffer.flush()

    with tempfile.TemporaryDirectory(prefix="ci-job-") as tmp:
        tree = checkout(args.source, args.ref, pathlib.Path(tmp))
        try:
            with Sandbox.create(image=args.image, memory_mib=args.memory_mib,
                                caches=[CacheMount(name=name, path=path)],
                                env={"CACHE_DIR": path, "CI": "true"},
                                labels={"job": "ci_job.py"}) as sb:
                put = sb.files.upload_dir(tree, "/src")
                print(f"==> sandbox {sb.id}: uploaded {put.files} files "
                      f"({put.bytes} bytes) to /src", flush=True)
                for step, command in (("build", args.build), ("test", args.test)):
                    print(f"==> {step}: {command}", flush=True)
                    started = time.monotonic()
                    result = sb.run(command, cwd="/src", timeout=args.timeout,
                                    on_stdout=log, on_stderr=log_err)
                    took = time.monotonic() - started
                    if not result.ok:
                        print(f"==> {step} {result.describe()} after {took:.1f} s",
                              file=sys.stderr, flush=True)
                        return result.exit_code if result.exit_code > 0 else 1
                    print(f"==> {step} passed in {took:.1f} s", flush=True)
        except CrucibleError as e:
            print(f"==> crucible: {e}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
