"""The WebSocket exec transport on the `websockets` package's Sans-I/O protocol.

Our own sockets drive `websockets.client.ClientProtocol` (the sync client and the asyncio
client alike) rather than its threaded or asyncio connections. Why: the daemon closes its end
right after its Close frame, without waiting for ours (see the SDK's README, Known daemon
issues), and websockets' own sync connection then drops the messages it had read in the same
batch as that Close — the exit frame among them — when sending its Close reply fails. Here a
failed reply is ignored: the Close was the last thing the daemon had to say.

Only imported when a WebSocket session is asked for: the package itself needs no
third-party dependency.
"""

from __future__ import annotations

from typing import Any, List, Optional

from . import errors
from ._address import Address

try:
    from websockets.client import ClientProtocol
    from websockets.frames import Close, Frame, Opcode
    from websockets.http11 import Response
    from websockets.uri import parse_uri
except ImportError as e:  # pragma: no cover - exercised by the missing-extra test
    raise ImportError(
        "the WebSocket transport needs the `websockets` package: "
        "pip install 'crucible-sdk[websockets]' (or pip install websockets)") from e

# The daemon's messages are single frames of the exec stream (at most 65,544 bytes); a
# generous limit still refuses a runaway peer.
MAX_MESSAGE = 16 * 1024 * 1024


class WsProtocol:
    """One WebSocket exec: handshake, then binary payloads in both directions."""

    def __init__(self, address: Address, target: str, api_key: Optional[str]) -> None:
        self._p = ClientProtocol(parse_uri(f"ws://{address.host_header}{target}"),
                                 max_size=MAX_MESSAGE)
        request = self._p.connect()
        if api_key:
            request.headers["Authorization"] = f"Bearer {api_key}"
        self._p.send_request(request)
        self.response: Optional[Response] = None
        self.close_code: Optional[int] = None
        self.close_reason = ""
        self.eof = False

    def outgoing(self) -> bytes:
        # An empty chunk in data_to_send means "half-close"; the daemon takes a half-close as
        # the end of the session, so it is left to the socket's close.
        return b"".join(d for d in self._p.data_to_send() if d)

    def send_text(self, data: bytes) -> bytes:
        self._p.send_text(data)
        return self.outgoing()

    def send_binary(self, data: bytes) -> bytes:
        self._p.send_binary(data)
        return self.outgoing()

    def send_close(self) -> bytes:
        try:
            self._p.send_close(1000)
        except Exception:  # already closing: nothing more to say
            return b""
        return self.outgoing()

    def feed(self, data: bytes) -> List[bytes]:
        """Takes bytes from the socket (b"" at EOF); returns the binary payloads they
        completed. The handshake's answer, a Close and EOF are recorded on the object."""
        if data:
            self._p.receive_data(data)
        else:
            self.eof = True
            self._p.receive_eof()
        payloads: List[bytes] = []
        for event in self._p.events_received():
            if isinstance(event, Response):
                self.response = event
            elif isinstance(event, Frame):
                self._frame(event, payloads)
        return payloads

    def _frame(self, frame: Frame, payloads: List[bytes]) -> None:
        if frame.opcode in (Opcode.BINARY, Opcode.CONT):
            payloads.append(bytes(frame.data))
        elif frame.opcode is Opcode.TEXT:
            raise errors.ProtocolError("the daemon sent a text message mid-stream")
        elif frame.opcode is Opcode.CLOSE:
            close = Close.parse(bytes(frame.data)) if frame.data else None
            self.close_code = close.code if close else 1005
            self.close_reason = close.reason if close else ""

    @property
    def handshake_done(self) -> bool:
        return self.response is not None or self._p.handshake_exc is not None

    def handshake_error(self) -> Optional[errors.CrucibleError]:
        """The error for a refused upgrade (the daemon's JSON answer), else None."""
        response = self.response
        if response is not None and response.status_code != 101:
            return errors.from_response(response.status_code, bytes(response.body or b""))
        exc: Any = self._p.handshake_exc
        if exc is not None:
            return errors.ProtocolError(f"the WebSocket handshake failed: {exc}")
        if response is None:
            return errors.ConnectionLost("the daemon closed the connection during the "
                                         "WebSocket handshake")
        return None

    def closing_error(self) -> errors.CrucibleError:
        """Why a stream ended before its exit frame, from the daemon's close code."""
        code, reason = self.close_code, self.close_reason
        if code == 1008:
            return errors.InvalidRequest(400, "invalid_request", reason or "refused")
        if code == 1011:
            return errors.AgentError(502, "agent_error", reason or "the agent was lost")
        if code == 1013:
            return errors.TooManyRequests(429, "too_many_requests", reason or "exec cap")
        how = f"close code {code}: {reason}" if code is not None else "no close frame"
        return errors.ConnectionLost(f"the WebSocket ended before the exit frame ({how})")

