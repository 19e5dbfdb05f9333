"""`Sandbox`: one sandbox and everything done in it, deleted when its `with` block ends."""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

from . import _api, _http1
from .client import Client
from .errors import ContainerNotFound, SandboxNotFound
from .files import Files
from .models import (BackendKind, CacheMount, ContainerInfo, ContainerRequest, ExecStatus,
                     NetworkRequest, OnDisconnect, Rlimit, SandboxInfo, SandboxStats,
                     SharedMount, VolumeMount)
from .result import ContainerLog, OutputCallback, RunResult
from .session import Session, Transport
from .stream import ExecStream

#: Bare commands whose encoded request a Sandbox keeps (run() of the same command again).
BARE_REQUESTS_KEPT = 64


class Root:
    """Where commands run and files go: a sandbox's own root (a `Sandbox`) or one of its
    containers (a `Container`, from `Sandbox.container(name)`)."""

    client: Client

    def __init__(self, client: Client, sandbox_id: str, container: Optional[str]) -> None:
        self.client = client
        self._sandbox_id = sandbox_id
        self._container = container
        #: Files in and out: write, read, upload_dir, upload_tar, download.
        self.files = Files(client, sandbox_id, container)
        # run()'s whole request for a bare command, by command, built once: an exec of
        # `true` is about a millisecond, and building a request is a visible part of what the
        # SDK adds to it. Bounded: cleared when full.
        self._exec_head: Optional[bytes] = None
        self._bare_requests: Dict[Union[str, Tuple[str, ...]], Tuple[bytes, List[str]]] = {}

    @property
    def id(self) -> str:
        """The sandbox's id."""
        return self._sandbox_id

    # -- commands ---------------------------------------------------------------------------

    def run(self, cmd: _api.Command, *, env: Optional[Mapping[str, str]] = None,
            cwd: Optional[str] = None, timeout: Optional[int] = None,
            user: Optional[str] = None, group_add: Optional[Sequence[str]] = None,
            rlimits: Optional[Sequence[Rlimit]] = None, exec_id: Optional[str] = None,
            on_disconnect: Optional[OnDisconnect] = None, tty: bool = False,
            tty_size: Optional[_api.TtySize] = None,
            on_stdout: Optional[OutputCallback] = None,
            on_stderr: Optional[OutputCallback] = None, check: bool = False,
            resumes: int = 5) -> RunResult:
        """Runs a command to its end. `cmd` is an argv list, or a string run by `sh -c`;
        `timeout` is whole seconds (the daemon kills the command's process group then).
        Output goes to the callbacks as it arrives and into the result; `check=True` raises
        CommandFailed unless it exited 0. `tty=True` runs it on a terminal (`tty_size`:
        `(rows, cols)`, default 24 by 80), which merges its stderr into its stdout."""
        if (env is None and cwd is None and timeout is None and user is None
                and group_add is None and rlimits is None and exec_id is None
                and on_disconnect is None and tty is False and tty_size is None):
            encoded, argv = self._prepared(cmd)
            result = self.client.run_prepared(self.id, encoded, list(argv), resumes=resumes,
                                              on_stdout=on_stdout, on_stderr=on_stderr,
                                              container=self._container)
        else:
            request = _api.exec_request(
                cmd, env=env, cwd=cwd, timeout=timeout, user=user, group_add=group_add,
                rlimits=rlimits, exec_id=exec_id, on_disconnect=on_disconnect, tty=tty,
                tty_size=tty_size)
            stream = self.client.exec(self.id, request, resumes=resumes,
                                      container=self._container)
            result = stream.collect(on_stdout, on_stderr)
        return result.check() if check else result

    def _prepared(self, cmd: _api.Command) -> Tuple[bytes, List[str]]:
        """The whole exec request of a bare command, and its argv."""
        key: Union[str, Tuple[str, ...], None] = (
            cmd if type(cmd) is str else tuple(cmd) if type(cmd) is list else None)
        try:
            found = self._bare_requests.get(key) if key is not None else None
        except TypeError:  # an unhashable argument: command() says what is wrong with it
            key, found = None, None
        if found is not None:
            return found
        argv = _api.command(cmd)
        head = self._exec_head
        if head is None:
            head = self._exec_head = self.client.exec_head(self.id, self._container)
        body = _api.bare_exec_body(argv)
        prepared = (_http1.sized_head(head, len(body)) + body, argv)
        if key is not None:
            if len(self._bare_requests) >= BARE_REQUESTS_KEPT:
                self._bare_requests.clear()
            self._bare_requests[key] = prepared
        return prepared

    def stream(self, cmd: _api.Command, *, env: Optional[Mapping[str, str]] = None,
               cwd: Optional[str] = None, timeout: Optional[int] = None,
               user: Optional[str] = None, group_add: Optional[Sequence[str]] = None,
               rlimits: Optional[Sequence[Rlimit]] = None, exec_id: Optional[str] = None,
               on_disconnect: Optional[OnDisconnect] = None, tty: bool = False,
               tty_size: Optional[_api.TtySize] = None, resumes: int = 5) -> ExecStream:
        """Starts a command; iterate the result for Stdout, Stderr and Exit events."""
        request = _api.exec_request(
            cmd, env=env, cwd=cwd, timeout=timeout, user=user, group_add=group_add,
            rlimits=rlimits, exec_id=exec_id, on_disconnect=on_disconnect, tty=tty,
            tty_size=tty_size)
        return self.client.exec(self.id, request, resumes=resumes, container=self._container)

    def interactive(self, cmd: _api.Command, *, transport: Transport = "hijack",
                    env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
                    timeout: Optional[int] = None, user: Optional[str] = None,
                    group_add: Optional[Sequence[str]] = None,
                    rlimits: Optional[Sequence[Rlimit]] = None, exec_id: Optional[str] = None,
                    on_disconnect: Optional[OnDisconnect] = None, tty: bool = False,
                    tty_size: Optional[_api.TtySize] = None) -> Session:
        """Starts a command with stdin: `send()`, `close_stdin()`, iterate, `wait()`.
        `transport` is "hijack" (standard library) or "websocket" (the websockets extra).
        `tty=True` gives it a terminal (`tty_size`: `(rows, cols)`, default 24 by 80) that
        `resize()` resizes; its stderr then arrives merged into its stdout."""
        request = _api.exec_request(
            cmd, env=env, cwd=cwd, timeout=timeout, user=user, group_add=group_add,
            rlimits=rlimits, exec_id=exec_id, on_disconnect=on_disconnect, tty=tty,
            tty_size=tty_size)
        return self.client.interactive(self.id, request, transport, container=self._container)

    def attach(self, exec_id: str, offset: int = 0, *,
               on_stdout: Optional[OutputCallback] = None,
               on_stderr: Optional[OutputCallback] = None) -> RunResult:
        """Follows a command that outlived its connection to its end, from output byte
        `offset` (what was already received)."""
        return self.attach_stream(exec_id, offset).collect(on_stdout, on_stderr)

    def attach_stream(self, exec_id: str, offset: int = 0) -> ExecStream:
        return self.client.attach(self.id, exec_id, offset, container=self._container)

    def execs(self) -> list[ExecStatus]:
        return self.client.execs(self.id, container=self._container)

    def exec_status(self, exec_id: str) -> ExecStatus:
        return self.client.exec_status(self.id, exec_id, container=self._container)

    def signal(self, sig: _api.SignalLike, exec_id: Optional[str] = None) -> None:
        """`sig` to every process here but the agent, or to one running command's group."""
        self.client.signal(self.id, sig, exec_id, container=self._container)

    def stats(self) -> SandboxStats:
        """What the sandbox uses now; for a Container, its share (the sandbox's limits)."""
        return self.client.stats(self.id, container=self._container)


