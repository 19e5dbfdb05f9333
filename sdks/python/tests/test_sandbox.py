"""Sandbox end to end (blocking): big streams, interactive echo on both transports, files,
error classes, cleanup, TCP with a key."""

import hashlib

import pytest
from conftest import make_client

from crucible_sdk import (CacheMount, Client, CommandFailed, ConnectionLost, CrucibleError,
                          EgressNotAllowed, ExecNotFound, Exit, FileNotFound, InvalidRequest,
                          IsADirectory, Sandbox, SandboxNotFound, Stderr, Stdout, Unauthorized)

SIZE = 64 * 1024 * 1024
# Random bytes written to a file first, so that the guest's hash and ours cover the same data.
MAKE_BLOB = f"head -c {SIZE} /dev/urandom > /tmp/big && sha256sum /tmp/big"


def test_64_mib_of_stdout_arrives_intact(sb):
    made = sb.run(MAKE_BLOB, check=True)
    want = made.stdout_text.split()[0]
    digest = hashlib.sha256()
    seen = []
    result = sb.run(["cat", "/tmp/big"], on_stdout=lambda b: (digest.update(b), seen.append(len(b))))
    assert result.exit_code == 0
    assert len(result.stdout) == SIZE and sum(seen) == SIZE
    assert hashlib.sha256(result.stdout).hexdigest() == want == digest.hexdigest()
    # The iterator sees the same bytes, without the SDK keeping them.
    streamed = hashlib.sha256()
    total = 0
    with sb.stream(["cat", "/tmp/big"]) as stream:
        for event in stream:
            if isinstance(event, Stdout):
                streamed.update(event.data)
                total += len(event.data)
    assert (total, streamed.hexdigest()) == (SIZE, want)
    assert stream.result is not None and stream.result.exit_code == 0


def test_stream_interleaves_stdout_and_stderr_and_ends_with_exit(sb):
    events = list(sb.stream("echo out; echo err >&2; exit 4"))
    assert Stdout(b"out\n") in events and Stderr(b"err\n") in events
    assert isinstance(events[-1], Exit) and events[-1].result.exit_code == 4
    assert sum(isinstance(e, Exit) for e in events) == 1


@pytest.mark.parametrize("transport", ["hijack", "websocket"])
def test_interactive_echo(sb, transport):
    with sb.interactive(["cat"], transport=transport) as session:
        got = b""
        for line in (b"one\n", b"two\n", "three\n"):
            session.send(line)
            want = line if isinstance(line, bytes) else line.encode()
            while not got.endswith(want):
                event = next(session)
                assert isinstance(event, Stdout), event
                got += event.data
        session.send(b"x" * 200_000)  # several stdin frames
        session.close_stdin()
        result = session.wait()
    assert got == b"one\ntwo\nthree\n"
    assert result.stdout == b"x" * 200_000 and result.exit_code == 0, result


@pytest.mark.parametrize("transport", ["hijack", "websocket"])
def test_interactive_refusals_are_typed(sb, transport):
    with pytest.raises(InvalidRequest) as bad:
        sb.interactive(["true"], env={"A=B": "1"}, transport=transport).wait()
    assert "env" in bad.value.message
    with pytest.raises(SandboxNotFound):
        sb.client.interactive("sb-0123456789abcdef", _request(["true"]), transport)


def test_tty_one_shot_runs_on_a_sized_terminal(sb):
    r = sb.run("tty; stty size; echo to-stderr >&2", tty=True, tty_size=(30, 100))
    assert r.exit_code == 0, r
    lines = r.stdout.split(b"\r\n")  # the terminal's line endings
    assert lines[0].startswith(b"/dev/pts/"), r.stdout
    assert lines[1:] == [b"30 100", b"to-stderr", b""], r.stdout
    assert r.stderr == b"", "a terminal merges stderr into stdout"
    # The default size; and stream() takes the same options.
    events = list(sb.stream(["stty", "size"], tty=True))
    assert b"".join(e.data for e in events if isinstance(e, Stdout)) == b"24 80\r\n"
    assert isinstance(events[-1], Exit) and events[-1].result.exit_code == 0
    # Without tty, no terminal.
    assert sb.run("tty").stdout.strip() == b"not a tty"


def _read_until(session, needle):
    got = b""
    while needle not in got:
        event = next(session)
        assert isinstance(event, Stdout), (event, got)
        got += event.data
    return got


