"""A client for the crucible API, standard library only.

    from crucible_sdk import Client
    c = Client()                               # CRUCIBLE_HOST, else the local daemon's socket
    sb = c.create()
    out = c.exec(sb["id"], ["uname", "-a"])
    print(out.stdout.decode(), out.result["exit_code"])
    c.delete(sb["id"])
"""

from __future__ import annotations

import http.client
import io
import json
import os
import socket
import tarfile
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import IO, Dict, Iterator, List, Optional, Tuple, Union

from . import codec

DEFAULT_SOCKET = "/run/crucible/crucible.sock"


class CrucibleError(Exception):
    """The daemon answered with an error envelope (or could not be reached: status 0)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{message} (HTTP {status}, {code})" if status else message)
        self.status = status
        self.code = code
        self.message = message


@dataclass
class ExecOutput:
    stdout: bytes = b""
    stderr: bytes = b""
    result: Dict = field(default_factory=dict)
    #: The command's exec_id (given, or made up by the daemon): what `attach` takes.
    exec_id: str = ""

    @property
    def exit_code(self) -> int:
        return self.result.get("exit_code", -1)


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: Optional[float] = None) -> None:
        super().__init__("crucible", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if self.timeout is not None:
            sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


def parse_host(host: Optional[str]) -> Tuple[str, str]:
    """("unix", path) or ("tcp", "host:port")."""
    host = host or os.environ.get("CRUCIBLE_HOST") or DEFAULT_SOCKET
    if host.startswith("http://"):
        authority = host[len("http://") :].rstrip("/")
        if not authority or "/" in authority:
            raise ValueError(f"invalid daemon address {host!r}")
        return "tcp", authority
    if host.startswith("https://"):
        raise ValueError("TLS is not supported; put a proxy in front")
    if host.startswith("unix:"):
        host = host[len("unix:") :]
    return "unix", host


def _frames_to_events(frame: codec.Frame):
    if frame.type == codec.EXIT:
        return ("exit", json.loads(frame.payload))
    if frame.type == codec.STDOUT:
        return ("stdout", frame.payload)
    if frame.type == codec.STDERR:
        return ("stderr", frame.payload)
    raise codec.DecodeError("unknown_type", f"unexpected {frame.type_name} frame from the daemon")


_EXEC_OPTIONS = ("user", "group_add", "rlimits", "exec_id", "on_disconnect")


def _events(response: http.client.HTTPResponse) -> Iterator[Tuple[str, object]]:
    """A frame stream's events; the connection is closed when the iteration ends or stops
    (a command that outlives its connection then runs on)."""
    try:
        decoder = codec.Decoder(response=True)
        while True:
            chunk = response.read1(65536) if hasattr(response, "read1") else response.read(65536)
            if not chunk:
                break
            for frame in decoder.feed(chunk):
                yield _frames_to_events(frame)
        decoder.close()
    finally:
        response.close()


def _collect(response: http.client.HTTPResponse,
             events: Iterator[Tuple[str, object]]) -> ExecOutput:
    out = ExecOutput(exec_id=response.getheader("X-Crucible-Exec-Id") or "")
    stdout, stderr = io.BytesIO(), io.BytesIO()
    for kind, value in events:
        if kind == "stdout":
            stdout.write(value)
        elif kind == "stderr":
            stderr.write(value)
        else:
            out.result = value
    out.stdout, out.stderr = stdout.getvalue(), stderr.getvalue()
    return out


def _request_body(cmd: List[str], env, cwd: str, timeout_s: int, options: Dict) -> bytes:
    """The ExecRequest. `options` may hold `user` ("uid[:gid]" or "name[:group]"), `group_add`
    (["wheel", "4242"]), `rlimits`
    ([{"type": "RLIMIT_NOFILE", "soft": 1024, "hard": 4096}]) and `exec_id` (a name for
    `signal(..., exec_id=...)`); None leaves one out."""
    unknown = set(options) - set(_EXEC_OPTIONS)
    if unknown:
        raise TypeError(f"unknown exec options {sorted(unknown)}: expected {_EXEC_OPTIONS}")
    body = {"cmd": list(cmd), "env": dict(env or {}), "cwd": cwd, "timeout_s": timeout_s}
    body.update({k: v for k, v in options.items() if v is not None})
    return json.dumps(body).encode()


class Session:
    """An interactive exec over a hijacked connection: send stdin, read events."""

    def __init__(self, sock: socket.socket, leftover: bytes) -> None:
        self._sock = sock
        self._decoder = codec.Decoder(response=True)
        self._pending = [_frames_to_events(f) for f in self._decoder.feed(leftover)]
        self._done = False

    def send_stdin(self, data: bytes) -> None:
        if data:
            self._sock.sendall(codec.encode_frames(codec.STDIN, data))

    def close_stdin(self) -> None:
        self._sock.sendall(codec.encode_frame(codec.STDIN_CLOSE))

    def events(self) -> Iterator[Tuple[str, object]]:
        """("stdout", bytes), ("stderr", bytes) ..., then ("exit", result dict)."""
        while True:
            while self._pending:
                event = self._pending.pop(0)
                yield event
                if event[0] == "exit":
                    return
            if self._done:
                return
            chunk = self._sock.recv(65536)
            if not chunk:
                self._done = True
                self._decoder.close()
                return
            self._pending.extend(_frames_to_events(f) for f in self._decoder.feed(chunk))

    def close(self) -> None:
        """Closes the connection (which kills the command if it still runs)."""
        self._sock.close()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Client:
    """A client of one crucible daemon (`host`: a Unix socket path, `unix:PATH` or
    `http://host:port`; default `$CRUCIBLE_HOST`, else the local daemon's socket)."""

    def __init__(self, host: Optional[str] = None, api_key: Optional[str] = None,
                 timeout: Optional[float] = None) -> None:
        self.kind, self.address = parse_host(host)
        self.api_key = api_key if api_key is not None else os.environ.get("CRUCIBLE_API_KEY")
        self.timeout = timeout

    # -- plumbing -------------------------------------------------------------------------

    def _connection(self) -> http.client.HTTPConnection:
        if self.kind == "unix":
            return _UnixHTTPConnection(self.address, timeout=self.timeout)
        host, _, port = self.address.rpartition(":")
        return http.client.HTTPConnection(host, int(port), timeout=self.timeout)

    def _headers(self, extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
        headers = dict(extra or {})
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def _open(self, method: str, path: str, body=None, headers=None) -> http.client.HTTPResponse:
        conn = self._connection()
        try:
            conn.request(method, path, body=body, headers=self._headers(headers))
        except OSError as e:
            raise CrucibleError(0, "unreachable",
                                f"cannot connect to the crucible daemon at {self.kind}:{self.address}: {e}") from e
        response = conn.getresponse()
        if response.status >= 400:
            raise self._error(response.status, response.read())
        return response

    @staticmethod
    def _error(status: int, body: bytes) -> CrucibleError:
        try:
            envelope = json.loads(body)
            return CrucibleError(status, envelope["code"], envelope["message"])
        except (ValueError, KeyError, TypeError):
            return CrucibleError(status, "unknown", body.decode(errors="replace").strip())

    def _json(self, method: str, path: str, value=None):
        body = None if value is None else json.dumps(value).encode()
        headers = {"Content-Type": "application/json"} if body is not None else {}
        response = self._open(method, path, body=body, headers=headers)
        data = response.read()
        return json.loads(data) if data else None

    @staticmethod
    def _sandbox_path(sandbox_id: str, tail: str = "") -> str:
        return f"/sandboxes/{urllib.parse.quote(sandbox_id, safe='')}{tail}"

    # -- sandboxes --------------------------------------------------------------------------

    def health(self) -> Dict:
        return self._json("GET", "/healthz")

    def create(self, allow: Optional[List[str]] = None, **settings) -> Dict:
        """POST /sandboxes; settings: memory_mib, vcpus, image, backend, ttl_s, env, labels,
        network ({"allow": [...]}), caches ([{"name", "path", "size_mib"?}]), volumes
        ([{"name", "path"}]), disk_mib. `allow=[...]` is short for network={"allow": [...]}:
        egress through the daemon's proxy to those hosts (none by default)."""
        if allow:
            settings["network"] = {"allow": list(allow)}
        return self._json("POST", "/sandboxes", settings)

    def list(self) -> List[Dict]:
        return self._json("GET", "/sandboxes")["sandboxes"]

    def get(self, sandbox_id: str) -> Dict:
        return self._json("GET", self._sandbox_path(sandbox_id))

    def delete(self, sandbox_id: str) -> None:
        self._open("DELETE", self._sandbox_path(sandbox_id)).read()

    def signal(self, sandbox_id: str, signal: int, exec_id: Optional[str] = None) -> None:
        """POST …/signal: `signal` to every process of the sandbox but its agent, or with
        `exec_id` to that running command's process group only (404 when none runs)."""
        body: Dict[str, object] = {"signal": signal}
        if exec_id is not None:
            body["exec_id"] = exec_id
        self._open("POST", self._sandbox_path(sandbox_id, "/signal"),
                   body=json.dumps(body).encode(),
                   headers={"Content-Type": "application/json"}).read()

    def stats(self, sandbox_id: str) -> Dict:
        """GET …/stats: memory, CPU time and processes the sandbox uses now."""
        return self._json("GET", self._sandbox_path(sandbox_id, "/stats"))

    # -- caches -----------------------------------------------------------------------------

    def caches(self) -> List[Dict]:
        """GET /caches: the caller's named caches (all of them over the Unix socket)."""
        return self._json("GET", "/caches")["caches"]

    def delete_cache(self, name: str) -> None:
        """DELETE /caches/{name}; a cache in use raises CrucibleError (409)."""
        self._open("DELETE", f"/caches/{urllib.parse.quote(name, safe='')}").read()

    def clear_caches(self) -> List[Dict]:
        """DELETE /caches: deletes every cache of the caller's not in use; returns those kept."""
        return self._json("DELETE", "/caches")["caches"]

    # -- images -----------------------------------------------------------------------------

    def images(self) -> List[Dict]:
        """GET /images: the built-in image, then the caller's imported images."""
        return self._json("GET", "/images")["images"]

    def image(self, name: str) -> Dict:
        """GET /images/{name}."""
        return self._json("GET", f"/images/{urllib.parse.quote(name, safe='')}")

    def import_image(self, name: str, archive: Union[str, os.PathLike, bytes, IO[bytes]]) -> Dict:
        """POST /images?name=NAME: imports a `docker save` archive, an OCI archive or a rootfs
        tarball (gzip or not), given as a path, bytes or a binary file object (streamed).
        Returns the image; a bad archive raises CrucibleError (400 invalid_image, 413 too
        large). A directory is imported with `crucible image import`."""
        path = "/images?name=" + urllib.parse.quote(name, safe="")
        headers = {"Content-Type": "application/x-tar"}
        if isinstance(archive, (str, os.PathLike)):
            with open(archive, "rb") as f:
                headers["Content-Length"] = str(os.fstat(f.fileno()).st_size)
                return json.loads(self._open("POST", path, body=f, headers=headers).read())
        return json.loads(self._open("POST", path, body=archive, headers=headers).read())

    def prune_images(self, unused_for_s: int = 0, prefix: str = "") -> Dict:
        """DELETE /images: removes the caller's images no sandbox uses, idle `unused_for_s`
        seconds and named `prefix`...; returns {"removed": [names], "reclaimed_bytes": N}."""
        query = urllib.parse.urlencode({"unused_for_s": unused_for_s, "prefix": prefix})
        return self._json("DELETE", f"/images?{query}")

    def delete_image(self, name: str) -> None:
        """DELETE /images/{name}; an image in use raises CrucibleError (409)."""
        self._open("DELETE", f"/images/{urllib.parse.quote(name, safe='')}").read()

    # -- exec -------------------------------------------------------------------------------

    def _exec_response(self, sandbox_id: str, cmd: List[str], env, cwd: str, timeout_s: int,
                       options: Dict) -> http.client.HTTPResponse:
        return self._open("POST", self._sandbox_path(sandbox_id, "/exec"),
                          body=_request_body(cmd, env, cwd, timeout_s, options),
                          headers={"Content-Type": "application/json"})

    def exec_stream(self, sandbox_id: str, cmd: List[str], env=None, cwd: str = "",
                    timeout_s: int = 0, resumes: int = 5,
                    **options) -> Iterator[Tuple[str, object]]:
        """Runs a command; yields ("stdout", bytes) / ("stderr", bytes) as they arrive, then
        ("exit", result dict). `options`: `user`, `rlimits`, `exec_id`, `on_disconnect`
        ("keep", the default: the command runs on if this client goes away, and `attach`
        finds it; "kill") (see docs/api.md). When the connection breaks mid-stream and the
        command runs on, the stream re-attaches from the bytes already yielded, up to
        `resumes` times (waiting 0.2 s, 0.4 s, ... between tries); past that, or for a command
        that dies with its connection, codec.DecodeError or the connection's error is raised."""
        response = self._exec_response(sandbox_id, cmd, env, cwd, timeout_s, options)
        keeps = options.get("on_disconnect") != "kill"
        return self._resuming(sandbox_id, response, 0, resumes if keeps else 0)

    def exec(self, sandbox_id: str, cmd: List[str], env=None, cwd: str = "",
             timeout_s: int = 0, resumes: int = 5, **options) -> ExecOutput:
        """Runs a command and collects its output (`resumes` and `options` as for
        exec_stream)."""
        response = self._exec_response(sandbox_id, cmd, env, cwd, timeout_s, options)
        keeps = options.get("on_disconnect") != "kill"
        return _collect(response, self._resuming(sandbox_id, response, 0, resumes if keeps else 0))

    def _resuming(self, sandbox_id: str, response: http.client.HTTPResponse, offset: int,
                  resumes: int) -> Iterator[Tuple[str, object]]:
        """`response`'s events from output byte `offset`; when the connection breaks,
        re-attaches to its command from the bytes already yielded, up to `resumes` times."""
        exec_id = response.getheader("X-Crucible-Exec-Id") or ""
        received = offset
        tries = 0
        while True:
            try:
                for kind, value in _events(response):
                    if kind != "exit":
                        received += len(value)  # type: ignore[arg-type]
                    yield kind, value
                return
            except (codec.DecodeError, OSError, http.client.HTTPException) as broken:
                last: Exception = broken
            while True:
                if not exec_id or tries >= resumes:
                    raise last
                tries += 1
                time.sleep(0.1 * 2 ** tries)
                try:
                    response = self._attach_response(sandbox_id, exec_id, received)
                    break
                except CrucibleError as e:
                    if e.status:  # the daemon answered: the command is not there to follow
                        raise
                    last = e

    # -- commands that outlive their connection ---------------------------------------------

    def execs(self, sandbox_id: str) -> List[Dict]:
        """GET /sandboxes/{id}/execs: the commands that can be found by exec_id (running, or
        ended with a result nobody collected yet), oldest first."""
        return self._json("GET", self._sandbox_path(sandbox_id, "/execs"))["execs"]

    def exec_status(self, sandbox_id: str, exec_id: str) -> Dict:
        """GET /sandboxes/{id}/execs/{exec_id}: one command's status (`state`, `attached`,
        `output_bytes`, `output_kept_from`, and `result` once it has ended)."""
        return self._json("GET", self._exec_path(sandbox_id, exec_id))

    def attach_stream(self, sandbox_id: str, exec_id: str,
                      offset: int = 0) -> Iterator[Tuple[str, object]]:
        """POST /sandboxes/{id}/execs/{exec_id}/attach: re-attaches to a command whose
        connection dropped, from output byte `offset` (the stdout and stderr bytes already
        received); yields events as exec_stream does. The exit result's
        `output_dropped_bytes` counts what the agent no longer kept."""
        response = self._attach_response(sandbox_id, exec_id, offset)
        return self._resuming(sandbox_id, response, offset, 5)

    def attach(self, sandbox_id: str, exec_id: str, offset: int = 0) -> ExecOutput:
        """attach_stream, collected."""
        response = self._attach_response(sandbox_id, exec_id, offset)
        return _collect(response, self._resuming(sandbox_id, response, offset, 5))

    def _attach_response(self, sandbox_id: str, exec_id: str,
                         offset: int) -> http.client.HTTPResponse:
        return self._open("POST", f"{self._exec_path(sandbox_id, exec_id)}/attach?offset={int(offset)}")

    def _exec_path(self, sandbox_id: str, exec_id: str) -> str:
        return self._sandbox_path(sandbox_id, f"/execs/{urllib.parse.quote(exec_id, safe='')}")

    def interactive(self, sandbox_id: str, cmd: List[str], env=None, cwd: str = "",
                    timeout_s: int = 0, **options) -> Session:
        """POST …/exec?stdin=1: the connection becomes a raw two-way frame stream."""
        body = _request_body(cmd, env, cwd, timeout_s, options)
        if self.kind == "unix":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            target, host_header = self.address, "crucible"
        else:
            host, _, port = self.address.rpartition(":")
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            target, host_header = (host, int(port)), self.address
        try:
            sock.connect(target)
        except OSError as e:
            sock.close()
            raise CrucibleError(0, "unreachable",
                                f"cannot connect to the crucible daemon at {self.kind}:{self.address}: {e}") from e
        head = [f"POST {self._sandbox_path(sandbox_id, '/exec')}?stdin=1 HTTP/1.1",
                f"Host: {host_header}", "Content-Type: application/json",
                f"Content-Length: {len(body)}"]
        head += [f"{k}: {v}" for k, v in self._headers().items()]
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = sock.recv(4096)
            if not chunk:
                sock.close()
                raise CrucibleError(0, "protocol", "the daemon closed the connection before answering")
            buf += chunk
        head_bytes, _, rest = buf.partition(b"\r\n\r\n")
        lines = head_bytes.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        if status != 200:
            length = 0
            for line in lines[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
            while len(rest) < length:
                chunk = sock.recv(length - len(rest))
                if not chunk:
                    break
                rest += chunk
            sock.close()
            raise self._error(status, rest)
        return Session(sock, rest)

    # -- files ------------------------------------------------------------------------------

    def put_files(self, sandbox_id: str, dest_dir: str,
                  source: Union[str, os.PathLike, bytes, IO[bytes]]) -> Dict:
        """Uploads a tar archive (bytes or a binary file object) or a local path (packed as a
        tar on the fly: a directory lands under dest_dir/<its name>)."""
        if isinstance(source, (str, os.PathLike)):
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as tar:
                tar.add(os.fspath(source), arcname=os.path.basename(os.path.normpath(source)))
            body = buf.getvalue()
        else:
            body = source
        path = self._sandbox_path(sandbox_id, "/files") + "?path=" + urllib.parse.quote(dest_dir)
        return json.loads(self._open("POST", path, body=body,
                                     headers={"Content-Type": "application/x-tar"}).read())

    def get_file(self, sandbox_id: str, path: str, out: Optional[IO[bytes]] = None) -> Optional[bytes]:
        """Downloads one file: returns its bytes, or streams them into `out`."""
        url = self._sandbox_path(sandbox_id, "/files") + "?path=" + urllib.parse.quote(path)
        response = self._open("GET", url)
        if out is None:
            return response.read()
        while True:
            chunk = response.read(65536)
            if not chunk:
                return None
            out.write(chunk)