class Sandbox(Root):
    """A sandbox on a daemon. Make one with `Sandbox.create(...)` (deleted when its `with`
    block ends) or find one with `Sandbox.connect(id)` (left alone). Commands and files go to
    its own root; `container(name)` addresses one of its containers."""

    def __init__(self, client: Client, info: SandboxInfo, *, delete_on_exit: bool,
                 owns_client: bool = False) -> None:
        super().__init__(client, info.id, None)
        self.info = info
        self.delete_on_exit = delete_on_exit
        self._owns_client = owns_client

    def __repr__(self) -> str:
        return f"Sandbox({self.id!r})"

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
               container_slots: Optional[int] = None,
               share_process_namespace: bool = False,
               hostname: Optional[str] = None,
               client: Optional[Client] = None, host: Optional[str] = None,
               api_key: Optional[str] = None) -> Sandbox:
        """Creates a sandbox; `network` is the list of hosts it may reach through the
        daemon's proxy (none by default), `caches` the named caches it mounts, `containers`
        the containers beside its own root (services: the create answers once each is
        ready), `shared` the shared directories its own root mounts, `container_slots` a
        microVM's room for containers added once it runs and `share_process_namespace` one
        PID namespace for its root and its containers (each sees the others' processes; by
        default none does) and `hostname` its hostname (default: its id). Without `client`,
        one is made from `host` and `api_key` (or $CRUCIBLE_HOST and $CRUCIBLE_API_KEY) and
        closed with the sandbox."""
        request = _api.create_request(
            image=image, memory_mib=memory_mib, vcpus=vcpus, network=network, caches=caches,
            volumes=volumes, disk_mib=disk_mib, env=env, labels=labels, ttl_s=ttl_s, user=user,
            backend=backend, containers=containers, shared=shared,
            container_slots=container_slots,
            share_process_namespace=share_process_namespace, hostname=hostname)
        owns = client is None
        c = client if client is not None else Client(host, api_key=api_key)
        try:
            info = c.create(request)
        except BaseException:
            if owns:
                c.close()
            raise
        return cls(c, info, delete_on_exit=True, owns_client=owns)

    @classmethod
    def connect(cls, sandbox_id: str, *, client: Optional[Client] = None,
                host: Optional[str] = None, api_key: Optional[str] = None) -> Sandbox:
        """An existing sandbox (SandboxNotFound if there is none); not deleted on exit."""
        owns = client is None
        c = client if client is not None else Client(host, api_key=api_key)
        try:
            info = c.get(sandbox_id)
        except BaseException:
            if owns:
                c.close()
            raise
        return cls(c, info, delete_on_exit=False, owns_client=owns)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Deletes the sandbox if this handle made it (see delete_on_exit), then closes the
        client if the handle made that too."""
        try:
            if self.delete_on_exit:
                self.delete()
        finally:
            if self._owns_client:
                self.client.close()

    def delete(self) -> None:
        """Deletes the sandbox now (a sandbox already gone is not an error here)."""
        try:
            self.client.delete(self.id)
        except SandboxNotFound:
            pass
        self.delete_on_exit = False

    def refresh(self) -> SandboxInfo:
        """Fetches the sandbox's state anew (network counters, active execs...)."""
        self.info = self.client.get(self.id)
        return self.info

    # -- containers -------------------------------------------------------------------------

    def container(self, name: str) -> Container:
        """Container `name` of this sandbox, to run commands and move files there (each call
        says ContainerNotFound if it has none by that name)."""
        _api.in_container("", name)  # the name's checks, at once
        return Container(self.client, self.id, name)

    def containers(self) -> list[ContainerInfo]:
        """Its containers: each one's state, main process, restarts and last exit."""
        return self.client.containers(self.id)

    def add_container(self, request: ContainerRequest) -> Container:
        """Adds a container to this running sandbox and returns it once it is ready (a
        namespace sandbox, or a microVM created with `container_slots`; ContainerNotReady
        when it does not get ready, Conflict when the name is in use or no slot is free)."""
        info = self.client.add_container(self.id, request)
        return Container(self.client, self.id, info.name)


class Container(Root):
    """One of a sandbox's containers: commands, files, signals and stats there
    (`?container=NAME`), its state and its log."""

    def __init__(self, client: Client, sandbox_id: str, name: str) -> None:
        super().__init__(client, sandbox_id, name)
        self.name = name

    def __repr__(self) -> str:
        return f"Container({self.id!r}, {self.name!r})"

    def info(self) -> ContainerInfo:
        """Its state, main process, restarts and last exit (ContainerNotFound if the
        sandbox has no such container)."""
        for info in self.client.containers(self.id):
            if info.name == self.name:
                return info
        raise ContainerNotFound(404, "container_not_found",
                                f"sandbox {self.id} has no container {self.name!r}")

    def logs(self) -> ContainerLog:
        """Its main process's output, every run of it (the latest MiB)."""
        return self.client.container_logs(self.id, self.name)

    def remove(self) -> None:
        """Removes it from the sandbox: it ends with every process in it, and is not started
        again; the sandbox and its other containers run on."""
        self.client.remove_container(self.id, self.name)