@pytest.mark.parametrize("transport", ["hijack", "websocket"])
def test_interactive_tty_resizes(sb, transport):
    with sb.interactive(["sh"], transport=transport, tty=True) as session:
        assert session.tty
        session.send("stty size\r")
        before = _read_until(session, b"24 80\r\n")
        session.resize(50, 132)
        session.send("stty size\r")
        after = _read_until(session, b"50 132\r\n")
        session.send("exit\r")
        result = session.wait()
    assert b"stty size" in before, before  # the terminal echoes what is typed
    assert result.exit_code == 0, (before, after, result)
    assert result.stderr == b""
    with sb.interactive(["cat"], transport=transport) as plain:
        with pytest.raises(ValueError, match="tty=True"):
            plain.resize(50, 132)
        plain.send("still here\n")
        plain.close_stdin()
        assert plain.wait().stdout == b"still here\n"


def test_close_stdin_on_a_terminal_types_its_end_of_file(sb):
    with sb.interactive(["cat"], tty=True) as session:
        session.send("typed\r")
        session.close_stdin()
        result = session.wait()
    assert result.exit_code == 0, result
    assert result.stdout.count(b"typed\r\n") == 2, result.stdout  # the echo, then cat's copy


def test_tty_size_without_tty_is_refused_before_sending(sb):
    with pytest.raises(ValueError, match="tty_size"):
        sb.run(["true"], tty_size=(30, 100))


def _request(cmd):
    from crucible_sdk import _api
    return _api.exec_request(cmd)


def test_files_write_read_upload_download(sb, tmp_path):
    assert sb.files.write("/work/a/b.txt", "héllo\n").written == ["b.txt"]
    assert sb.files.read_text("/work/a/b.txt") == "héllo\n"
    assert sb.run("stat -c %a /work/a/b.txt").stdout == b"644\n"
    sb.files.write("/work/run.sh", b"#!/bin/sh\necho ran\n", mode=0o755)
    assert sb.run("/work/run.sh").stdout == b"ran\n"
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "top.txt").write_text("top\n")
    (tree / "sub" / "data.bin").write_bytes(bytes(range(256)) * 4096)
    put = sb.files.upload_dir(tree, "/work/tree")
    assert (put.files, put.dirs) == (2, 1), put
    assert sb.files.read("/work/tree/sub/data.bin") == bytes(range(256)) * 4096
    single = sb.files.download("/work/tree/top.txt", tmp_path / "out" / "top.txt")
    assert single.read_text() == "top\n"
    back = sb.files.download("/work/tree", tmp_path / "back")
    assert (back / "sub" / "data.bin").read_bytes() == bytes(range(256)) * 4096
    assert (back / "top.txt").read_text() == "top\n"
    with pytest.raises(FileNotFound) as missing:
        sb.files.read("/work/nope")
    assert missing.value.status == 404
    with pytest.raises(IsADirectory):
        sb.files.read("/work/tree")


def test_a_download_keeps_mode_and_time_but_never_setuid(client, sb, tmp_path):
    sb.run("mkdir -p /work && printf x > /work/tool && chmod 4755 /work/tool && touch -d @1700000000 /work/tool"
           " && printf y > /work/notes && chmod 600 /work/notes").check()
    tool = sb.files.download("/work/tool", tmp_path / "tool")
    assert (oct(tool.stat().st_mode & 0o7777), int(tool.stat().st_mtime)) == ("0o755", 1700000000)
    notes = sb.files.download("/work/notes", tmp_path / "notes")
    assert oct(notes.stat().st_mode & 0o7777) == "0o600"
    with open(tmp_path / "raw", "wb") as out:
        meta = client.get_file_meta_to(sb.id, "/work/tool", out)
    assert (meta.size, meta.mode, meta.modified) == (1, 0o4755, 1700000000.0)


