"""`AsyncSandbox`: the asyncio face of one sandbox, as `Sandbox` is the blocking one.

    async with AsyncSandbox.create() as sb:          # deleted at the end of the block
        result = await sb.run(["echo", "hello"])
"""

from __future__ import annotations

import asyncio
import os
import pathlib
from typing import IO, Mapping, Optional, Sequence, Union

from .. import _api, _tar
from ..errors import ContainerNotFound, IsADirectory, SandboxNotFound
from ..files import Data, dir_tar_command, keep_meta, split_guest_path
from ..models import (BackendKind, CacheMount, ContainerInfo, ContainerRequest, ExecStatus,
                      FilesPutResult, NetworkRequest, OnDisconnect, Rlimit, SandboxInfo,
                      SandboxStats, SharedMount, VolumeMount)
from ..result import ContainerLog, OutputCallback, RunResult
from ..session import Transport
from ._opening import Opening
from .client import AsyncClient
from .session import AsyncSession
from .stream import AsyncExecStream


class AsyncFiles:
    """`sandbox.files` on asyncio (tar packing and extraction run in a worker thread)."""

    def __init__(self, client: AsyncClient, sandbox_id: str,
                 container: Optional[str] = None) -> None:
        self._client = client
        self._id = sandbox_id
        self._container = container

    async def write(self, path: str, data: Data, mode: int = 0o644) -> FilesPutResult:
        directory, name = split_guest_path(path)
        payload = data.encode() if isinstance(data, str) else data
        return await self._client.put_tar(self._id, directory,
                                          _tar.pack_file(name, payload, mode),
                                          container=self._container)

    async def read(self, path: str) -> bytes:
        return await self._client.get_file(self._id, path, container=self._container)

    async def read_text(self, path: str) -> str:
        return (await self.read(path)).decode()

    async def upload_dir(self, local: _tar.PathLike, dest: str,
                         include_root: bool = False) -> FilesPutResult:
        archive = await asyncio.to_thread(_tar.pack_dir, local, include_root)
        try:
            return await self._client.put_tar(self._id, dest, archive,
                                              container=self._container)
        finally:
            archive.close()

    async def upload_tar(self, dest: str, archive: Union[bytes, IO[bytes]]) -> FilesPutResult:
        return await self._client.put_tar(self._id, dest, archive, container=self._container)

    async def download(self, path: str, local: _tar.PathLike) -> pathlib.Path:
        target = pathlib.Path(local)
        tmp = target.with_name(target.name + ".crucible-part")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as out:
                meta = await self._client.get_file_meta_to(self._id, path, out,
                                                           container=self._container)
            keep_meta(tmp, meta)
            os.replace(tmp, target)
            return target
        except IsADirectory:
            pass
        finally:
            if tmp.exists():
                tmp.unlink()
        spooled = _tar.spool()
        try:
            stream = await self._client.exec(self._id, _api.exec_request(dir_tar_command(path)),
                                             container=self._container)
            result = await stream.collect(on_stdout=spooled.write)
            result.check()
            spooled.seek(0)
            await asyncio.to_thread(_tar.extract, spooled, target)
        finally:
            spooled.close()
        return target


