"""A real daemon for the end-to-end tests: the `crucible` binary built by cargo
($CRUCIBLE_BIN, else target/debug/crucible) serving the image ($CRUCIBLE_IMAGE, else
target/crucible/image) on a private socket. Missing pieces fail the tests, saying how to build
them; nothing is skipped."""

import http.server
import os
import pathlib
import subprocess
import tempfile
import threading
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]


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


@pytest.fixture(scope="session")
def daemon(blob_server):
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
             "--data-dir", os.path.join(tmp, "data"),
             "--egress-allow", f"127.0.0.1:{blob_server}",
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
