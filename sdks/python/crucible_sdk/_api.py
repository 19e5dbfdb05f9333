"""The daemon's endpoints as data: method, path, body and how to read the answer.

Both clients (blocking and asyncio) send exactly these, so the two cannot drift apart; and the
checks on what a caller passes (a command that is a string of bytes, a timeout out of range)
live here once, failing with TypeError or ValueError before anything is sent.
"""

from __future__ import annotations

import json
import os
import signal as _signal
from dataclasses import dataclass
from functools import lru_cache
from typing import (IO, Any, Callable, Dict, Generic, List, Mapping, Optional, Sequence, Tuple,
                    Type, TypeVar, Union)
from urllib.parse import quote, urlencode

from . import codec, errors
from .errors import NotFound, ProtocolError
from .models import (CacheInfo, CacheList, CacheMount, ContainerInfo, ContainerList,
                     ContainerRequest, CreateSandbox, ExecList, ExecRequest, ExecStatus,
                     FilesPutResult, ImageInfo, ImageList, ImagesPruned, NetworkRequest,
                     OnDisconnect, Rlimit, SandboxInfo, SandboxList, SandboxStats,
                     SharedMount, TerminalSize, VolumeMount)
from .result import ContainerLog, parse_log

T = TypeVar("T")

JSON = "application/json"
TAR = "application/x-tar"
MAX_TIMEOUT_S = 604_800

Command = Union[str, Sequence[str]]
SignalLike = Union[int, _signal.Signals]
#: A terminal's size: `(rows, cols)`, as `stty size` prints it, or a TerminalSize.
TtySize = Union[Tuple[int, int], TerminalSize]
#: A terminal dimension is a u16 on the wire.
MAX_TERMINAL_DIMENSION = 65_535


@dataclass(frozen=True)
class Call(Generic[T]):
    method: str
    target: str
    parse: Callable[[bytes], T]
    body: Optional[bytes] = None
    content_type: str = JSON
    #: What a 404 not_found means here when it is not the sandbox that is missing.
    not_found: Optional[Type[NotFound]] = None

    @property
    def headers(self) -> List[tuple[str, str]]:
        return [("Content-Type", self.content_type)] if self.body is not None else []


def body_size(f: IO[bytes]) -> Optional[int]:
    """The bytes left in a seekable file (sent with Content-Length), else None (chunked)."""
    try:
        here = f.tell()
        end = f.seek(0, os.SEEK_END)
        f.seek(here)
        return end - here
    except (OSError, ValueError, AttributeError):
        return None