class AsyncRoot:
    """`Root` on asyncio: an AsyncSandbox's own root, or one of its containers
    (`AsyncContainer`)."""

    client: AsyncClient

    def __init__(self, client: AsyncClient, sandbox_id: str, container: Optional[str]) -> None:
        self.client = client
        self._sandbox_id = sandbox_id
        self._container = container
        self.files = AsyncFiles(client, sandbox_id, container)

    @property
    def id(self) -> str:
        """The sandbox's id."""
        return self._sandbox_id

    # -- commands ---------------------------------------------------------------------------

    async def run(self, cmd: _api.Command, *, env: Optional[Mapping[str, str]] = None,
                  cwd: Optional[str] = None, timeout: Optional[int] = None,
                  user: Optional[str] = None, group_add: Optional[Sequence[str]] = None,
                  rlimits: Optional[Sequence[Rlimit]] = None, exec_id: Optional[str] = None,
                  on_disconnect: Optional[OnDisconnect] = None, tty: bool = False,
                  tty_size: Optional[_api.TtySize] = None,
                  on_stdout: Optional[OutputCallback] = None,
                  on_stderr: Optional[OutputCallback] = None, check: bool = False,
                  resumes: int = 5) -> RunResult:
        """As `Sandbox.run`."""
        request = _api.exec_request(
            cmd, env=env, cwd=cwd, timeout=timeout, user=user, group_add=group_add,
            rlimits=rlimits, exec_id=exec_id, on_disconnect=on_disconnect, tty=tty,
            tty_size=tty_size)
        stream = self.client.stream(self.id, request, resumes=resumes,
                                    container=self._container)
        result = await stream.collect(on_stdout, on_stderr)
        return result.check() if check else result

    def stream(self, cmd: _api.Command, *, env: Optional[Mapping[str, str]] = None,
               cwd: Optional[str] = None, timeout: Optional[int] = None,
               user: Optional[str] = None, group_add: Optional[Sequence[str]] = None,
               rlimits: Optional[Sequence[Rlimit]] = None, exec_id: Optional[str] = None,
               on_disconnect: Optional[OnDisconnect] = None, tty: bool = False,
               tty_size: Optional[_api.TtySize] = None,
               resumes: int = 5) -> AsyncExecStream:
        """`async for event in sb.stream(cmd)`; the request goes out on the first step."""
        request = _api.exec_request(
            cmd, env=env, cwd=cwd, timeout=timeout, user=user, group_add=group_add,
            rlimits=rlimits, exec_id=exec_id, on_disconnect=on_disconnect, tty=tty,
            tty_size=tty_size)
        return self.client.stream(self.id, request, resumes=resumes, container=self._container)

    def interactive(self, cmd: _api.Command, *, transport: Transport = "hijack",
                    env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
                    timeout: Optional[int] = None, user: Optional[str] = None,
                    group_add: Optional[Sequence[str]] = None,
                    rlimits: Optional[Sequence[Rlimit]] = None, exec_id: Optional[str] = None,
                    on_disconnect: Optional[OnDisconnect] = None, tty: bool = False,
                    tty_size: Optional[_api.TtySize] = None) -> Opening[AsyncSession]:
        """`async with sb.interactive(cmd) as session:` (or awaited)."""
        request = _api.exec_request(
            cmd, env=env, cwd=cwd, timeout=timeout, user=user, group_add=group_add,
            rlimits=rlimits, exec_id=exec_id, on_disconnect=on_disconnect, tty=tty,
            tty_size=tty_size)
        return Opening(self.client.interactive(self.id, request, transport,
                                               container=self._container))

    async def attach(self, exec_id: str, offset: int = 0, *,
                     on_stdout: Optional[OutputCallback] = None,
                     on_stderr: Optional[OutputCallback] = None) -> RunResult:
        stream = await self.attach_stream(exec_id, offset)
        return await stream.collect(on_stdout, on_stderr)

    async def attach_stream(self, exec_id: str, offset: int = 0) -> AsyncExecStream:
        return await self.client.attach(self.id, exec_id, offset, container=self._container)

    async def execs(self) -> list[ExecStatus]:
        return await self.client.execs(self.id, container=self._container)

    async def exec_status(self, exec_id: str) -> ExecStatus:
        return await self.client.exec_status(self.id, exec_id, container=self._container)

    async def signal(self, sig: _api.SignalLike, exec_id: Optional[str] = None) -> None:
        await self.client.signal(self.id, sig, exec_id, container=self._container)

    async def stats(self) -> SandboxStats:
        return await self.client.stats(self.id, container=self._container)


