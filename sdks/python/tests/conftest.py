"""A real daemon for the end-to-end tests: the `crucible` binary built by cargo
($CRUCIBLE_BIN, else target/debug/crucible) serving the image ($CRUCIBLE_IMAGE, else
target/crucible/image) on a private socket. Missing pieces fail the tests, saying how to build
them; nothing is skipped. Every client the tests make has timeouts, so a hung daemon fails a
test instead of hanging the run."""

import http.server
import os
import pathlib
import secrets
import socket
import subprocess
import tempfile
import threading
import time

import pytest

from crucible_sdk import Client, Sandbox

ROOT = pathlib.Path(__file__).resolve().parents[3]

# The tests must not depend on the environment they are started from: a CRUCIBLE_API_KEY or
# CRUCIBLE_HOST of the caller's would become the default of every client a test makes without
# one, and reach the daemon and the examples the tests start. Every CRUCIBLE_* variable leaves
# this process's environment before any test runs (conftest.py loads first); the two that
# configure the tests themselves are read first and kept here.
TEST_BIN = os.environ.get("CRUCIBLE_BIN") or None
TEST_IMAGE = os.environ.get("CRUCIBLE_IMAGE") or None
for _name in [name for name in os.environ if name.startswith("CRUCIBLE_")]:
    del os.environ[_name]


BLOB = bytes((i * 7919 + 13) % 251 for i in range(1 << 20))


class _BlobHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (the stdlib's name)
        if self.path != "/blob":
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(BLOB)))
        self.end_headers()
        self.wfile.write(BLOB)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="session")
def blob_server():
    """An HTTP server on the host's 127.0.0.1 serving /blob, which the daemon's operator
    rules let sandboxes reach (and nothing else)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _BlobHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


#: Seconds any JSON call, and any wait for output, may take in the tests.
TIMEOUT = 60.0
STREAM_TIMEOUT = 120.0


def image_dir() -> pathlib.Path:
    return pathlib.Path(TEST_IMAGE or ROOT / "target/crucible/image")


def make_client(daemon: str) -> Client:
    return Client(daemon, timeout=TIMEOUT, stream_timeout=STREAM_TIMEOUT)


@pytest.fixture
def client(daemon):
    with make_client(daemon) as c:
        yield c


@pytest.fixture
def sb(client):
    with Sandbox.create(client=client, labels={"suite": "pytest"}) as sandbox:
        yield sandbox


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon(str):
    """The daemon's socket path (what Client takes), with its TCP listener beside it."""

    tcp: str
    api_key: str


@pytest.fixture(scope="session")
def daemon(blob_server):
    binary = pathlib.Path(TEST_BIN or ROOT / "target/debug/crucible")
    image = image_dir()
    assert binary.is_file(), (f"{binary} is missing: run `cargo build -p crucible-cli` "
                              "or set CRUCIBLE_BIN")
    assert (image / "rootfs/init").is_file(), (f"no image at {image}: run "
                                               "`cargo xtask build-image` or set CRUCIBLE_IMAGE")
    with tempfile.TemporaryDirectory(prefix="crucible-pytest-") as tmp:
        socket_path = os.path.join(tmp, "crucible.sock")
        port = _free_port()
        key = secrets.token_hex(16)
        # No CRUCIBLE_* but its keys (the caller's are gone from os.environ, above).
        env = {k: v for k, v in os.environ.items() if not k.startswith("CRUCIBLE_")}
        env["CRUCIBLE_API_KEYS"] = f"pytest:{key}"
        log_path = os.path.join(tmp, "daemon.log")
        with open(log_path, "wb") as log:
            # A file, not a pipe: a pipe nobody reads would stall the daemon once it filled.
            proc = subprocess.Popen(
                [str(binary), "serve", "--socket", socket_path, "--image", str(image),
                 "--listen", f"127.0.0.1:{port}",
                 "--state-dir", os.path.join(tmp, "state"),
                 "--data-dir", os.path.join(tmp, "data"),
                 "--egress-allow", f"127.0.0.1:{blob_server}",
                 # A cache's default size counts whole against a budget taken from the host's
                 # free disk: a small one keeps the tests from depending on how full it is.
                 "--cache-mib", "256",
                 "--cgroup-parent", f"crucible-pytest-{os.getpid()}"],
                env=env, stdout=log, stderr=log)
        deadline = time.monotonic() + 20
        while not os.path.exists(socket_path):
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                proc.wait(timeout=10)
                raise RuntimeError("the daemon did not start: "
                                   + pathlib.Path(log_path).read_text(errors="replace"))
            time.sleep(0.02)
        handle = Daemon(socket_path)
        handle.tcp = f"http://127.0.0.1:{port}"
        handle.api_key = key
        try:
            yield handle
            leftover = make_client(socket_path).list()
            assert not leftover, f"sandboxes left behind by the tests: {[s.id for s in leftover]}"
        finally:
            proc.terminate()
            proc.wait(timeout=30)
