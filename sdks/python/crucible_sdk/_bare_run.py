"""The lean read of a short command's whole answer: run()'s hot path on the blocking client.

An exec of `true` is about a millisecond, and what the SDK does after the answer arrives sits
on the caller's critical path, just after a wakeup, when the interpreter's caches are cold:
every function, object and branch there shows. So the usual small answer (one kept-alive
chunked body holding some output frames and the exit frame) is read to its end and parsed in
one pass, with no decoder objects. Anything else (a body over `LIMIT`, chunk extensions,
trailers, an invalid frame, a broken connection) is handed back untouched, every byte read so
far left in the connection's buffer, and the general path (ExecStream: the strict decoders,
their errors, re-attaching) reads the same answer from its first byte.
"""

from __future__ import annotations

import struct
from typing import Any, Dict, List, Optional, Tuple, Union

from . import codec
from ._sync_io import Connection
from .errors import ConnectionLost, ProtocolError
from .result import exit_json

#: The most body bytes read this way; a longer answer streams through the general path.
LIMIT = 64 * 1024

_HEADER = struct.Struct(">B3xI")
_BLANK_LINE = b"\r\n\r\n"

Output = Tuple[bytes, bytes, Dict[str, Any]]


def read_result(conn: Connection) -> Optional[Output]:
    """Reads a chunked exec body from `conn` to its end: (stdout, stderr, exit document), or
    None with everything read put back in `conn.buf` for the general path."""
    buf = conn.buf
    conn.buf = b""
    try:
        while True:
            # Every chunked body ends with an empty line: only then can this one be whole.
            if buf.endswith(_BLANK_LINE):
                done = parse_body(buf)
                if isinstance(done, tuple):
                    return done
                if done is None:
                    break
            if len(buf) > LIMIT:
                break
            data = conn.recv()
            if not data:
                break
            buf += data
    except ConnectionLost:
        pass
    conn.buf = buf
    return None


class _More:
    """parse_body's answer for a clean body whose end has not arrived yet."""


_MORE = _More()


def parse_body(body: bytes) -> Union[Output, _More, None]:
    """A whole chunked body of frames → (stdout, stderr, exit document); `_MORE` when it is a
    clean prefix of one; None for anything the general path must judge."""
    pieces: List[bytes] = []
    pos = 0
    end = len(body)
    find = body.find
    while True:
        eol = find(b"\r\n", pos)
        if eol < 0:
            return _MORE
        size_text = body[pos:eol]
        if not size_text.isalnum():  # extensions, spaces, signs: the strict decoder's call
            return None
        try:
            size = int(size_text, 16)
        except ValueError:
            return None
        start = eol + 2
        if not size:
            if start + 2 == end and body[start:] == b"\r\n":
                break
            # Trailers, or bytes after the body: for the general path.
            return _MORE if start + 2 > end else None
        stop = start + size
        if stop + 2 > end:
            return _MORE
        if body[stop:stop + 2] != b"\r\n":
            return None
        pieces.append(body[start:stop])
        pos = stop + 2
    frames = b"".join(pieces)  # one piece is returned as it is
    out: List[bytes] = []
    err: List[bytes] = []
    pos = 0
    end = len(frames)
    unpack = _HEADER.unpack_from
    while end - pos >= 8:
        kind, size = unpack(frames, pos)
        stop = pos + 8 + size
        if size > codec.MAX_PAYLOAD or stop > end:
            return None
        if kind == codec.STDOUT:
            out.append(frames[pos + 8:stop])
        elif kind == codec.STDERR:
            err.append(frames[pos + 8:stop])
        elif kind == codec.EXIT and stop == end:
            try:
                result = exit_json(frames[pos + 8:stop])
            except ProtocolError:
                return None
            return b"".join(out), b"".join(err), result
        else:
            return None
        pos = stop
    return None