class AsyncSandbox(AsyncRoot):
    """A sandbox on a daemon, driven from asyncio. `AsyncSandbox.create(...)` and
    `AsyncSandbox.connect(id)` are awaited, or used with `async with`."""

    def __init__(self, client: AsyncClient, info: SandboxInfo, *, delete_on_exit: bool,
                 owns_client: bool = False) -> None:
        super().__init__(client, info.id, None)
        self.info = info
        self.delete_on_exit = delete_on_exit
        self._owns_client = owns_client

    def __repr__(self) -> str:
        return f"AsyncSandbox({self.id!r})"

    @classmethod
    def create(cls, *, image: Optional[str] = None, memory_mib: Optional[int] = None,
               vcpus: Optional[int] = None,
               network: Union[Sequence[str], NetworkRequest, None] = None,
               caches: Sequence[CacheMount] = (), volumes: Sequence[VolumeMount] = (),
               disk_mib: Optional[int] = None, env: Optional[Mapping[str, str]] = None,
               labels: Optional[Mapping[str, str]] = None, ttl_s: Optional[int] = None,
               user: Optional[str] = None, backend: Optional[BackendKind] = None,
               containers: Sequence[ContainerRequest] = (),
               shared: Sequence[SharedMount] = (),
               client: Optional[AsyncClient] = None, host: Optional[str] = None,
               api_key: Optional[str] = None) -> Opening[AsyncSandbox]:
        """As `Sandbox.create`; deleted at the end of `async with`, or by `aclose()`."""
        request = _api.create_request(
            image=image, memory_mib=memory_mib, vcpus=vcpus, network=network, caches=caches,
            volumes=volumes, disk_mib=disk_mib, env=env, labels=labels, ttl_s=ttl_s, user=user,
            backend=backend, containers=containers, shared=shared)

        async def make() -> AsyncSandbox:
            owns = client is None
            c = client if client is not None else AsyncClient(host, api_key=api_key)
            try:
                info = await c.create(request)
            except BaseException:
                if owns:
                    await c.aclose()
                raise
            return cls(c, info, delete_on_exit=True, owns_client=owns)

        return Opening(make())

    @classmethod
    def connect(cls, sandbox_id: str, *, client: Optional[AsyncClient] = None,
                host: Optional[str] = None,
                api_key: Optional[str] = None) -> Opening[AsyncSandbox]:
        """An existing sandbox (SandboxNotFound if none); not deleted on exit."""
        async def find() -> AsyncSandbox:
            owns = client is None
            c = client if client is not None else AsyncClient(host, api_key=api_key)
            try:
                info = await c.get(sandbox_id)
            except BaseException:
                if owns:
                    await c.aclose()
                raise
            return cls(c, info, delete_on_exit=False, owns_client=owns)

        return Opening(find())

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        try:
            if self.delete_on_exit:
                await self.delete()
        finally:
            if self._owns_client:
                await self.client.aclose()

    async def delete(self) -> None:
        try:
            await self.client.delete(self.id)
        except SandboxNotFound:
            pass
        self.delete_on_exit = False

    async def refresh(self) -> SandboxInfo:
        self.info = await self.client.get(self.id)
        return self.info

    # -- containers -------------------------------------------------------------------------

    def container(self, name: str) -> AsyncContainer:
        """As `Sandbox.container`."""
        _api.in_container("", name)  # the name's checks, at once
        return AsyncContainer(self.client, self.id, name)

    async def containers(self) -> list[ContainerInfo]:
        return await self.client.containers(self.id)

    async def add_container(self, request: ContainerRequest) -> AsyncContainer:
        """As `Sandbox.add_container`."""
        info = await self.client.add_container(self.id, request)
        return AsyncContainer(self.client, self.id, info.name)


class AsyncContainer(AsyncRoot):
    """`Container` on asyncio."""

    def __init__(self, client: AsyncClient, sandbox_id: str, name: str) -> None:
        super().__init__(client, sandbox_id, name)
        self.name = name

    def __repr__(self) -> str:
        return f"AsyncContainer({self.id!r}, {self.name!r})"

    async def info(self) -> ContainerInfo:
        for info in await self.client.containers(self.id):
            if info.name == self.name:
                return info
        raise ContainerNotFound(404, "container_not_found",
                                f"sandbox {self.id} has no container {self.name!r}")

    async def logs(self) -> ContainerLog:
        return await self.client.container_logs(self.id, self.name)

    async def remove(self) -> None:
        await self.client.remove_container(self.id, self.name)
