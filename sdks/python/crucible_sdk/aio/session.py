"""Interactive sessions on asyncio: the hijacked connection or the WebSocket, as the blocking
Session (crucible_sdk.session) has them."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING, Deque, List, Optional, Protocol, Union

from .. import _api, _http1, codec
from .._address import Address
from ..errors import ConnectionLost, CrucibleError, ProtocolError, from_response
from ..models import ExecResult
from ..result import Collector, Event, Exit, OutputCallback, RunResult, event_of
from ._io import RECV_SIZE, AsyncConnection, open_stream, timed

if TYPE_CHECKING:
    from .._ws import WsProtocol


class AsyncChannel(Protocol):
    exec_id: str

    async def send(self, data: bytes) -> None: ...

    async def recv(self) -> bytes: ...

    def closing_error(self) -> Optional[CrucibleError]: ...

    def close(self) -> None: ...


async def open_hijack(address: Address, target: str, headers: _http1.Headers, body: bytes,
                      timeout: Optional[float]) -> HijackChannel:
    reader, writer = await open_stream(address, timeout)
    conn = AsyncConnection(reader, writer, timeout)
    try:
        head = _http1.request_head("POST", target, address.host_header,
                                   [("Content-Type", "application/json"), *headers], len(body))
        await conn.send(head + body)
        response = await conn.read_head()
        if response.status != 200:
            rest = conn.buf
            length = response.content_length or 0
            while len(rest) < length:
                data = await conn.recv()
                if not data:
                    break
                rest += data
            raise from_response(response.status, rest[:length])
    except BaseException:
        conn.close()
        raise
    return HijackChannel(conn, response.get("x-crucible-exec-id"))


class HijackChannel:
    def __init__(self, conn: AsyncConnection, exec_id: str) -> None:
        self._conn = conn
        self.exec_id = exec_id

    async def send(self, data: bytes) -> None:
        await self._conn.send(data)

    async def recv(self) -> bytes:
        return await self._conn.recv()

    def closing_error(self) -> Optional[CrucibleError]:
        return None

    def close(self) -> None:
        self._conn.close()


async def open_websocket(address: Address, target: str, api_key: Optional[str], body: bytes,
                         timeout: Optional[float]) -> WebSocketChannel:
    from .._ws import WsProtocol

    ws = WsProtocol(address, target, api_key)
    reader, writer = await open_stream(address, timeout)
    channel = WebSocketChannel(ws, reader, writer, timeout)
    try:
        await channel.write(ws.outgoing())
        while not ws.handshake_done:
            channel.pending += ws.feed(await channel.read())
        error = ws.handshake_error()
        if error is not None:
            raise error
        await channel.write(ws.send_text(body))
    except BaseException:
        channel.close()
        raise
    return channel


class WebSocketChannel:
    def __init__(self, ws: WsProtocol, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, timeout: Optional[float]) -> None:
        self._ws = ws
        self._reader = reader
        self._writer = writer
        self._timeout = timeout
        self.pending: List[bytes] = []
        self.exec_id = ""

    async def write(self, data: bytes) -> None:
        try:
            self._writer.write(data)
            await timed(self._writer.drain(), self._timeout, "sending to the daemon")
        except (OSError, RuntimeError) as e:
            raise ConnectionLost(f"sending on the WebSocket failed: {e}") from e

    async def read(self) -> bytes:
        try:
            return await timed(self._reader.read(RECV_SIZE), self._timeout,
                               "reading the WebSocket")
        except OSError as e:
            raise ConnectionLost(f"the WebSocket broke: {e}") from e

    async def send(self, data: bytes) -> None:
        await self.write(self._ws.send_binary(data))

    async def recv(self) -> bytes:
        while not self.pending:
            if self._ws.eof:
                return b""
            try:
                data = await self.read()
            except ConnectionLost:
                if self._ws.close_code is None:
                    raise
                # After its Close the daemon may reset the socket: see the blocking channel.
                data = b""
            payloads = self._ws.feed(data)
            reply = self._ws.outgoing()
            if reply:
                try:
                    self._writer.write(reply)
                except (OSError, RuntimeError):
                    pass  # the daemon closes right after its Close: see crucible_sdk._ws
            self.pending += payloads
        data = b"".join(self.pending)
        self.pending = []
        return data

    def closing_error(self) -> Optional[CrucibleError]:
        return self._ws.closing_error()

    def close(self) -> None:
        if not self._ws.eof:
            try:
                self._writer.write(self._ws.send_close())
            except (OSError, RuntimeError):
                pass
        try:
            self._writer.close()
        except (OSError, RuntimeError):
            pass


class AsyncSession:
    """`await send()`, `await close_stdin()`, `async for event in session`, `await wait()`;
    `await resize(rows, cols)` when started with `tty=True`."""

    def __init__(self, channel: AsyncChannel, cmd: List[str], tty: bool = False) -> None:
        self._channel = channel
        self.cmd = cmd
        #: Whether the command runs on a terminal (started with `tty=True`).
        self.tty = tty
        self._decoder = codec.Decoder(response=True)
        self._pending: Deque[Event] = deque()
        self._ended = False
        self.result: Optional[ExecResult] = None

    @property
    def exec_id(self) -> str:
        return self._channel.exec_id

    async def send(self, data: Union[bytes, str]) -> None:
        if isinstance(data, str):
            data = data.encode()
        if data:
            await self._channel.send(codec.encode_frames(codec.STDIN, data))

    async def close_stdin(self) -> None:
        await self._channel.send(codec.encode_frame(codec.STDIN_CLOSE))

    async def resize(self, rows: int, cols: int) -> None:
        """As `Session.resize`."""
        frame = _api.resize_frame(rows, cols)
        if not self.tty:
            raise ValueError("resize() needs a terminal: this session was started without "
                             "tty=True")
        if not self._ended:
            await self._channel.send(frame)

    def __aiter__(self) -> AsyncSession:
        return self

    async def __anext__(self) -> Event:
        while not self._pending:
            if self._ended:
                raise StopAsyncIteration
            await self._read()
        event = self._pending.popleft()
        if isinstance(event, Exit):
            self.result = event.result
            self._ended = True
            self._pending.clear()
        return event

    async def _read(self) -> None:
        data = await self._channel.recv()
        try:
            if not data:
                self._ended = True
                if self._decoder.saw_exit:
                    self._decoder.close()
                    return
                raise self._channel.closing_error() or ConnectionLost(
                    "the session ended before the exit frame")
            for frame in self._decoder.feed(data):
                self._pending.append(event_of(frame))
        except codec.DecodeError as e:
            self._ended = True
            raise ProtocolError(f"invalid frame stream from the daemon: {e}") from e

    async def wait(self, on_stdout: Optional[OutputCallback] = None,
                   on_stderr: Optional[OutputCallback] = None) -> RunResult:
        collector = Collector(on_stdout, on_stderr)
        async for event in self:
            collector.add(event)
        if collector.result is None and self.result is not None:
            collector.result = self.result
        return collector.finish(self.cmd, self.exec_id)

    async def aclose(self) -> None:
        self._ended = True
        self._channel.close()

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
