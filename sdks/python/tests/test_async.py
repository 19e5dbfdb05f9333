"""AsyncSandbox end to end: the blocking suite's checks on asyncio (no pytest plugin: each
test runs its own event loop)."""

import asyncio
import hashlib

import pytest
from conftest import BLOB, STREAM_TIMEOUT, TIMEOUT

from crucible_sdk import (AsyncClient, AsyncSandbox, CacheMount, Conflict, ConnectionFailed,
                          EgressNotAllowed, ExecNotFound, Exit, FileNotFound, InvalidRequest,
                          SandboxNotFound, Stdout, Unauthorized)

SIZE = 64 * 1024 * 1024


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 300))


def aclient(daemon, **kw):
    return AsyncClient(str(daemon), timeout=TIMEOUT, stream_timeout=STREAM_TIMEOUT, **kw)


def test_create_with_a_cache_and_a_network(daemon, blob_server):
    url = f"http://127.0.0.1:{blob_server}/blob"
    cache = CacheMount(name="pytest-async", path="/cache", size_mib=32)

    async def main():
        async with aclient(daemon) as client:
            async with AsyncSandbox.create(client=client, network=[f"127.0.0.1:{blob_server}"],
                                           caches=[cache], memory_mib=256) as sb:
                assert sb.info.memory_mib == 256
                out = await sb.run(f"wget -q -O- {url} | tee /cache/blob | sha256sum")
                assert out.exit_code == 0, out.stderr
                assert hashlib.sha256(BLOB).hexdigest() in out.stdout_text
                info = await sb.refresh()
                assert info.network is not None and info.network.connections == 1
                with pytest.raises(Conflict):
                    await client.delete_cache("pytest-async")
            async with AsyncSandbox.create(client=client, caches=[cache]) as again:
                kept = await again.run("cat /cache/blob")
                assert kept.stdout == BLOB
            await client.delete_cache("pytest-async")
            assert not [c for c in await client.caches() if c.name == "pytest-async"]

    run(main())


def test_64_mib_of_stdout_arrives_intact(daemon):
    async def main():
        async with aclient(daemon) as client, AsyncSandbox.create(client=client) as sb:
            made = await sb.run(f"head -c {SIZE} /dev/urandom > /tmp/big && sha256sum /tmp/big",
                                check=True)
            want = made.stdout_text.split()[0]
            result = await sb.run(["cat", "/tmp/big"])
            assert len(result.stdout) == SIZE
            assert hashlib.sha256(result.stdout).hexdigest() == want
            digest, total = hashlib.sha256(), 0
            async for event in sb.stream(["cat", "/tmp/big"]):
                if isinstance(event, Stdout):
                    digest.update(event.data)
                    total += len(event.data)
                else:
                    assert isinstance(event, Exit) and event.result.exit_code == 0
            assert (total, digest.hexdigest()) == (SIZE, want)

    run(main())


@pytest.mark.parametrize("transport", ["hijack", "websocket"])
def test_interactive_echo(daemon, transport):
    async def main():
        async with aclient(daemon) as client, AsyncSandbox.create(client=client) as sb:
            async with sb.interactive(["cat"], transport=transport) as session:
                got = b""
                for line in (b"one\n", b"two\n"):
                    await session.send(line)
                    while not got.endswith(line):
                        event = await session.__anext__()
                        assert isinstance(event, Stdout), event
                        got += event.data
                await session.send(b"y" * 150_000)
                await session.close_stdin()
                result = await session.wait()
            assert got == b"one\ntwo\n"
            assert result.stdout == b"y" * 150_000 and result.exit_code == 0
            with pytest.raises(InvalidRequest):
                async with sb.interactive(["true"], env={"A=B": "1"},
                                          transport=transport) as bad:
                    await bad.wait()

    run(main())


@pytest.mark.parametrize("transport", ["hijack", "websocket"])
def test_interactive_tty_resizes(daemon, transport):
    async def read_until(session, needle):
        got = b""
        while needle not in got:
            event = await session.__anext__()
            assert isinstance(event, Stdout), (event, got)
            got += event.data
        return got

    async def main():
        async with aclient(daemon) as client, AsyncSandbox.create(client=client) as sb:
            one_shot = await sb.run("tty; stty size", tty=True, tty_size=(30, 100))
            assert one_shot.stdout.startswith(b"/dev/pts/"), one_shot.stdout
            assert one_shot.stdout.endswith(b"\r\n30 100\r\n"), one_shot.stdout
            async with sb.interactive(["sh"], transport=transport, tty=True,
                                      tty_size=(40, 120)) as session:
                await session.send("stty size\r")
                await read_until(session, b"40 120\r\n")
                await session.resize(50, 132)
                await session.send("stty size\r")
                await read_until(session, b"50 132\r\n")
                await session.send("exit\r")
                result = await session.wait()
            assert result.exit_code == 0, result

    run(main())