def load_json(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError as e:
        raise ProtocolError(f"the daemon's answer is not JSON: {data[:200]!r}") from e


def parse_with(load: Callable[[Any], T]) -> Callable[[bytes], T]:
    def parse(data: bytes) -> T:
        value = load_json(data)
        try:
            return load(value)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ProtocolError(f"unexpected answer from the daemon ({e!r}): "
                                f"{data[:200]!r}") from e
    return parse


def no_body(data: bytes) -> None:
    return None


def text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


# One encoder for every body: json.dumps with arguments builds a new one per call.
_encode = json.JSONEncoder(separators=(",", ":")).encode


def json_body(value: Mapping[str, Any]) -> bytes:
    return _encode(value).encode()


def bare_exec_body(cmd: List[str]) -> bytes:
    """The ExecRequest of a command with no other setting."""
    return b'{"cmd":' + _encode(cmd).encode() + b"}"


def exec_body(request: ExecRequest) -> bytes:
    """The ExecRequest's JSON; a bare command (run()'s usual case) skips the model's walk."""
    r = request
    if (not r.env and not r.cwd and not r.timeout_s and r.user is None and not r.group_add
            and not r.rlimits and r.exec_id is None and r.on_disconnect is None and not r.tty
            and r.tty_size is None):
        return bare_exec_body(r.cmd)
    return _encode(r.to_dict()).encode()


# -- paths --------------------------------------------------------------------------------


def _seg(value: str, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string, got {value!r}")
    return quote(value, safe="")


def _image_seg(name: str) -> str:
    _seg(name, "image name")
    return quote(name, safe=":/")


def sandbox_path(sandbox_id: str, tail: str = "") -> str:
    return f"/sandboxes/{_seg(sandbox_id, 'sandbox id')}{tail}"


def exec_path(sandbox_id: str, exec_id: str, tail: str = "") -> str:
    return sandbox_path(sandbox_id, f"/execs/{_seg(exec_id, 'exec_id')}{tail}")


def in_container(target: str, container: Optional[str]) -> str:
    """`target` addressed to one of the sandbox's containers (`?container=NAME`); as it is
    for None, the sandbox's own root."""
    if container is None:
        return target
    return f"{target}{'&' if '?' in target else '?'}container={_seg(container, 'container')}"


@lru_cache(maxsize=1024)
def exec_target(sandbox_id: str, interactive: bool = False,
                container: Optional[str] = None) -> str:
    return in_container(sandbox_path(sandbox_id, "/exec?stdin=1" if interactive else "/exec"),
                        container)


def attach_target(sandbox_id: str, exec_id: str, offset: int,
                  container: Optional[str] = None) -> str:
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise ValueError(f"offset must be a non-negative int, got {offset!r}")
    return in_container(exec_path(sandbox_id, exec_id, f"/attach?offset={offset}"), container)


def files_target(sandbox_id: str, path: str, container: Optional[str] = None) -> str:
    if not isinstance(path, str) or not path.startswith("/"):
        raise ValueError(f"a guest path must be absolute, got {path!r}")
    return in_container(sandbox_path(sandbox_id, "/files?path=" + quote(path, safe="/")),
                        container)


def image_import_target(name: str) -> str:
    return "/images?name=" + _seg(name, "image name")


# -- requests -----------------------------------------------------------------------------


def create_request(*, image: Optional[str] = None, memory_mib: Optional[int] = None,
                   vcpus: Optional[int] = None,
                   network: Union[Sequence[str], NetworkRequest, None] = None,
                   caches: Sequence[CacheMount] = (), volumes: Sequence[VolumeMount] = (),
                   disk_mib: Optional[int] = None, env: Optional[Mapping[str, str]] = None,
                   labels: Optional[Mapping[str, str]] = None, ttl_s: Optional[int] = None,
                   user: Optional[str] = None, backend: Optional[str] = None,
                   containers: Sequence[ContainerRequest] = (),
                   shared: Sequence[SharedMount] = (),
                   container_slots: Optional[int] = None,
                   share_process_namespace: bool = False,
                   hostname: Optional[str] = None) -> CreateSandbox:
    """A CreateSandbox from keyword arguments; `network` may be the list of allow rules."""
    if isinstance(network, str):
        raise TypeError("network takes a list of allow rules, e.g. ['pypi.org:443']")
    if network is not None and not isinstance(network, NetworkRequest):
        network = NetworkRequest(allow=_strings(network, "network"))
    for cache in caches:
        if not isinstance(cache, CacheMount):
            raise TypeError(f"caches takes CacheMount(name, path[, size_mib]), got {cache!r}")
    for volume in volumes:
        if not isinstance(volume, VolumeMount):
            raise TypeError(f"volumes takes VolumeMount(name, path), got {volume!r}")
    for container in containers:
        if not isinstance(container, ContainerRequest):
            raise TypeError("containers takes ContainerRequest(name, image=..., command=...), "
                            f"got {container!r}")
    for mount in shared:
        if not isinstance(mount, SharedMount):
            raise TypeError(f"shared takes SharedMount(name, path), got {mount!r}")
    if backend is not None and backend not in ("microvm", "namespace", "process"):
        raise ValueError(f"backend must be 'microvm' or 'namespace', got {backend!r}")
    return CreateSandbox(
        image=image, memory_mib=_opt_int(memory_mib, "memory_mib"),
        vcpus=_opt_int(vcpus, "vcpus"), network=network, caches=list(caches),
        volumes=list(volumes), disk_mib=_opt_int(disk_mib, "disk_mib"),
        env=_str_map(env, "env"), labels=_str_map(labels, "labels"),
        ttl_s=_opt_int(ttl_s, "ttl_s"), user=user,
        backend=backend,  # type: ignore[arg-type]  # checked against BackendKind above
        containers=list(containers), shared=list(shared),
        container_slots=_opt_int(container_slots, "container_slots"),
        share_process_namespace=True if share_process_namespace else None,
        hostname=hostname,
    )


def command(cmd: Command) -> List[str]:
    """A string is a shell command line (`sh -c`); a sequence is the argv itself."""
    if isinstance(cmd, str):
        if not cmd.strip():
            raise ValueError("the command line is empty")
        return ["sh", "-c", cmd]
    if isinstance(cmd, (bytes, bytearray)):
        raise TypeError("cmd must be a str (run by sh -c) or a sequence of str, not bytes")
    if type(cmd) is list and all(type(a) is str for a in cmd):
        argv = list(cmd)
    else:
        argv = _strings(cmd, "cmd")
    if not argv or not argv[0]:
        raise ValueError(f"cmd must name a program, got {argv!r}")
    return argv


def exec_request(cmd: Command, *, env: Optional[Mapping[str, str]] = None,
                 cwd: Optional[str] = None, timeout: Optional[int] = None,
                 user: Optional[str] = None, group_add: Optional[Sequence[str]] = None,
                 rlimits: Optional[Sequence[Rlimit]] = None, exec_id: Optional[str] = None,
                 on_disconnect: Optional[OnDisconnect] = None, tty: bool = False,
                 tty_size: Optional[TtySize] = None) -> ExecRequest:
    if timeout is not None:
        if not isinstance(timeout, int) or isinstance(timeout, bool):
            raise TypeError(f"timeout is whole seconds (an int), got {timeout!r}")
        if not 0 <= timeout <= MAX_TIMEOUT_S:
            raise ValueError(f"timeout must be 0 to {MAX_TIMEOUT_S} s, got {timeout}")
    if cwd is not None and cwd and not cwd.startswith("/"):
        raise ValueError(f"cwd must be absolute, got {cwd!r}")
    if on_disconnect not in (None, "keep", "kill"):
        raise ValueError(f"on_disconnect must be 'keep' or 'kill', got {on_disconnect!r}")
    for limit in rlimits or ():
        if not isinstance(limit, Rlimit):
            raise TypeError(f"rlimits takes Rlimit(type, soft, hard), got {limit!r}")
    if not isinstance(tty, bool):
        raise TypeError(f"tty must be a bool, got {tty!r}")
    size = None
    if tty_size is not None:
        if not tty:
            raise ValueError("tty_size sizes a terminal, and only a command started with "
                             "tty=True has one")
        size = terminal_size(tty_size, "tty_size")
    return ExecRequest(
        cmd=command(cmd), env=_str_map(env, "env") if env else {}, cwd=cwd or "",
        timeout_s=timeout or 0,
        user=user, group_add=_strings(group_add, "group_add") if group_add else [],
        rlimits=list(rlimits or ()), exec_id=exec_id, on_disconnect=on_disconnect,
        tty=True if tty else None, tty_size=size)


def terminal_dimension(value: Any, what: str) -> int:
    """A terminal's rows or columns: an int from 0 to 65535 (a u16 on the wire)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, got {value!r}")
    if not 0 <= value <= MAX_TERMINAL_DIMENSION:
        raise ValueError(f"{what} must be 0 to {MAX_TERMINAL_DIMENSION}, got {value}")
    return int(value)


def terminal_size(size: Any, what: str = "tty_size") -> TerminalSize:
    """A TerminalSize from `(rows, cols)` or a TerminalSize, each dimension checked."""
    if isinstance(size, TerminalSize):
        rows, cols = size.rows, size.cols
    elif isinstance(size, tuple) and len(size) == 2:
        rows, cols = size
    else:
        raise TypeError(f"{what} takes (rows, cols) or TerminalSize(rows=..., cols=...), "
                        f"got {size!r}")
    return TerminalSize(rows=terminal_dimension(rows, f"{what} rows"),
                        cols=terminal_dimension(cols, f"{what} cols"))


def resize_frame(rows: int, cols: int) -> bytes:
    """The resize frame for a terminal of `rows` by `cols`: its payload is the TerminalSize
    JSON, `{"rows":R,"cols":C}`."""
    rows = terminal_dimension(rows, "rows")
    cols = terminal_dimension(cols, "cols")
    return codec.encode_frame(codec.RESIZE, b'{"rows":%d,"cols":%d}' % (rows, cols))


def signal_number(sig: SignalLike) -> int:
    if isinstance(sig, bool) or not isinstance(sig, int):
        raise TypeError(f"signal must be an int or signal.Signals, got {sig!r}")
    if not 1 <= int(sig) <= 64:
        raise ValueError(f"signal must be 1 to 64, got {int(sig)}")
    return int(sig)


def _strings(values: Any, what: str) -> List[str]:
    if isinstance(values, (str, bytes)):
        raise TypeError(f"{what} must be a sequence of str, not a single {type(values).__name__}")
    out = list(values)
    for v in out:
        if not isinstance(v, str):
            raise TypeError(f"{what} must hold only str, got {v!r}")
    return out


def _str_map(values: Optional[Mapping[str, str]], what: str) -> Dict[str, str]:
    out = dict(values or {})
    for k, v in out.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError(f"{what} must map str to str, got {k!r}: {v!r}")
    return out


def _opt_int(value: Optional[int], what: str) -> Optional[int]:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise TypeError(f"{what} must be an int, got {value!r}")
    return value


# -- calls --------------------------------------------------------------------------------


def health() -> Call[Dict[str, Any]]:
    return Call("GET", "/healthz", parse_with(dict))


def metrics() -> Call[str]:
    return Call("GET", "/metrics", text)


def openapi() -> Call[Dict[str, Any]]:
    return Call("GET", "/openapi.json", parse_with(dict))


def create_sandbox(request: CreateSandbox) -> Call[SandboxInfo]:
    return Call("POST", "/sandboxes", parse_with(SandboxInfo.from_dict),
                json_body(request.to_dict()))


def list_sandboxes() -> Call[List[SandboxInfo]]:
    return Call("GET", "/sandboxes", parse_with(lambda v: SandboxList.from_dict(v).sandboxes))


def get_sandbox(sandbox_id: str) -> Call[SandboxInfo]:
    return Call("GET", sandbox_path(sandbox_id), parse_with(SandboxInfo.from_dict))


def delete_sandbox(sandbox_id: str) -> Call[None]:
    return Call("DELETE", sandbox_path(sandbox_id), no_body)


def signal(sandbox_id: str, sig: SignalLike, exec_id: Optional[str] = None,
           container: Optional[str] = None) -> Call[None]:
    body: Dict[str, Any] = {"signal": signal_number(sig)}
    if exec_id is not None:
        body["exec_id"] = exec_id
    return Call("POST", in_container(sandbox_path(sandbox_id, "/signal"), container), no_body,
                json_body(body), not_found=errors.ExecNotFound if exec_id is not None else None)


def stats(sandbox_id: str, container: Optional[str] = None) -> Call[SandboxStats]:
    return Call("GET", in_container(sandbox_path(sandbox_id, "/stats"), container),
                parse_with(SandboxStats.from_dict))


def execs(sandbox_id: str, container: Optional[str] = None) -> Call[List[ExecStatus]]:
    return Call("GET", in_container(sandbox_path(sandbox_id, "/execs"), container),
                parse_with(lambda v: ExecList.from_dict(v).execs))


def exec_status(sandbox_id: str, exec_id: str,
                container: Optional[str] = None) -> Call[ExecStatus]:
    return Call("GET", in_container(exec_path(sandbox_id, exec_id), container),
                parse_with(ExecStatus.from_dict), not_found=errors.ExecNotFound)


def containers(sandbox_id: str) -> Call[List[ContainerInfo]]:
    return Call("GET", sandbox_path(sandbox_id, "/containers"),
                parse_with(lambda v: ContainerList.from_dict(v).containers))


def add_container(sandbox_id: str, request: ContainerRequest) -> Call[ContainerInfo]:
    if not isinstance(request, ContainerRequest):
        raise TypeError("add_container takes ContainerRequest(name, image=..., command=...), "
                        f"got {request!r}")
    return Call("POST", sandbox_path(sandbox_id, "/containers"),
                parse_with(ContainerInfo.from_dict), json_body(request.to_dict()))


def remove_container(sandbox_id: str, name: str) -> Call[None]:
    return Call("DELETE", sandbox_path(sandbox_id, f"/containers/{_seg(name, 'container')}"),
                no_body)


def container_logs(sandbox_id: str, name: str) -> Call[ContainerLog]:
    return Call("GET", sandbox_path(sandbox_id, f"/containers/{_seg(name, 'container')}/logs"),
                parse_log)


def caches() -> Call[List[CacheInfo]]:
    return Call("GET", "/caches", parse_with(lambda v: CacheList.from_dict(v).caches))


def delete_cache(name: str) -> Call[None]:
    return Call("DELETE", "/caches/" + _seg(name, "cache name"), no_body,
                not_found=errors.CacheNotFound)


def clear_caches() -> Call[List[CacheInfo]]:
    return Call("DELETE", "/caches", parse_with(lambda v: CacheList.from_dict(v).caches))


def images() -> Call[List[ImageInfo]]:
    return Call("GET", "/images", parse_with(lambda v: ImageList.from_dict(v).images))


def image(name: str) -> Call[ImageInfo]:
    # Image names may hold ':' and '/' (`rust:1.80`); the route takes the rest of the path.
    return Call("GET", "/images/" + _image_seg(name),
                parse_with(ImageInfo.from_dict), not_found=errors.ImageNotFound)


def delete_image(name: str) -> Call[None]:
    return Call("DELETE", "/images/" + _image_seg(name), no_body,
                not_found=errors.ImageNotFound)


def prune_images(unused_for_s: int = 0, prefix: str = "") -> Call[ImagesPruned]:
    query = urlencode({"unused_for_s": unused_for_s, "prefix": prefix})
    return Call("DELETE", f"/images?{query}", parse_with(ImagesPruned.from_dict))


parse_image = parse_with(ImageInfo.from_dict)
parse_put = parse_with(FilesPutResult.from_dict)
