"""The Python client and scripts/wsexec end to end against a real daemon."""

import http.client
import io
import pathlib
import subprocess
import sys
import tarfile
import time

import pytest

from crucible_sdk import Client, CrucibleError, DecodeError

WSEXEC = pathlib.Path(__file__).resolve().parents[3] / "scripts" / "wsexec"


@pytest.fixture
def sandbox(daemon):
    client = Client(daemon)
    sb = client.create(labels={"suite": "pytest"})
    yield client, sb["id"]
    client.delete(sb["id"])


def test_exec_collects_output_and_result(sandbox):
    client, sid = sandbox
    out = client.exec(sid, ["sh", "-c", "echo hi; echo err >&2; exit 3"], env={"A": "1"})
    assert out.stdout == b"hi\n"
    assert out.stderr == b"err\n"
    assert out.exit_code == 3
    assert out.result["usage"] is not None


def test_exec_stream_yields_events_then_exit(sandbox):
    client, sid = sandbox
    events = list(client.exec_stream(sid, ["sh", "-c", "head -c 200000 /dev/zero"]))
    assert events[-1][0] == "exit"
    assert sum(len(v) for k, v in events if k == "stdout") == 200000


def test_exec_options_signal_by_exec_id_and_stats(sandbox):
    client, sid = sandbox
    out = client.exec(sid, ["sh", "-c", "id -u; id -G; ulimit -n"], user="4321:4321",
                      group_add=["99"],
                      rlimits=[{"type": "RLIMIT_NOFILE", "soft": 77, "hard": 77}])
    assert (out.stdout, out.exit_code) == (b"4321\n4321 99\n77\n", 0), out.result
    with pytest.raises(TypeError):
        client.exec(sid, ["true"], users="x")
    # A named command, signalled alone while it runs.
    session = client.interactive(sid, ["sh", "-c", "echo up; exec sleep 1000"], exec_id="py-step")
    with session:
        events = session.events()
        assert next(events) == ("stdout", b"up\n")
        client.signal(sid, 15, exec_id="py-step")
        kind, result = [e for e in events][-1]
        assert kind == "exit" and result["signal"] == "SIGTERM", result
    with pytest.raises(CrucibleError) as gone:
        client.signal(sid, 15, exec_id="py-step")
    assert gone.value.status == 404
    stats = client.stats(sid)
    assert stats["pids"]["current"] >= 1


def test_a_command_outlives_its_client_and_attach_collects_the_rest(sandbox):
    client, sid = sandbox
    script = "echo first; while [ ! -e /tmp/go ]; do sleep 0.02; done; echo second; exit 6"
    events = client.exec_stream(sid, ["sh", "-c", script], exec_id="py-keep")
    assert next(events) == ("stdout", b"first\n")
    events.close()  # the client goes away; the command runs on
    for _ in range(200):
        status = client.exec_status(sid, "py-keep")
        if not status["attached"]:
            break
        time.sleep(0.02)
    assert status["state"] == "running" and status["keep"], status
    assert any(e["exec_id"] == "py-keep" for e in client.execs(sid))
    client.exec(sid, ["touch", "/tmp/go"])
    out = client.attach(sid, "py-keep", offset=len(b"first\n"))
    assert (out.stdout, out.exit_code, out.exec_id) == (b"second\n", 6, "py-keep"), out
    assert out.result.get("output_dropped_bytes", 0) == 0
    with pytest.raises(CrucibleError) as gone:
        client.attach(sid, "py-keep")
    assert (gone.value.status, gone.value.code) == (404, "exec_not_found")
    named = client.exec(sid, ["true"])
    assert named.exec_id.startswith("ex-"), named


