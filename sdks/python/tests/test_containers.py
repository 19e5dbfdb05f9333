"""Containers in a sandbox through the SDK, blocking and asyncio: a service reached on
localhost from the sandbox's own root, commands, files, stats and signals addressed to a
container, its log after the fact, and the typed errors of a container that is missing or
never gets ready."""

import asyncio
import time

import pytest
from conftest import STREAM_TIMEOUT, TIMEOUT

from crucible_sdk import (AsyncClient, AsyncSandbox, Conflict, ContainerNotFound,
                          ContainerNotReady, ContainerRequest, ReadyCheck, Sandbox,
                          SharedMount)

SERVICE = ContainerRequest(
    name="svc",
    command=["/bin/sh", "-c",
             "echo svc up; echo svc warn >&2; while true; do echo pong | nc -l -p 7000; done"],
    ready=ReadyCheck(tcp_port=7000),
    shared=[SharedMount(name="work", path="/data")],
)
SHARED = [SharedMount(name="work", path="/work")]


def test_a_service_a_shared_dir_and_commands_in_a_container(client):
    with Sandbox.create(client=client, containers=[SERVICE], shared=SHARED) as sb:
        assert [c.name for c in sb.info.containers] == ["svc"]
        assert [c.state for c in sb.containers()] == ["ready"]
        # The sandbox's own root reaches the service on localhost.
        reply = sb.run("nc 127.0.0.1 7000 < /dev/null", check=True)
        assert reply.stdout_text == "pong\n"

        svc = sb.container("svc")
        assert svc.info().state == "ready"
        # A command runs in the container's own root; the shared directory is one.
        ran = svc.run("test -e /data && echo in-svc > /data/note && hostname", check=True)
        assert ran.stdout_text.strip() == sb.id
        assert sb.files.read_text("/work/note") == "in-svc\n"
        svc.files.write("/tmp/only-here", "svc's own\n")
        assert svc.files.read_text("/tmp/only-here") == "svc's own\n"
        assert sb.run("test -e /tmp/only-here").exit_code == 1

        # Its stats are its own processes, under the sandbox's limits.
        own = svc.stats()
        whole = sb.stats()
        assert own.pids.current >= 2
        assert own.memory.limit_bytes == whole.memory.limit_bytes > 0

        # A named command in the container, found and signalled there.
        stream = svc.stream("sleep 300", exec_id="long-one")
        for _ in range(100):
            if "long-one" in [e.exec_id for e in svc.execs()]:
                break
            time.sleep(0.05)
        assert svc.exec_status("long-one").state == "running"
        svc.signal(15, exec_id="long-one")
        result = stream.collect()
        assert result.signal == "SIGTERM", result.describe()

        log = svc.logs()
        assert (log.stdout_text, log.stderr_text, log.exit) == ("svc up\n", "svc warn\n", None)

        svc.remove()
        assert sb.containers() == []
        with pytest.raises(ContainerNotFound):
            svc.run("true")
        assert sb.run("echo root runs on").stdout_text == "root runs on\n"


def test_a_missing_container_and_one_never_ready_are_typed_errors(client):
    with Sandbox.create(client=client, containers=[SERVICE]) as sb:
        with pytest.raises(ContainerNotFound) as missing:
            sb.container("nope").run("true")
        assert "nope" in str(missing.value)
        with pytest.raises(ContainerNotFound):
            sb.container("nope").info()
        with pytest.raises(ContainerNotFound):
            sb.container("nope").logs()
    with pytest.raises(ValueError):
        sb.container("")
    broken = ContainerRequest(name="broken", command=["/bin/sh", "-c", "echo bye; exit 3"],
                              ready=ReadyCheck(tcp_port=7001))
    with pytest.raises(ContainerNotReady) as not_ready:
        Sandbox.create(client=client, containers=[broken])
    assert "broken" in str(not_ready.value) and "bye" in str(not_ready.value)


def test_the_asyncio_face_of_containers(daemon):
    async def main():
        async with AsyncClient(str(daemon), timeout=TIMEOUT,
                               stream_timeout=STREAM_TIMEOUT) as client:
            async with AsyncSandbox.create(client=client, containers=[SERVICE],
                                           shared=SHARED) as sb:
                svc = sb.container("svc")
                assert (await svc.info()).state == "ready"
                ran = await svc.run("echo from-async > /data/a; echo ok", check=True)
                assert ran.stdout_text == "ok\n"
                assert await sb.files.read_text("/work/a") == "from-async\n"
                await svc.files.write("/tmp/x", b"x")
                assert await svc.files.read("/tmp/x") == b"x"
                assert (await svc.stats()).pids.current >= 2
                assert [c.name for c in await sb.containers()] == ["svc"]
                assert (await svc.logs()).stdout_text == "svc up\n"
                with pytest.raises(ContainerNotFound):
                    await sb.container("nope").run("true")
                await svc.remove()
                assert await sb.containers() == []

    asyncio.run(asyncio.wait_for(main(), 300))


def test_a_container_added_to_a_running_sandbox(client, daemon):
    with Sandbox.create(client=client, shared=SHARED) as sb:
        svc = sb.add_container(SERVICE)
        assert svc.name == "svc" and svc.info().state == "ready"
        # It joins the sandbox's loopback and the shared directory it names.
        assert sb.run("nc 127.0.0.1 7000 < /dev/null", check=True).stdout_text == "pong\n"
        svc.run("echo added > /data/note", check=True)
        assert sb.files.read_text("/work/note") == "added\n"
        with pytest.raises(Conflict):
            sb.add_container(SERVICE)
        late = ContainerRequest(name="late", command=["/bin/sh", "-c", "echo bye; exit 3"],
                                ready=ReadyCheck(tcp_port=7002))
        with pytest.raises(ContainerNotReady) as not_ready:
            sb.add_container(late)
        assert "bye" in str(not_ready.value)
        states = [(c.state, c.exit_code) for c in sb.containers()]
        assert states == [("ready", None), ("exited", 3)]
        with pytest.raises(TypeError):
            sb.add_container("svc")  # type: ignore[arg-type]

    async def main():
        async with AsyncClient(str(daemon), timeout=TIMEOUT,
                               stream_timeout=STREAM_TIMEOUT) as aclient:
            async with AsyncSandbox.create(client=aclient) as asb:
                added = await asb.add_container(ContainerRequest(name="idle"))
                ran = await added.run("echo in-idle", check=True)
                assert ran.stdout_text == "in-idle\n"

    asyncio.run(asyncio.wait_for(main(), 300))