def test_files_round_trip(daemon, tmp_path):
    tree = tmp_path / "tree"
    (tree / "d").mkdir(parents=True)
    (tree / "d" / "f.bin").write_bytes(bytes(range(256)) * 3000)

    async def main():
        async with aclient(daemon) as client, AsyncSandbox.create(client=client) as sb:
            await sb.files.write("/w/note.txt", "note\n")
            assert await sb.files.read_text("/w/note.txt") == "note\n"
            put = await sb.files.upload_dir(tree, "/w/tree")
            assert put.files == 1
            assert await sb.files.read("/w/tree/d/f.bin") == bytes(range(256)) * 3000
            back = await sb.files.download("/w/tree", tmp_path / "back")
            assert (back / "d" / "f.bin").read_bytes() == bytes(range(256)) * 3000
            (await sb.run("chmod 6750 /w/tree/d/f.bin && touch -d @1600000000 /w/tree/d/f.bin")).check()
            one = await sb.files.download("/w/tree/d/f.bin", tmp_path / "one.bin")
            assert (oct(one.stat().st_mode & 0o7777), int(one.stat().st_mtime)) == \
                ("0o750", 1600000000)
            with pytest.raises(FileNotFound):
                await sb.files.read("/w/missing")

    run(main())


def test_errors_map_to_their_classes(daemon):
    async def main():
        async with aclient(daemon) as client:
            with pytest.raises(SandboxNotFound):
                await AsyncSandbox.connect("sb-0123456789abcdef", client=client)
            with pytest.raises(EgressNotAllowed):
                await AsyncSandbox.create(client=client, network=["pypi.org:443"])
            async with AsyncSandbox.create(client=client) as sb:
                with pytest.raises(InvalidRequest):
                    await sb.run(["true"], env={"A=B": "1"})
                with pytest.raises(ExecNotFound):
                    await sb.attach("never-ran")
                with pytest.raises(ExecNotFound):
                    await sb.signal(15, exec_id="never-ran")
        async with AsyncClient(daemon.tcp, timeout=TIMEOUT) as anonymous:
            with pytest.raises(Unauthorized):
                await anonymous.list()
        async with AsyncClient("/nonexistent.sock", timeout=5) as nowhere:
            with pytest.raises(ConnectionFailed):
                await nowhere.health()

    run(main())


def test_context_manager_deletes_the_sandbox(daemon):
    async def main():
        async with aclient(daemon) as client:
            async with AsyncSandbox.create(client=client) as sb:
                sid = sb.id
            with pytest.raises(SandboxNotFound):
                await client.get(sid)
            with pytest.raises(RuntimeError):
                async with AsyncSandbox.create(client=client) as sb:
                    sid = sb.id
                    raise RuntimeError("boom")
            with pytest.raises(SandboxNotFound):
                await client.get(sid)
            made = await AsyncSandbox.create(client=client)
            await made.aclose()
            with pytest.raises(SandboxNotFound):
                await client.get(made.id)

    run(main())


def test_concurrent_commands_and_keyed_tcp(daemon):
    async def main():
        async with AsyncClient(daemon.tcp, api_key=daemon.api_key, timeout=TIMEOUT,
                               stream_timeout=STREAM_TIMEOUT) as client:
            async with AsyncSandbox.create(client=client) as sb:
                results = await asyncio.gather(*[sb.run(["echo", str(i)]) for i in range(32)])
                assert [r.stdout for r in results] == [f"{i}\n".encode() for i in range(32)]
                assert sb.info.owner == "pytest"
                script = "echo first; while [ ! -e /tmp/go ]; do sleep 0.02; done; echo end"
                stream = await client.exec(sb.id, _request(script, exec_id="a-keep"))
                assert await stream.__anext__() == Stdout(b"first\n")
                await stream.aclose()
                for _ in range(250):  # until the daemon has seen the connection go
                    if not (await sb.exec_status("a-keep")).attached:
                        break
                    await asyncio.sleep(0.02)
                await sb.run(["touch", "/tmp/go"])
                rest = await sb.attach("a-keep", offset=len(b"first\n"))
                assert rest.stdout == b"end\n" and rest.exec_id == "a-keep"

    run(main())


def _request(cmd, **kw):
    from crucible_sdk import _api
    return _api.exec_request(cmd, **kw)
