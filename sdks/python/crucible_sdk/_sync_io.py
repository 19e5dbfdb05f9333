"""Blocking sockets to the daemon: connections, a keep-alive pool, and response bodies.

JSON calls and one-shot exec streams reuse idle connections (an exec's chunked body ends
cleanly, so its connection serves the next request); a connection whose answer was not read
to its end, or that said `Connection: close`, is closed instead of pooled, since its next bytes
would not be an answer's head.
"""

from __future__ import annotations

import socket
from typing import IO, Iterator, List, Optional, Tuple, Union

from . import _http1
from ._address import Address
from .errors import ConnectionFailed, ConnectionLost, ProtocolError, Timeout

Body = Union[bytes, IO[bytes], None]
# Reads land in a buffer kept per connection and are copied out at their size: `recv(n)`
# allocates n bytes first, and the allocator serves 256 KiB with mmap and munmap, which cost
# more than the read of a small answer (20 us against 4 here, twice per exec of `true`).
RECV_SIZE = 256 * 1024
# Interactive sessions read small pieces straight (below the allocator's mmap threshold).
SMALL_RECV = 64 * 1024
SEND_SIZE = 256 * 1024


def open_socket(address: Address, timeout: Optional[float]) -> socket.socket:
    try:
        if address.is_unix:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(timeout)
                sock.connect(address.path)
            except BaseException:
                sock.close()
                raise
        else:
            sock = socket.create_connection((address.host, address.port), timeout=timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError as e:
        raise ConnectionFailed(f"cannot connect to the crucible daemon at {address}: {e}") from e
    return sock


class Connection:
    """One socket and the bytes read from it but not yet consumed."""

    __slots__ = ("sock", "buf", "reused", "timeout", "_scratch", "_view")

    def __init__(self, sock: socket.socket, timeout: Optional[float]) -> None:
        self.sock = sock
        self.buf = b""
        self.reused = False
        self.timeout = timeout
        self._scratch = bytearray(RECV_SIZE)
        self._view = memoryview(self._scratch)

    def set_timeout(self, timeout: Optional[float]) -> None:
        if timeout != self.timeout:
            self.sock.settimeout(timeout)
            self.timeout = timeout

    def send(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except socket.timeout as e:
            raise Timeout(f"sending to the daemon timed out after {self.timeout} s") from e
        except OSError as e:
            raise ConnectionLost(f"sending to the daemon failed: {e}") from e

    def recv(self) -> bytes:
        """Buffered bytes first, then the socket's; b"" at EOF."""
        if self.buf:
            data, self.buf = self.buf, b""
            return data
        try:
            n = self.sock.recv_into(self._scratch)
        except socket.timeout as e:
            raise Timeout(f"the daemon sent nothing for {self.timeout} s") from e
        except OSError as e:
            raise ConnectionLost(f"reading from the daemon failed: {e}") from e
        return self._view[:n].tobytes()

    def read_head(self) -> _http1.ResponseHead:
        buf = self.buf
        self.buf = b""
        while True:
            end = buf.find(_http1.END_OF_HEAD)
            if end >= 0:
                self.buf = buf[end + 4:]
                return _http1.parse_head(buf[:end])
            if len(buf) > _http1.MAX_HEAD:
                raise ProtocolError("a response head over 64 KiB")
            data = self.recv()
            if not data:
                raise ConnectionLost(
                    "the daemon closed the connection before answering"
                    + (" (an idle kept-alive connection)" if self.reused and not buf else ""))
            buf += data

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class Response:
    """An answer whose body is read as it arrives; the connection goes back to its pool
    once the body has been read to its end."""

    __slots__ = ("head", "status", "_conn", "_pool", "_chunked", "_left", "_done")

    def __init__(self, head: _http1.ResponseHead, conn: Connection, pool: Optional[Pool]) -> None:
        self.head = head
        self.status = head.status
        self._conn: Optional[Connection] = conn
        self._pool = pool
        self._chunked = _http1.ChunkedDecoder() if head.chunked else None
        self._left = head.content_length
        self._done = False
        if head.status in (204, 304) or self._left == 0:
            self._finish()

    def header(self, name: str, default: str = "") -> str:
        return self.head.headers.get(name, default)

    def read_some(self) -> bytes:
        """The next piece of the body; b"" once it has ended (the connection is released)."""
        while not self._done:
            conn = self._conn
            assert conn is not None
            data = conn.recv()
            if self._chunked is not None:
                if not data:
                    self.close()
                    raise ConnectionLost("the connection closed inside a chunked body")
                pieces = self._chunked.feed(data)
                if self._chunked.done:
                    conn.buf = self._chunked.leftover
                    self._finish()
                if pieces:
                    return pieces[0] if len(pieces) == 1 else b"".join(pieces)
            elif self._left is not None:
                if not data:
                    self.close()
                    raise ConnectionLost(f"the connection closed {self._left} bytes before "
                                         "the end of the body")
                if len(data) > self._left:
                    conn.buf = data[self._left:]
                    data = data[:self._left]
                self._left -= len(data)
                if not self._left:
                    self._finish()
                return data
            else:
                if not data:
                    self._finish()
                    return b""
                return data
        return b""

    def read(self) -> bytes:
        pieces: List[bytes] = []
        while True:
            piece = self.read_some()
            if not piece:
                return b"".join(pieces)
            pieces.append(piece)

    def _finish(self) -> None:
        self._done = True
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._pool is not None and self.head.keep_alive and not self.head.until_close:
            self._pool.put(conn)
        else:
            conn.close()

    def close(self) -> None:
        """Drops the connection unless the body was read to its end."""
        conn, self._conn = self._conn, None
        self._done = True
        if conn is not None:
            conn.close()


class Pool:
    """Idle keep-alive connections to one daemon, safe to share between threads."""

    def __init__(self, address: Address, timeout: Optional[float], max_idle: int = 16) -> None:
        self.address = address
        self.timeout = timeout
        self.max_idle = max_idle
        self._idle: List[Connection] = []

    def get(self) -> Connection:
        # list.pop and list.append are atomic under the GIL: no lock on the hot path.
        try:
            return self._idle.pop()
        except IndexError:
            return self.new()

    def new(self) -> Connection:
        return Connection(open_socket(self.address, self.timeout), self.timeout)

    def put(self, conn: Connection) -> None:
        conn.reused = True
        if len(self._idle) < self.max_idle:
            self._idle.append(conn)
        else:
            conn.close()

    def close(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def request(self, method: str, target: str, headers: _http1.Headers, body: Body = None,
                body_length: Optional[int] = None,
                read_timeout: Optional[float] = None) -> Response:
        """Sends a request and reads its answer's head. A reused connection that turns out to
        have been closed by the daemon while idle (no byte of an answer came back) is retried
        once on a new one: the daemon had not read that request."""
        if isinstance(body, bytes):
            body_length = len(body)
        elif body is None:
            body_length = 0
        head = _http1.request_head(method, target, self.address.host_header, headers,
                                   body_length)
        return self.exchange(head, body, body_length, read_timeout)

    def exchange(self, head: bytes, body: Body, body_length: Optional[int],
                 read_timeout: Optional[float]) -> Response:
        """`request` with its head already built."""
        response_head, conn = self.exchange_head(head, body, body_length, read_timeout)
        return Response(response_head, conn, self)

    def exchange_head(self, head: bytes, body: Body, body_length: Optional[int],
                      read_timeout: Optional[float]) -> Tuple[_http1.ResponseHead, Connection]:
        """`exchange` up to the answer's head: the connection is the caller's to read the
        body from and to give back (`put`) once it has read it to its end."""
        conn = self.get()
        for attempt in (0, 1):
            try:
                conn.set_timeout(self.timeout)
                self._send(conn, head, body, body_length)
                response_head = conn.read_head()
                break
            except ConnectionLost:
                conn.close()
                if attempt or not conn.reused or not (body is None or isinstance(body, bytes)):
                    raise
                conn = self.new()
            except BaseException:
                conn.close()
                raise
        if read_timeout is not None or self.timeout is not None:
            conn.set_timeout(read_timeout)
        return response_head, conn

    @staticmethod
    def _send(conn: Connection, head: bytes, body: Body, length: Optional[int]) -> None:
        if body is None:
            conn.send(head)
        elif isinstance(body, bytes):
            # One write for head and small body: one packet, one wakeup of the daemon.
            conn.send(head + body if len(body) < 64 * 1024 else head)
            if len(body) >= 64 * 1024:
                conn.send(body)
        else:
            conn.send(head)
            while True:
                piece = body.read(SEND_SIZE)
                if not piece:
                    break
                conn.send(piece if length is not None else _http1.chunk(piece))
            if length is None:
                conn.send(_http1.chunk(b""))


def hijack(address: Address, timeout: Optional[float], head: bytes,
           body: bytes) -> Tuple[socket.socket, _http1.ResponseHead, bytes]:
    """Sends a request on a new connection whose answer turns it into a raw stream; returns
    the socket, the answer's head and the bytes read past it."""
    conn = Connection(open_socket(address, timeout), timeout)
    try:
        conn.send(head + body)
        response = conn.read_head()
    except BaseException:
        conn.close()
        raise
    return conn.sock, response, conn.buf


def read_error_body(sock: socket.socket, head: _http1.ResponseHead, rest: bytes) -> bytes:
    """The JSON error body of a refused hijack, whose connection is then closed."""
    length = head.content_length or 0
    try:
        while len(rest) < length:
            data = sock.recv(length - len(rest))
            if not data:
                break
            rest += data
    except OSError:
        pass
    finally:
        sock.close()
    return rest[:length]


def iter_body(response: Response) -> Iterator[bytes]:
    while True:
        piece = response.read_some()
        if not piece:
            return
        yield piece
