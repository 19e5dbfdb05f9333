"""A real daemon for the end-to-end tests: the `crucible` binary built by cargo
($CRUCIBLE_BIN, else target/debug/crucible) serving the image ($CRUCIBLE_IMAGE, else
target/crucible/image) on a private socket. Missing pieces fail the tests, saying how to build
them; nothing is skipped."""

import os
import pathlib
import subprocess
import tempfile
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def daemon():
    binary = pathlib.Path(os.environ.get("CRUCIBLE_BIN", ROOT / "target/debug/crucible"))
    image = pathlib.Path(os.environ.get("CRUCIBLE_IMAGE", ROOT / "target/crucible/image"))
    assert binary.is_file(), f"{binary} is missing: run `cargo build -p crucible-cli`"
    assert (image / "rootfs/init").is_file(), f"no image at {image}: run `cargo xtask build-image`"
    with tempfile.TemporaryDirectory(prefix="crucible-pytest-") as tmp:
        socket_path = os.path.join(tmp, "crucible.sock")
        env = {k: v for k, v in os.environ.items() if k not in ("CRUCIBLE_API_KEYS", "CRUCIBLE_HOST")}
        proc = subprocess.Popen(
            [str(binary), "serve", "--socket", socket_path, "--image", str(image),
             "--state-dir", os.path.join(tmp, "state"),
             "--cgroup-parent", f"crucible-pytest-{os.getpid()}"],
            env=env, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 20
        while not os.path.exists(socket_path):
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("the daemon did not start: " + proc.stderr.read().decode())
            time.sleep(0.02)
        try:
            yield socket_path
        finally:
            proc.terminate()
            proc.wait(timeout=30)