def _cutting_proxy(upstream: str, path: str, cut: int) -> None:
    """A Unix-socket proxy to `upstream` that cuts its first connection after `cut` bytes of
    the daemon's answer (a network blip mid-stream) and passes later ones through."""
    import socket
    import threading

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(8)

    def pipe(src, dst, limit):
        try:
            while limit > 0:
                data = src.recv(min(65536, limit))
                if not data:
                    break
                dst.sendall(data)
                limit -= len(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def serve():
        n = 0
        while True:
            client, _ = listener.accept()
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.connect(upstream)
            threading.Thread(target=pipe, args=(client, server, 1 << 62), daemon=True).start()
            limit = cut if n == 0 else 1 << 62
            threading.Thread(target=pipe, args=(server, client, limit), daemon=True).start()
            n += 1

    threading.Thread(target=serve, daemon=True).start()


def test_exec_re_attaches_when_its_connection_breaks_mid_stream(daemon, sandbox, tmp_path):
    _, sid = sandbox
    proxy = str(tmp_path / "proxy.sock")
    _cutting_proxy(daemon, proxy, 600)
    client = Client(proxy)
    script = "for i in $(seq 1 300); do echo line$i; sleep 0.002; done; exit 3"
    out = client.exec(sid, ["sh", "-c", script])
    assert out.stdout == "".join(f"line{i}\n" for i in range(1, 301)).encode()
    assert out.exit_code == 3, out.result
    # Without resumes the break is the caller's to see.
    _cutting_proxy(daemon, str(tmp_path / "proxy2.sock"), 600)
    with pytest.raises((OSError, DecodeError, http.client.HTTPException)):
        Client(str(tmp_path / "proxy2.sock")).exec(sid, ["sh", "-c", script], resumes=0)


def test_interactive_session(sandbox):
    client, sid = sandbox
    with client.interactive(sid, ["sh"]) as session:
        session.send_stdin(b"cd /tmp\necho $PWD\n")
        session.close_stdin()
        events = list(session.events())
    assert b"".join(v for k, v in events if k == "stdout") == b"/tmp\n"
    assert events[-1] == ("exit", events[-1][1]) and events[-1][1]["exit_code"] == 0


def test_files_round_trip(sandbox, tmp_path):
    client, sid = sandbox
    (tmp_path / "tree" / "sub").mkdir(parents=True)
    (tmp_path / "tree" / "sub" / "data.bin").write_bytes(bytes(range(256)) * 1000)
    result = client.put_files(sid, "/work", tmp_path / "tree")
    assert result["files"] == 1
    assert client.get_file(sid, "/work/tree/sub/data.bin") == bytes(range(256)) * 1000


def test_refused_tar_entry_is_an_error(sandbox):
    client, sid = sandbox
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("../escape")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(CrucibleError) as raised:
        client.put_files(sid, "/work", buf.getvalue())
    assert raised.value.status == 400
    assert raised.value.code == "refused_entry"


def test_errors_carry_the_envelope(daemon):
    client = Client(daemon)
    with pytest.raises(CrucibleError) as raised:
        client.get("sb-0123456789abcdef")
    assert (raised.value.status, raised.value.code) == (404, "not_found")
    with pytest.raises(CrucibleError) as raised:
        Client("/nonexistent.sock").list()
    assert raised.value.status == 0


def run_wsexec(daemon, *args, stdin=b""):
    return subprocess.run([sys.executable, str(WSEXEC), "--host", daemon, *args],
                          input=stdin, capture_output=True, timeout=60)


def test_wsexec_runs_a_command_and_exits_with_its_code(daemon, sandbox):
    _, sid = sandbox
    done = run_wsexec(daemon, sid, "--", "sh", "-c", "echo out; echo err >&2; exit 7")
    assert done.stdout == b"out\n"
    assert done.stderr == b"err\n"
    assert done.returncode == 7


def test_wsexec_forwards_stdin(daemon, sandbox):
    _, sid = sandbox
    done = run_wsexec(daemon, "--stdin", sid, "--", "sh", stdin=b"cd /tmp\npwd\n")
    assert done.stdout == b"/tmp\n"
    assert done.returncode == 0


def test_wsexec_reports_refusals(daemon, sandbox):
    _, sid = sandbox
    assert run_wsexec(daemon, "sb-0123456789abcdef", "--", "true").returncode == 125
    done = run_wsexec(daemon, "--timeout", "1", sid, "--", "sleep", "30")
    assert done.returncode == 124


def test_egress_and_a_cache_through_the_sdk(daemon, blob_server):
    import hashlib

    from conftest import BLOB

    client = Client(daemon)
    sb = client.create(allow=[f"127.0.0.1:{blob_server}"],
                       caches=[{"name": "pytest-pip", "path": "/root/.cache/pip", "size_mib": 64}])
    try:
        out = client.exec(sb["id"], ["sh", "-c",
                                     f"wget -q -O /root/.cache/pip/blob http://127.0.0.1:{blob_server}/blob"
                                     " && sha256sum /root/.cache/pip/blob"])
        assert out.exit_code == 0, out.stderr
        assert hashlib.sha256(BLOB).hexdigest() in out.stdout.decode()
        denied = client.exec(sb["id"], ["sh", "-c", "wget -q -O- http://example.com/ 2>&1"])
        assert denied.exit_code != 0
        assert b"403" in denied.stdout
        assert client.get(sb["id"])["network"]["connections"] == 1
        with pytest.raises(CrucibleError) as busy:
            client.delete_cache("pytest-pip")
        assert busy.value.status == 409
    finally:
        client.delete(sb["id"])
    [cache] = [c for c in client.caches() if c["name"] == "pytest-pip"]
    assert cache["size_mib"] == 64 and "in_use_by" not in cache
    client.delete_cache("pytest-pip")
    assert not [c for c in client.caches() if c["name"] == "pytest-pip"]


def test_an_imported_rootfs_image_runs_with_its_files(daemon):
    """A rootfs tarball made here from the built image's busybox tree, plus one file."""
    from conftest import ROOT

    rootfs = ROOT / "target/crucible/image/rootfs"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(str(rootfs), arcname=".")
        marker = tarfile.TarInfo("etc/from-python")
        marker.size = 7
        tar.addfile(marker, io.BytesIO(b"python\n"))
    client = Client(daemon)
    info = client.import_image("pytest-rootfs", buf.getvalue())
    assert info["format"] == "rootfs" and len(info["layers"]) == 1
    assert "pytest-rootfs" in [i["name"] for i in client.images()]
    sb = client.create(image="pytest-rootfs")
    try:
        out = client.exec(sb["id"], ["cat", "/etc/from-python"])
        assert out.exit_code == 0 and out.stdout == b"python\n", out.stderr
        with pytest.raises(CrucibleError) as busy:
            client.delete_image("pytest-rootfs")
        assert busy.value.status == 409
        assert client.prune_images(prefix="pytest-")["removed"] == [], "in use: kept"
    finally:
        client.delete(sb["id"])
    assert client.prune_images(unused_for_s=3600, prefix="pytest-")["removed"] == []
    client.import_image("pytest-other", buf.getvalue())
    pruned = client.prune_images(prefix="pytest-o")
    assert pruned["removed"] == ["pytest-other"], pruned
    with pytest.raises(CrucibleError) as bad:
        client.prune_images(unused_for_s=10**12)
    assert bad.value.status == 400 and "unused_for_s" in str(bad.value)
    client.delete_image("pytest-rootfs")
    with pytest.raises(CrucibleError) as gone:
        client.image("pytest-rootfs")
    assert gone.value.status == 404
    with pytest.raises(CrucibleError) as bad:
        client.import_image("pytest-bad", b"not an image archive" * 100)
    assert bad.value.status == 400 and bad.value.code == "invalid_image"
