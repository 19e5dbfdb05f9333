"""HTTP/1.1 without I/O: request heads out, response heads and chunked bodies in.

The sync and asyncio clients both drive this, so that they frame requests and read answers
identically. It is hand-written rather than http.client because an exec round trip is about a
millisecond and http.client's header parsing (the email package) costs a large part of the
budget the SDK has on top of it; and because the daemon's interactive exec turns the
connection into a raw frame stream after its head, which http.client cannot hand over.
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Tuple

from .errors import ProtocolError

Headers = Iterable[Tuple[str, str]]

END_OF_HEAD = b"\r\n\r\n"
# The daemon refuses heads over 64 KiB; an answer's head is far smaller.
MAX_HEAD = 64 * 1024


def request_head(method: str, target: str, host: str, headers: Headers,
                 body_length: Optional[int]) -> bytes:
    """The request line and headers; `body_length` None means a chunked body."""
    lines = [head_prefix(method, target, host, headers)]
    if body_length is None:
        lines.append("Transfer-Encoding: chunked\r\n")
    elif body_length or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {body_length}\r\n")
    lines.append("\r\n")
    return "".join(lines).encode("latin-1")


def head_prefix(method: str, target: str, host: str, headers: Headers) -> str:
    """The request line and `headers`: a head without its body's framing and blank line."""
    lines = [f"{method} {target} HTTP/1.1\r\nHost: {host}\r\n"]
    for name, value in headers:
        if "\r" in value or "\n" in value:
            raise ValueError(f"header {name} contains a line break")
        lines.append(f"{name}: {value}\r\n")
    return "".join(lines)


def sized_head(prefix: bytes, body_length: int) -> bytes:
    """A head from `head_prefix` (encoded) for a body of `body_length` bytes."""
    return b"%sContent-Length: %d\r\n\r\n" % (prefix, body_length)


def chunk(data: bytes) -> bytes:
    """One chunk of a chunked request body; empty data is the last chunk."""
    return b"%x\r\n%s\r\n" % (len(data), data) if data else b"0\r\n\r\n"


class ResponseHead:
    """A parsed status line and headers (names lower-cased, repeated ones joined by ", ")."""

    __slots__ = ("status", "reason", "headers", "keep_alive", "content_length", "chunked")

    def __init__(self, status: int, reason: str, headers: Dict[str, str]) -> None:
        self.status = status
        self.reason = reason
        self.headers = headers
        connection = headers.get("connection", "").lower()
        self.keep_alive = "close" not in connection
        encoding = headers.get("transfer-encoding", "").lower()
        self.chunked = encoding.endswith("chunked")
        length = headers.get("content-length")
        self.content_length: Optional[int] = None
        if length is not None and not self.chunked:
            if not length.isdigit():
                raise ProtocolError(f"invalid Content-Length {length!r}")
            self.content_length = int(length)

    def get(self, name: str, default: str = "") -> str:
        return self.headers.get(name, default)

    @property
    def until_close(self) -> bool:
        """The body runs to EOF (neither chunked nor sized), so the connection is spent."""
        return not self.chunked and self.content_length is None and self.status not in (
            101, 204, 304)


def parse_head(raw: bytes) -> ResponseHead:
    """`raw` is the head without its final blank line."""
    try:
        text = raw.decode("latin-1")
        status_line, _, rest = text.partition("\r\n")
        version, status, reason = (status_line.split(" ", 2) + [""])[:3]
        if not version.startswith("HTTP/1."):
            raise ValueError(status_line)
        headers: Dict[str, str] = {}
        if rest:
            for line in rest.split("\r\n"):
                name, sep, value = line.partition(":")
                if not sep:
                    raise ValueError(line)
                key = name.strip().lower()
                value = value.strip()
                headers[key] = f"{headers[key]}, {value}" if key in headers else value
        return ResponseHead(int(status), reason, headers)
    except ValueError as e:
        raise ProtocolError(f"not an HTTP/1.1 response head: {raw[:200]!r}") from e


class ChunkedDecoder:
    """Decodes a chunked body fed in pieces of any size. `feed` returns the payload bytes it
    completed; `done` is set after the last chunk and its trailers, and `leftover` holds what
    followed them (the next answer's bytes, which a well-behaved daemon never sends early)."""

    __slots__ = ("_buf", "_remaining", "_state", "done", "leftover")

    _SIZE, _DATA, _DATA_END, _TRAILER = range(4)

    def __init__(self) -> None:
        self._buf = b""
        self._remaining = 0
        self._state = self._SIZE
        self.done = False
        self.leftover = b""

    def feed(self, data: bytes) -> List[bytes]:
        if self.done:
            self.leftover += data
            return []
        if self._state == self._SIZE and not self._buf and data.endswith(b"\r\n0\r\n\r\n"):
            # The usual end of an exec: its last chunk and the terminator in one read.
            line_end = data.find(b"\r\n")
            try:
                size = int(data[:line_end], 16)
            except ValueError:
                size = -1
            if size > 0 and line_end + 2 + size + 7 == len(data):
                self.done = True
                return [data[line_end + 2:line_end + 2 + size]]
        buf = self._buf + data if self._buf else data
        out: List[bytes] = []
        pos = 0
        end = len(buf)
        while pos < end:
            state = self._state
            if state == self._DATA:
                take = min(self._remaining, end - pos)
                out.append(buf[pos:pos + take])
                pos += take
                self._remaining -= take
                if not self._remaining:
                    self._state = self._DATA_END
            elif state == self._SIZE:
                line_end = buf.find(b"\r\n", pos)
                if line_end < 0:
                    if end - pos > 1024:
                        raise ProtocolError("a chunk size line over 1 KiB")
                    break
                size_text = buf[pos:line_end].split(b";", 1)[0].strip()
                try:
                    size = int(size_text, 16)
                except ValueError:
                    raise ProtocolError(f"invalid chunk size {size_text!r}") from None
                pos = line_end + 2
                if size:
                    self._remaining = size
                    self._state = self._DATA
                else:
                    self._state = self._TRAILER
            elif state == self._DATA_END:
                if end - pos < 2:
                    break
                if buf[pos:pos + 2] != b"\r\n":
                    raise ProtocolError("a chunk not followed by CRLF")
                pos += 2
                self._state = self._SIZE
            else:  # trailers, ended by an empty line
                line_end = buf.find(b"\r\n", pos)
                if line_end < 0:
                    break
                empty = line_end == pos
                pos = line_end + 2
                if empty:
                    self.done = True
                    self.leftover = buf[pos:]
                    self._buf = b""
                    return out
        self._buf = buf[pos:] if pos < end else b""
        return out
