"""asyncio streams to the daemon: connections, a keep-alive pool, response bodies.

The asyncio twin of _sync_io, over the same Sans-I/O HTTP/1.1 (_http1), with the same rules:
an answer read to its end returns its connection to the pool, anything else closes it, and a
reused connection the daemon had closed while idle is retried once on a new one.
"""

from __future__ import annotations

import asyncio
import socket
from typing import IO, Awaitable, List, Optional, Tuple, TypeVar, Union

from .. import _http1
from .._address import Address
from ..errors import ConnectionFailed, ConnectionLost, ProtocolError, Timeout

T = TypeVar("T")
Body = Union[bytes, IO[bytes], None]
RECV_SIZE = 256 * 1024
# The StreamReader's buffer: large enough that a 64 MiB stream is read in big pieces.
LIMIT = 1024 * 1024


async def timed(aw: Awaitable[T], timeout: Optional[float], what: str) -> T:
    if timeout is None:
        return await aw
    try:
        return await asyncio.wait_for(aw, timeout)
    except asyncio.TimeoutError as e:
        raise Timeout(f"{what} timed out after {timeout} s") from e


async def open_stream(address: Address, timeout: Optional[float]
                      ) -> Tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    try:
        if address.is_unix:
            conn = asyncio.open_unix_connection(address.path, limit=LIMIT)
        else:
            conn = asyncio.open_connection(address.host, address.port, limit=LIMIT)
        reader, writer = await timed(conn, timeout, "connecting to the daemon")
    except OSError as e:
        raise ConnectionFailed(f"cannot connect to the crucible daemon at {address}: {e}") from e
    sock = writer.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return reader, writer


class AsyncConnection:
    __slots__ = ("reader", "writer", "buf", "reused", "timeout")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 timeout: Optional[float]) -> None:
        self.reader = reader
        self.writer = writer
        self.buf = b""
        self.reused = False
        self.timeout = timeout

    async def send(self, data: bytes) -> None:
        try:
            self.writer.write(data)
            await timed(self.writer.drain(), self.timeout, "sending to the daemon")
        except (OSError, RuntimeError) as e:
            raise ConnectionLost(f"sending to the daemon failed: {e}") from e

    async def recv(self) -> bytes:
        if self.buf:
            data, self.buf = self.buf, b""
            return data
        try:
            if self.timeout is None:
                return await self.reader.read(RECV_SIZE)
            return await timed(self.reader.read(RECV_SIZE), self.timeout, "reading from the daemon")
        except OSError as e:
            raise ConnectionLost(f"reading from the daemon failed: {e}") from e

    async def read_head(self) -> _http1.ResponseHead:
        buf, self.buf = self.buf, b""
        while True:
            end = buf.find(_http1.END_OF_HEAD)
            if end >= 0:
                self.buf = buf[end + 4:]
                return _http1.parse_head(buf[:end])
            if len(buf) > _http1.MAX_HEAD:
                raise ProtocolError("a response head over 64 KiB")
            data = await self.recv()
            if not data:
                raise ConnectionLost("the daemon closed the connection before answering")
            buf += data

    def close(self) -> None:
        try:
            self.writer.close()
        except (OSError, RuntimeError):
            pass


class AsyncResponse:
    __slots__ = ("head", "status", "_conn", "_pool", "_chunked", "_left", "_done")

    def __init__(self, head: _http1.ResponseHead, conn: AsyncConnection,
                 pool: Optional[AsyncPool]) -> None:
        self.head = head
        self.status = head.status
        self._conn: Optional[AsyncConnection] = conn
        self._pool = pool
        self._chunked = _http1.ChunkedDecoder() if head.chunked else None
        self._left = head.content_length
        self._done = False
        if head.status in (204, 304) or self._left == 0:
            self._finish()

    def header(self, name: str, default: str = "") -> str:
        return self.head.headers.get(name, default)

    async def read_some(self) -> bytes:
        while not self._done:
            conn = self._conn
            assert conn is not None
            data = await conn.recv()
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

    async def read(self) -> bytes:
        pieces: List[bytes] = []
        while True:
            piece = await self.read_some()
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
        conn, self._conn = self._conn, None
        self._done = True
        if conn is not None:
            conn.close()


class AsyncPool:
    """Idle connections of one event loop (an asyncio client is used from one loop)."""

    def __init__(self, address: Address, timeout: Optional[float], max_idle: int = 16) -> None:
        self.address = address
        self.timeout = timeout
        self.max_idle = max_idle
        self._idle: List[AsyncConnection] = []

    async def new(self) -> AsyncConnection:
        reader, writer = await open_stream(self.address, self.timeout)
        return AsyncConnection(reader, writer, self.timeout)

    def put(self, conn: AsyncConnection) -> None:
        conn.reused = True
        if len(self._idle) < self.max_idle and not conn.writer.is_closing():
            self._idle.append(conn)
        else:
            conn.close()

    def close(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    async def request(self, method: str, target: str, headers: _http1.Headers,
                      body: Body = None, body_length: Optional[int] = None,
                      read_timeout: Optional[float] = None) -> AsyncResponse:
        if isinstance(body, bytes):
            body_length = len(body)
        elif body is None:
            body_length = 0
        head = _http1.request_head(method, target, self.address.host_header, headers,
                                   body_length)
        conn = self._idle.pop() if self._idle else await self.new()
        for attempt in (0, 1):
            try:
                conn.timeout = self.timeout
                await self._send(conn, head, body, body_length)
                response_head = await conn.read_head()
                break
            except ConnectionLost:
                conn.close()
                if attempt or not conn.reused or not (body is None or isinstance(body, bytes)):
                    raise
                conn = await self.new()
            except BaseException:
                conn.close()
                raise
        conn.timeout = read_timeout
        return AsyncResponse(response_head, conn, self)

    @staticmethod
    async def _send(conn: AsyncConnection, head: bytes, body: Body,
                    length: Optional[int]) -> None:
        if body is None:
            await conn.send(head)
        elif isinstance(body, bytes):
            await conn.send(head + body)
        else:
            await conn.send(head)
            while True:
                piece = body.read(RECV_SIZE)
                if not piece:
                    break
                await conn.send(piece if length is not None else _http1.chunk(piece))
            if length is None:
                await conn.send(_http1.chunk(b""))
