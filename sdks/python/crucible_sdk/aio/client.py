"""The asyncio client: every endpoint of the daemon, as `crucible_sdk.Client` has them.

One AsyncClient belongs to one event loop (its idle connections are that loop's streams).
"""

from __future__ import annotations

import os
from typing import IO, Any, Dict, List, Optional, Type, TypeVar, Union

from .. import _api
from .._address import Address, api_key_from_env, parse_address
from ..client import DEFAULT_TIMEOUT
from ..errors import ExecNotFound, FileNotFound, NotFound, from_response
from ..files import FileMeta, file_meta
from ..models import (CacheInfo, ContainerInfo, ContainerRequest, CreateSandbox, ExecRequest, ExecStatus,
                      FilesPutResult, ImageInfo, ImagesPruned, SandboxInfo, SandboxStats)
from ..pool import PoolStatus, parse_pool
from ..result import ContainerLog
from ..session import Transport
from ._io import AsyncPool, AsyncResponse
from .session import AsyncSession, open_hijack, open_websocket
from .stream import AsyncExecStream, Reattach

T = TypeVar("T")


class AsyncClient:
    """A client of one crucible daemon on asyncio; arguments as for `Client`."""

    def __init__(self, host: Optional[str] = None, *, api_key: Optional[str] = None,
                 timeout: Optional[float] = DEFAULT_TIMEOUT,
                 stream_timeout: Optional[float] = None, max_idle: int = 16) -> None:
        self.address: Address = parse_address(host)
        self.api_key = api_key_from_env(api_key)
        self.timeout = timeout
        self.stream_timeout = stream_timeout
        self._auth = [("Authorization", f"Bearer {self.api_key}")] if self.api_key else []
        self._json_headers = [("Content-Type", _api.JSON), *self._auth]
        self._pool = AsyncPool(self.address, timeout, max_idle)

    def __repr__(self) -> str:
        return f"AsyncClient({str(self.address)!r})"

    async def aclose(self) -> None:
        self._pool.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- plumbing ---------------------------------------------------------------------------

    async def call(self, call: _api.Call[T]) -> T:
        headers = self._json_headers if call.body is not None else self._auth
        response = await self._pool.request(call.method, call.target, headers, call.body,
                                            read_timeout=self.timeout)
        data = await response.read()
        if response.status >= 400:
            raise from_response(response.status, data, call.not_found)
        return call.parse(data)

    async def _open(self, method: str, target: str, body: Union[bytes, IO[bytes], None] = None,
                    content_type: str = _api.JSON, length: Optional[int] = None,
                    read_timeout: Optional[float] = None,
                    not_found: Optional[Type[NotFound]] = None) -> AsyncResponse:
        headers = ([("Content-Type", content_type), *self._auth] if body is not None
                   else self._auth)
        response = await self._pool.request(method, target, headers, body, length,
                                            read_timeout=read_timeout)
        if response.status >= 400:
            raise from_response(response.status, await response.read(), not_found)
        return response

    # -- the daemon -------------------------------------------------------------------------

    async def health(self) -> Dict[str, Any]:
        return await self.call(_api.health())

    async def metrics(self) -> str:
        return await self.call(_api.metrics())

    async def openapi(self) -> Dict[str, Any]:
        return await self.call(_api.openapi())

    async def pool(self) -> PoolStatus:
        return parse_pool(await self.metrics())

    # -- sandboxes --------------------------------------------------------------------------

    async def create(self, request: Optional[CreateSandbox] = None,
                     **settings: Any) -> SandboxInfo:
        if request is None:
            request = _api.create_request(**settings)
        elif settings:
            raise TypeError("pass a CreateSandbox or keywords, not both")
        return await self.call(_api.create_sandbox(request))

    async def list(self) -> List[SandboxInfo]:
        return await self.call(_api.list_sandboxes())

    async def get(self, sandbox_id: str) -> SandboxInfo:
        return await self.call(_api.get_sandbox(sandbox_id))

    async def delete(self, sandbox_id: str) -> None:
        await self.call(_api.delete_sandbox(sandbox_id))

    async def signal(self, sandbox_id: str, sig: _api.SignalLike,
                     exec_id: Optional[str] = None, *, container: Optional[str] = None) -> None:
        await self.call(_api.signal(sandbox_id, sig, exec_id, container))

    async def stats(self, sandbox_id: str, *,
                    container: Optional[str] = None) -> SandboxStats:
        return await self.call(_api.stats(sandbox_id, container))

    # -- containers -------------------------------------------------------------------------

    async def containers(self, sandbox_id: str) -> List[ContainerInfo]:
        return await self.call(_api.containers(sandbox_id))

    async def add_container(self, sandbox_id: str, request: ContainerRequest) -> ContainerInfo:
        return await self.call(_api.add_container(sandbox_id, request))

    async def remove_container(self, sandbox_id: str, name: str) -> None:
        await self.call(_api.remove_container(sandbox_id, name))

    async def container_logs(self, sandbox_id: str, name: str) -> ContainerLog:
        return await self.call(_api.container_logs(sandbox_id, name))

    # -- exec -------------------------------------------------------------------------------

    def stream(self, sandbox_id: str, request: ExecRequest, *,
               resumes: int = 5, container: Optional[str] = None) -> AsyncExecStream:
        """The command's stream, started by its first iteration (or `await s.start()`)."""
        body = _api.exec_body(request)
        target = _api.exec_target(sandbox_id, False, container)

        async def opener() -> AsyncResponse:
            return await self._open("POST", target, body, read_timeout=self.stream_timeout)

        keeps = request.on_disconnect != "kill"
        return AsyncExecStream(opener, request.cmd,
                               self._reattacher(sandbox_id, container)
                               if keeps and resumes else None, resumes)

    async def exec(self, sandbox_id: str, request: ExecRequest, *,
                   resumes: int = 5, container: Optional[str] = None) -> AsyncExecStream:
        """Starts a command (the daemon's refusal is raised here) and returns its stream."""
        return await self.stream(sandbox_id, request, resumes=resumes,
                                 container=container).start()

    async def attach(self, sandbox_id: str, exec_id: str, offset: int = 0, *,
                     resumes: int = 5, container: Optional[str] = None) -> AsyncExecStream:
        reattach = self._reattacher(sandbox_id, container)

        async def opener() -> AsyncResponse:
            return await reattach(exec_id, offset)

        stream = AsyncExecStream(opener, [], reattach, resumes, offset)
        stream.exec_id = exec_id
        return await stream.start()

    def _reattacher(self, sandbox_id: str, container: Optional[str] = None) -> Reattach:
        async def reattach(exec_id: str, offset: int) -> AsyncResponse:
            target = _api.attach_target(sandbox_id, exec_id, offset, container)
            return await self._open("POST", target, read_timeout=self.stream_timeout,
                                    not_found=ExecNotFound)
        return reattach

    async def execs(self, sandbox_id: str, *,
                    container: Optional[str] = None) -> List[ExecStatus]:
        return await self.call(_api.execs(sandbox_id, container))

    async def exec_status(self, sandbox_id: str, exec_id: str, *,
                          container: Optional[str] = None) -> ExecStatus:
        return await self.call(_api.exec_status(sandbox_id, exec_id, container))

    async def interactive(self, sandbox_id: str, request: ExecRequest,
                          transport: Transport = "hijack", *,
                          container: Optional[str] = None) -> AsyncSession:
        body = _api.exec_body(request)
        target = _api.exec_target(sandbox_id, transport == "hijack", container)
        if transport == "hijack":
            return AsyncSession(await open_hijack(self.address, target, self._auth, body,
                                                  self.stream_timeout), request.cmd,
                                bool(request.tty))
        if transport == "websocket":
            return AsyncSession(await open_websocket(self.address, target, self.api_key, body,
                                                     self.stream_timeout), request.cmd,
                                bool(request.tty))
        raise ValueError(f"transport must be 'hijack' or 'websocket', got {transport!r}")

    # -- files ------------------------------------------------------------------------------

    async def put_tar(self, sandbox_id: str, dest: str, archive: Union[bytes, IO[bytes]], *,
                      container: Optional[str] = None) -> FilesPutResult:
        target = _api.files_target(sandbox_id, dest, container)
        if isinstance(archive, (bytes, bytearray)):
            response = await self._open("POST", target, bytes(archive), _api.TAR)
        else:
            response = await self._open("POST", target, archive, _api.TAR, _api.body_size(archive))
        return _api.parse_put(await response.read())

    async def get_file(self, sandbox_id: str, path: str, *,
                       container: Optional[str] = None) -> bytes:
        response = await self._open("GET", _api.files_target(sandbox_id, path, container),
                                    not_found=FileNotFound)
        return await response.read()

    async def get_file_to(self, sandbox_id: str, path: str, out: IO[bytes], *,
                          container: Optional[str] = None) -> int:
        meta = await self.get_file_meta_to(sandbox_id, path, out, container=container)
        return meta.size

    async def get_file_meta_to(self, sandbox_id: str, path: str, out: IO[bytes], *,
                               container: Optional[str] = None) -> FileMeta:
        """Streams one file into `out`; returns its size, mode and modification time."""
        response = await self._open("GET", _api.files_target(sandbox_id, path, container),
                                    not_found=FileNotFound)
        size = 0
        while True:
            piece = await response.read_some()
            if not piece:
                return file_meta(size, response.header)
            out.write(piece)
            size += len(piece)

    # -- caches -----------------------------------------------------------------------------

    async def caches(self) -> List[CacheInfo]:
        return await self.call(_api.caches())

    async def delete_cache(self, name: str) -> None:
        await self.call(_api.delete_cache(name))

    async def clear_caches(self) -> List[CacheInfo]:
        return await self.call(_api.clear_caches())

    # -- images -----------------------------------------------------------------------------

    async def images(self) -> List[ImageInfo]:
        return await self.call(_api.images())

    async def image(self, name: str) -> ImageInfo:
        return await self.call(_api.image(name))

    async def import_image(self, name: str,
                           archive: Union[str, "os.PathLike[str]", bytes, IO[bytes]]
                           ) -> ImageInfo:
        target = _api.image_import_target(name)
        if isinstance(archive, (bytes, bytearray)):
            response = await self._open("POST", target, bytes(archive), _api.TAR)
        elif isinstance(archive, (str, os.PathLike)):
            with open(archive, "rb") as f:
                response = await self._open("POST", target, f, _api.TAR,
                                            os.fstat(f.fileno()).st_size)
                return _api.parse_image(await response.read())
        else:
            response = await self._open("POST", target, archive, _api.TAR, _api.body_size(archive))
        return _api.parse_image(await response.read())

    async def delete_image(self, name: str) -> None:
        await self.call(_api.delete_image(name))

    async def prune_images(self, unused_for_s: int = 0, prefix: str = "") -> ImagesPruned:
        return await self.call(_api.prune_images(unused_for_s, prefix))