def test_errors_map_to_their_classes(client, sb, blob_server):
    with pytest.raises(SandboxNotFound):
        Sandbox.connect("sb-0123456789abcdef", client=client)
    with pytest.raises(InvalidRequest) as bad:
        sb.run(["true"], env={"A=B": "1"})
    assert (bad.value.status, bad.value.code) == (400, "invalid_request")
    with pytest.raises(InvalidRequest):
        client.get("not-an-id")
    with pytest.raises(EgressNotAllowed) as egress:
        Sandbox.create(client=client, network=["pypi.org:443"])
    assert (egress.value.status, egress.value.code) == (403, "egress_not_allowed")
    with pytest.raises(ExecNotFound):
        sb.exec_status("never-ran")
    with pytest.raises(CommandFailed) as failed:
        sb.run("exit 9", check=True)
    assert failed.value.result.exit_code == 9 and "exited with 9" in str(failed.value)
    timed = sb.run(["sleep", "30"], timeout=1)
    assert timed.timed_out and not timed.ok and timed.describe() == "timed out"
    # Bad input fails before anything is sent.
    with pytest.raises(TypeError):
        sb.run(b"true")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        sb.run(["true"], timeout=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        sb.run(["true"], cwd="relative")
    with pytest.raises(TypeError):
        Sandbox.create(client=client, network="pypi.org")  # type: ignore[arg-type]


def test_context_manager_deletes_the_sandbox_even_on_error(client):
    with Sandbox.create(client=client) as sb:
        sid = sb.id
        assert client.get(sid).state == "running"
    with pytest.raises(SandboxNotFound):
        client.get(sid)
    with pytest.raises(RuntimeError):
        with Sandbox.create(client=client) as sb:
            sid = sb.id
            raise RuntimeError("the job failed")
    with pytest.raises(SandboxNotFound):
        client.get(sid)
    # connect() leaves the sandbox alone.
    made = Sandbox.create(client=client)
    with Sandbox.connect(made.id, client=client) as found:
        assert found.run("echo found").stdout == b"found\n"
    assert client.get(made.id).id == made.id
    made.close()
    with pytest.raises(SandboxNotFound):
        client.get(made.id)


def test_json_calls_reuse_one_connection(client, sb):
    for _ in range(20):
        sb.run(["true"])
        sb.refresh()
    assert len(client._pool._idle) == 1


def test_tcp_needs_the_key(daemon):
    with Client(daemon.tcp, timeout=30) as anonymous:
        with pytest.raises(Unauthorized) as refused:
            anonymous.list()
        assert refused.value.status == 401
    with Client(daemon.tcp, api_key="wrong", timeout=30) as wrong:
        with pytest.raises(Unauthorized):
            wrong.create()
    with Client(daemon.tcp, api_key=daemon.api_key, timeout=30, stream_timeout=60) as keyed:
        with Sandbox.create(client=keyed) as sb:
            assert sb.info.owner == "pytest"
            assert sb.run("echo tcp").stdout == b"tcp\n"
            with sb.interactive(["cat"]) as session:
                session.send("over tcp\n")
                session.close_stdin()
                assert session.wait().stdout == b"over tcp\n"
            with sb.interactive(["cat"], transport="websocket") as session:
                session.send("ws over tcp\n")
                session.close_stdin()
                assert session.wait().stdout == b"ws over tcp\n"
        # Another key's (the socket's) sandboxes do not exist for this key.
        with make_client(str(daemon)) as local, Sandbox.create(client=local) as theirs:
            with pytest.raises(SandboxNotFound):
                keyed.get(theirs.id)


def test_a_stream_timeout_is_an_error_not_a_hang(daemon, sb):
    with Client(str(daemon), timeout=30, stream_timeout=0.5) as impatient:
        with pytest.raises(CrucibleError) as slow:
            Sandbox.connect(sb.id, client=impatient).run("sleep 3", on_disconnect="kill")
        assert slow.value.code == "timeout" and not isinstance(slow.value, ConnectionLost)


def test_pool_status_without_a_pool(client):
    status = client.pool()
    assert status.shapes == [] and status.hit_rate == 0.0
    assert client.health()["status"] == "ok"


def test_a_cache_is_shared_on_copies_and_the_first_to_end_saves_it(client):
    cache = CacheMount(name="pytest-shared", path="/cache")
    with Sandbox.create(client=client, caches=[cache]) as first:
        first.run(["sh", "-c", "echo first > /cache/who"])
        with Sandbox.create(client=client, caches=[cache]) as second:
            # A copy as last saved: not what the first is writing.
            seen = second.run(["sh", "-c", "cat /cache/who 2>/dev/null || echo nothing"])
            assert seen.stdout_text == "nothing\n"
            second.run(["sh", "-c", "echo second > /cache/who"])
            listed = [c for c in client.caches() if c.name == "pytest-shared"]
            assert listed[0].users == [first.id, second.id]
            with pytest.raises(CrucibleError) as busy:
                client.delete_cache("pytest-shared")
            assert busy.value.status == 409
        # The second ended first: its copy is the cache; the first's writes are dropped.
    with Sandbox.create(client=client, caches=[cache]) as after:
        assert after.run(["cat", "/cache/who"]).stdout_text == "second\n"
    client.delete_cache("pytest-shared")
