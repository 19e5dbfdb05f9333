"""Interactive sessions: stdin frames out, output events in, over one of two transports.

- hijack: `POST /sandboxes/{id}/exec?stdin=1` as a connection's first request; after a bare
  `200` head the socket carries frames both ways (standard library only).
- websocket: `GET /sandboxes/{id}/exec` upgraded; the binary messages, concatenated, are the
  same frame stream (needs the `websockets` extra).

Closing the connection, even its write half, kills the command (unless it was started with
`on_disconnect="keep"`), so stdin ends with `close_stdin()`, a stdin_close frame.

A session started with `tty=True` runs its command on a terminal: `resize()` sends the
terminal's new size as a resize frame.
"""

from __future__ import annotations

import socket
from collections import deque
from typing import Deque, List, Literal, Optional, Protocol, Union

from . import _api, _http1, _sync_io, codec
from ._address import Address
from .errors import ConnectionLost, CrucibleError, ProtocolError, Timeout, from_response
from .models import ExecResult
from .result import Collector, Event, Exit, OutputCallback, RunResult, event_of

Transport = Literal["hijack", "websocket"]


class Channel(Protocol):
    exec_id: str

    def send(self, data: bytes) -> None: ...

    def recv(self) -> bytes: ...

    def closing_error(self) -> Optional[CrucibleError]: ...

    def close(self) -> None: ...


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(_sync_io.SMALL_RECV)  # interactive: small reads (see _sync_io)
    except socket.timeout as e:
        raise Timeout(f"the session sent nothing for {sock.gettimeout()} s") from e
    except OSError as e:
        raise ConnectionLost(f"the session's connection broke: {e}") from e


def _send(sock: socket.socket, data: bytes) -> None:
    try:
        sock.sendall(data)
    except socket.timeout as e:
        raise Timeout(f"sending stdin timed out after {sock.gettimeout()} s") from e
    except OSError as e:
        raise ConnectionLost(f"sending stdin failed: {e}") from e


class HijackChannel:
    def __init__(self, address: Address, target: str, headers: _http1.Headers, body: bytes,
                 timeout: Optional[float]) -> None:
        head = _http1.request_head("POST", target, address.host_header,
                                   [("Content-Type", "application/json"), *headers], len(body))
        sock, response, rest = _sync_io.hijack(address, timeout, head, body)
        if response.status != 200:
            raise from_response(response.status, _sync_io.read_error_body(sock, response, rest))
        self.sock = sock
        self.exec_id = response.get("x-crucible-exec-id")
        self._rest = rest

    def send(self, data: bytes) -> None:
        _send(self.sock, data)

    def recv(self) -> bytes:
        if self._rest:
            data, self._rest = self._rest, b""
            return data
        return _recv(self.sock)

    def closing_error(self) -> Optional[CrucibleError]:
        return None

    def close(self) -> None:
        self.sock.close()


class WebSocketChannel:
    def __init__(self, address: Address, target: str, api_key: Optional[str], body: bytes,
                 timeout: Optional[float]) -> None:
        from ._ws import WsProtocol

        self._ws = WsProtocol(address, target, api_key)
        self.sock = _sync_io.open_socket(address, timeout)
        try:
            _send(self.sock, self._ws.outgoing())
            self._pending: List[bytes] = []
            while not self._ws.handshake_done:
                self._pending += self._ws.feed(_recv(self.sock))
            error = self._ws.handshake_error()
            if error is not None:
                raise error
            self.exec_id = ""
            _send(self.sock, self._ws.send_text(body))
        except BaseException:
            self.sock.close()
            raise

    def send(self, data: bytes) -> None:
        _send(self.sock, self._ws.send_binary(data))

    def recv(self) -> bytes:
        while not self._pending:
            if self._ws.eof:
                return b""
            try:
                data = _recv(self.sock)
            except ConnectionLost:
                if self._ws.close_code is None:
                    raise
                # After its Close the daemon may reset the socket (our Close reply unread):
                # that is the end of the stream, as EOF would be.
                data = b""
            payloads = self._ws.feed(data)
            reply = self._ws.outgoing()  # pongs, the Close reply
            if reply:
                try:
                    self.sock.sendall(reply)
                except OSError:
                    pass  # the daemon closes right after its Close: see _ws
            self._pending += payloads
        data = b"".join(self._pending)
        self._pending = []
        return data

    def closing_error(self) -> Optional[CrucibleError]:
        return self._ws.closing_error()

    def close(self) -> None:
        if not self._ws.eof:
            try:
                self.sock.sendall(self._ws.send_close())
            except OSError:
                pass
        self.sock.close()


class Session:
    """An interactive command: `send()` its stdin, iterate its events, `wait()` for its end.

    Iterating and sending happen on the caller's thread: a command that stops reading stdin
    while its output is not read can block `send()` (as with any pipe); send from another
    thread, or interleave, when that can happen. Writes (`send()`, `resize()`, `close_stdin()`)
    from two threads at once could interleave their frames: make them from one.
    """

    def __init__(self, channel: Channel, cmd: List[str], tty: bool = False) -> None:
        self._channel = channel
        self.cmd = cmd
        #: Whether the command runs on a terminal (started with `tty=True`).
        self.tty = tty
        self._decoder = codec.Decoder(response=True)
        self._pending: Deque[Event] = deque()
        self._ended = False
        #: How the command ended, once the Exit event has been read.
        self.result: Optional[ExecResult] = None

    @property
    def exec_id(self) -> str:
        """The command's exec_id ("" on the WebSocket, whose handshake precedes it)."""
        return self._channel.exec_id

    def send(self, data: Union[bytes, str]) -> None:
        """Writes to the command's stdin (str as UTF-8)."""
        if isinstance(data, str):
            data = data.encode()
        if data:
            self._channel.send(codec.encode_frames(codec.STDIN, data))

    def close_stdin(self) -> None:
        """Ends the command's stdin (EOF for it); the session goes on."""
        self._channel.send(codec.encode_frame(codec.STDIN_CLOSE))

    def resize(self, rows: int, cols: int) -> None:
        """Sets the size of the command's terminal (it gets SIGWINCH); a session started
        without `tty=True` has none (ValueError). Does nothing once the session has ended
        (the command's Exit read, or the session closed)."""
        frame = _api.resize_frame(rows, cols)
        if not self.tty:
            raise ValueError("resize() needs a terminal: this session was started without "
                             "tty=True")
        if not self._ended:
            self._channel.send(frame)

    def __iter__(self) -> Session:
        return self

    def __next__(self) -> Event:
        while not self._pending:
            if self._ended:
                raise StopIteration
            self._read()
        event = self._pending.popleft()
        if isinstance(event, Exit):
            self.result = event.result
            self._ended = True
            self._pending.clear()
        return event

    def _read(self) -> None:
        data = self._channel.recv()
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

    def wait(self, on_stdout: Optional[OutputCallback] = None,
             on_stderr: Optional[OutputCallback] = None) -> RunResult:
        """Reads the session to its end: the output not yet iterated over, and the result."""
        collector = Collector(on_stdout, on_stderr)
        for event in self:
            collector.add(event)
        if collector.result is None and self.result is not None:
            collector.result = self.result
        return collector.finish(self.cmd, self.exec_id)

    def close(self) -> None:
        """Closes the connection (killing the command if it still runs and was not started
        with on_disconnect="keep")."""
        self._ended = True
        self._channel.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
