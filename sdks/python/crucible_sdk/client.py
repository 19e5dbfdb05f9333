"""The blocking client: every endpoint of the daemon, typed, over kept-alive connections.

`Sandbox` (sandbox.py) is the convenient face of it; `Client` is the whole API, one method per
endpoint, for tools that manage many sandboxes or want the raw models.
"""

from __future__ import annotations

import os
from typing import IO, Any, Dict, List, Optional, Type, TypeVar, Union

from . import _api, _bare_run, _http1, _sync_io
from ._address import Address, api_key_from_env, parse_address
from .errors import ExecNotFound, FileNotFound, NotFound, from_response
from .files import FileMeta, file_meta
from .models import (CacheInfo, ContainerInfo, ContainerRequest, CreateSandbox, ExecRequest, ExecStatus,
                     FilesPutResult, ImageInfo, ImagesPruned, SandboxInfo, SandboxStats)
from .pool import PoolStatus, parse_pool
from .result import ContainerLog, OutputCallback, RunResult
from .session import HijackChannel, Session, Transport, WebSocketChannel
from .stream import ExecStream, Reattach

T = TypeVar("T")

#: Seconds a JSON call may wait for the daemon (a create included: a microVM takes seconds).
DEFAULT_TIMEOUT = 300.0


class Client:
    """A client of one crucible daemon.

    `host`: a Unix socket path, `unix:PATH` or `http://HOST:PORT` (default `$CRUCIBLE_HOST`,
    else /run/crucible/crucible.sock); `api_key` (default `$CRUCIBLE_API_KEY`) is sent as
    `Authorization: Bearer`. `timeout` bounds each wait on the daemon in JSON calls;
    `stream_timeout` each wait for output on exec streams and sessions (default: none, as a
    command may be silent for as long as it likes). Safe to share between threads.
    """

    def __init__(self, host: Optional[str] = None, *, api_key: Optional[str] = None,
                 timeout: Optional[float] = DEFAULT_TIMEOUT,
                 stream_timeout: Optional[float] = None, max_idle: int = 16) -> None:
        self.address: Address = parse_address(host)
        self.api_key = api_key_from_env(api_key)
        self.timeout = timeout
        self.stream_timeout = stream_timeout
        self._auth = [("Authorization", f"Bearer {self.api_key}")] if self.api_key else []
        self._json_headers = [("Content-Type", _api.JSON), *self._auth]
        self._pool = _sync_io.Pool(self.address, timeout, max_idle)

    def __repr__(self) -> str:
        return f"Client({str(self.address)!r})"

    def close(self) -> None:
        """Closes idle connections (streams and sessions still open keep theirs)."""
        self._pool.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing ---------------------------------------------------------------------------

    def call(self, call: _api.Call[T]) -> T:
        """Sends one described request and parses its answer (raising its error)."""
        headers = self._json_headers if call.body is not None else self._auth
        response = self._pool.request(call.method, call.target, headers, call.body)
        data = response.read()
        if response.status >= 400:
            raise from_response(response.status, data, call.not_found)
        return call.parse(data)

    def _open(self, method: str, target: str, body: Union[bytes, IO[bytes], None] = None,
              content_type: str = _api.JSON, length: Optional[int] = None,
              read_timeout: Optional[float] = None,
              not_found: Optional[Type[NotFound]] = None) -> _sync_io.Response:
        headers = [("Content-Type", content_type), *self._auth] if body is not None else self._auth
        response = self._pool.request(method, target, headers, body, length,
                                      read_timeout=read_timeout)
        if response.status >= 400:
            raise from_response(response.status, response.read(), not_found)
        return response

    # -- the daemon -------------------------------------------------------------------------

    def health(self) -> Dict[str, Any]:
        """GET /healthz (needs no key)."""
        return self.call(_api.health())

    def metrics(self) -> str:
        """GET /metrics: Prometheus text."""
        return self.call(_api.metrics())

    def openapi(self) -> Dict[str, Any]:
        return self.call(_api.openapi())

    def pool(self) -> PoolStatus:
        """The warm pool's shapes and counters, read from /metrics."""
        return parse_pool(self.metrics())

    # -- sandboxes --------------------------------------------------------------------------

    def create(self, request: Optional[CreateSandbox] = None, **settings: Any) -> SandboxInfo:
        """POST /sandboxes, from a CreateSandbox or the keywords of `Sandbox.create`."""
        if request is None:
            request = _api.create_request(**settings)
        elif settings:
            raise TypeError("pass a CreateSandbox or keywords, not both")
        return self.call(_api.create_sandbox(request))

    def list(self) -> List[SandboxInfo]:
        return self.call(_api.list_sandboxes())

    def get(self, sandbox_id: str) -> SandboxInfo:
        return self.call(_api.get_sandbox(sandbox_id))

    def delete(self, sandbox_id: str) -> None:
        self.call(_api.delete_sandbox(sandbox_id))

    def signal(self, sandbox_id: str, sig: _api.SignalLike,
               exec_id: Optional[str] = None, *, container: Optional[str] = None) -> None:
        """Sends `sig` to every process of the sandbox (or of its `container`) but its agent,
        or with `exec_id` to that running command's process group only (ExecNotFound when
        none runs)."""
        self.call(_api.signal(sandbox_id, sig, exec_id, container))

    def stats(self, sandbox_id: str, *, container: Optional[str] = None) -> SandboxStats:
        """What the sandbox uses now, or its `container`'s share (its processes' memory, CPU
        time and count, the sandbox's limits)."""
        return self.call(_api.stats(sandbox_id, container))

    # -- containers -------------------------------------------------------------------------

    def containers(self, sandbox_id: str) -> List[ContainerInfo]:
        """The sandbox's containers: each one's state, main process, restarts, last exit."""
        return self.call(_api.containers(sandbox_id))

    def add_container(self, sandbox_id: str, request: ContainerRequest) -> ContainerInfo:
        """Adds a container to the running sandbox; returns once it is ready
        (ContainerNotReady when it does not get ready: it stays, failed or exited, with its log;
        Conflict when the name is in use)."""
        return self.call(_api.add_container(sandbox_id, request))

    def remove_container(self, sandbox_id: str, name: str) -> None:
        """Removes container `name`: it ends with every process in it (ContainerNotFound
        when there is none; InvalidRequest for `main`)."""
        self.call(_api.remove_container(sandbox_id, name))

    def container_logs(self, sandbox_id: str, name: str) -> ContainerLog:
        """Container `name`'s log: its main process's output, the latest MiB of it."""
        return self.call(_api.container_logs(sandbox_id, name))

    # -- exec -------------------------------------------------------------------------------

    def exec(self, sandbox_id: str, request: ExecRequest, *, resumes: int = 5,
             container: Optional[str] = None) -> ExecStream:
        """Starts a command (in the sandbox's `container`, if named); its output streams as
        the iterator's events. When the connection breaks and the command runs on, the
        stream re-attaches up to `resumes` times from the bytes it already yielded."""
        response = self._open("POST", _api.exec_target(sandbox_id, False, container),
                              _api.exec_body(request),
                              read_timeout=self.stream_timeout)
        keeps = request.on_disconnect != "kill"
        return ExecStream(response, request.cmd, self._reattach(sandbox_id, response, container)
                          if keeps and resumes else None, resumes)

    def exec_head(self, sandbox_id: str, container: Optional[str] = None) -> bytes:
        """The head of `POST /sandboxes/{id}/exec` with a JSON body, up to its length: what
        a Sandbox keeps to start bare commands without building it each time."""
        return _http1.head_prefix("POST", _api.exec_target(sandbox_id, False, container),
                                  self.address.host_header,
                                  self._json_headers).encode("latin-1")

    def run_prepared(self, sandbox_id: str, request: bytes, cmd: List[str], *, resumes: int,
                     on_stdout: Optional[OutputCallback] = None,
                     on_stderr: Optional[OutputCallback] = None,
                     container: Optional[str] = None) -> RunResult:
        """A bare command's exec to its end, from the whole request already encoded (a head
        from `exec_head`, its Content-Length and the body): the hot path of Sandbox.run. A
        short answer without callbacks is read in one pass (_bare_run); any other goes the
        way of `exec`."""
        pool = self._pool
        head, conn = pool.exchange_head(request, None, None, self.stream_timeout)
        if (on_stdout is None and on_stderr is None and head.status == 200 and head.chunked
                and head.keep_alive):
            done = _bare_run.read_result(conn)
            if done is not None:
                pool.put(conn)
                return RunResult(cmd, head.headers.get("x-crucible-exec-id", ""), *done)
        response = _sync_io.Response(head, conn, pool)
        if response.status >= 400:
            raise from_response(response.status, response.read(), None)
        stream = ExecStream(response, cmd, self._reattach(sandbox_id, response, container)
                            if resumes else None, resumes)
        return stream.collect(on_stdout, on_stderr)

    def attach(self, sandbox_id: str, exec_id: str, offset: int = 0, *,
               resumes: int = 5, container: Optional[str] = None) -> ExecStream:
        """Re-attaches to a command whose connection dropped, from output byte `offset` (the
        stdout and stderr bytes already received)."""
        response = self._attach(sandbox_id, exec_id, offset, container)
        stream = ExecStream(response, [], self._reattach(sandbox_id, response, container),
                            resumes, offset)
        if not stream.exec_id:
            stream.exec_id = exec_id
        return stream

    def _attach(self, sandbox_id: str, exec_id: str, offset: int,
                container: Optional[str] = None) -> _sync_io.Response:
        return self._open("POST", _api.attach_target(sandbox_id, exec_id, offset, container),
                          read_timeout=self.stream_timeout, not_found=ExecNotFound)

    def _reattach(self, sandbox_id: str, response: _sync_io.Response,
                  container: Optional[str] = None) -> Reattach:
        exec_id = response.header("x-crucible-exec-id")
        return lambda offset: self._attach(sandbox_id, exec_id, offset, container)

    def execs(self, sandbox_id: str, *, container: Optional[str] = None) -> List[ExecStatus]:
        """The commands that can be found by exec_id: running, or ended with a result
        nobody collected yet."""
        return self.call(_api.execs(sandbox_id, container))

    def exec_status(self, sandbox_id: str, exec_id: str, *,
                    container: Optional[str] = None) -> ExecStatus:
        return self.call(_api.exec_status(sandbox_id, exec_id, container))

    def interactive(self, sandbox_id: str, request: ExecRequest,
                    transport: Transport = "hijack", *,
                    container: Optional[str] = None) -> Session:
        """An interactive session: stdin frames out, events in."""
        body = _api.exec_body(request)
        target = _api.exec_target(sandbox_id, transport == "hijack", container)
        if transport == "hijack":
            return Session(HijackChannel(self.address, target, self._auth, body,
                                         self.stream_timeout), request.cmd, bool(request.tty))
        if transport == "websocket":
            return Session(WebSocketChannel(self.address, target, self.api_key, body,
                                            self.stream_timeout), request.cmd,
                           bool(request.tty))
        raise ValueError(f"transport must be 'hijack' or 'websocket', got {transport!r}")

    # -- files ------------------------------------------------------------------------------

    def put_tar(self, sandbox_id: str, dest: str, archive: Union[bytes, IO[bytes]], *,
                container: Optional[str] = None) -> FilesPutResult:
        """Extracts a tar archive beneath the guest directory `dest`."""
        target = _api.files_target(sandbox_id, dest, container)
        if isinstance(archive, (bytes, bytearray)):
            response = self._open("POST", target, bytes(archive), _api.TAR)
        else:
            length = _api.body_size(archive)
            response = self._open("POST", target, archive, _api.TAR, length)
        return _api.parse_put(response.read())

    def get_file(self, sandbox_id: str, path: str, *,
                 container: Optional[str] = None) -> bytes:
        return self._open("GET", _api.files_target(sandbox_id, path, container),
                          not_found=FileNotFound).read()

    def get_file_to(self, sandbox_id: str, path: str, out: IO[bytes], *,
                    container: Optional[str] = None) -> int:
        """Streams one file into `out`; returns its size."""
        return self.get_file_meta_to(sandbox_id, path, out, container=container).size

    def get_file_meta_to(self, sandbox_id: str, path: str, out: IO[bytes], *,
                         container: Optional[str] = None) -> FileMeta:
        """Streams one file into `out`; returns its size, mode and modification time."""
        response = self._open("GET", _api.files_target(sandbox_id, path, container),
                              not_found=FileNotFound)
        size = 0
        for piece in _sync_io.iter_body(response):
            out.write(piece)
            size += len(piece)
        return file_meta(size, response.header)

    # -- caches -----------------------------------------------------------------------------

    def caches(self) -> List[CacheInfo]:
        return self.call(_api.caches())

    def delete_cache(self, name: str) -> None:
        """Conflict while a sandbox uses it."""
        self.call(_api.delete_cache(name))

    def clear_caches(self) -> List[CacheInfo]:
        """Deletes every cache of the caller's not in use; returns those kept."""
        return self.call(_api.clear_caches())

    # -- images -----------------------------------------------------------------------------

    def images(self) -> List[ImageInfo]:
        return self.call(_api.images())

    def image(self, name: str) -> ImageInfo:
        return self.call(_api.image(name))

    def import_image(self, name: str,
                     archive: Union[str, "os.PathLike[str]", bytes, IO[bytes]]) -> ImageInfo:
        """Imports a `docker save` archive, an OCI archive or a rootfs tarball (gzip or not)
        given as a path, bytes or a binary file (streamed)."""
        target = _api.image_import_target(name)
        if isinstance(archive, (bytes, bytearray)):
            response = self._open("POST", target, bytes(archive), _api.TAR)
        elif isinstance(archive, (str, os.PathLike)):
            with open(archive, "rb") as f:
                response = self._open("POST", target, f, _api.TAR, os.fstat(f.fileno()).st_size)
                return _api.parse_image(response.read())
        else:
            response = self._open("POST", target, archive, _api.TAR, _api.body_size(archive))
        return _api.parse_image(response.read())

    def delete_image(self, name: str) -> None:
        self.call(_api.delete_image(name))

    def prune_images(self, unused_for_s: int = 0, prefix: str = "") -> ImagesPruned:
        """Removes the caller's images no sandbox uses, idle `unused_for_s` seconds and
        named `prefix`..."""
        return self.call(_api.prune_images(unused_for_s, prefix))

