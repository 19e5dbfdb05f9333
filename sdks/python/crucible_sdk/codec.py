"""The crucible frame codec: [type:1][reserved:3][size:4 big-endian][payload].

Written from the protocol specification alone (see docs/protocol.md), independently of the Rust
codec, so that the conformance fixtures check two implementations against each other.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Iterable, Iterator, List, Optional

HEADER_SIZE = 8
MAX_PAYLOAD = 65536

STDOUT = 1
STDERR = 2
EXIT = 3
STDIN = 4
STDIN_CLOSE = 5
#: A terminal's new size (host to guest): the payload is `{"rows":R,"cols":C}`.
RESIZE = 6

TYPE_NAMES = {
    STDOUT: "stdout",
    STDERR: "stderr",
    EXIT: "exit",
    STDIN: "stdin",
    STDIN_CLOSE: "stdin_close",
    RESIZE: "resize",
}

_HEADER = struct.Struct(">B3xI")


class DecodeError(ValueError):
    """An invalid frame stream. `kind` is the fixture manifest's error name."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind


@dataclass(frozen=True)
class Frame:
    type: int
    payload: bytes

    @property
    def type_name(self) -> str:
        return TYPE_NAMES[self.type]


def encode_frame(frame_type: int, payload: bytes = b"") -> bytes:
    """One frame; the payload must fit in one frame."""
    if frame_type not in TYPE_NAMES:
        raise ValueError(f"unknown frame type {frame_type}")
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"payload of {len(payload)} bytes exceeds {MAX_PAYLOAD}")
    return _HEADER.pack(frame_type, len(payload)) + payload


def encode_frames(frame_type: int, data: bytes) -> bytes:
    """`data` chunked into consecutive frames of one type; empty data gives one empty frame."""
    if not data:
        return encode_frame(frame_type)
    return b"".join(
        encode_frame(frame_type, data[i : i + MAX_PAYLOAD])
        for i in range(0, len(data), MAX_PAYLOAD)
    )


class Decoder:
    """Incremental decoder: feed() bytes in any split, iterate frames, call close() at EOF.

    `response=True` (guest to host) requires exactly one exit frame at the end.
    """

    def __init__(self, response: bool = True) -> None:
        self._buf = bytearray()
        self._response = response
        self._saw_exit = False
        self._error: Optional[DecodeError] = None

    @property
    def saw_exit(self) -> bool:
        return self._saw_exit

    def _fail(self, kind: str, message: str) -> DecodeError:
        self._error = DecodeError(kind, message)
        return self._error

    def feed(self, data: bytes) -> List[Frame]:
        """Adds bytes and returns the frames they completed."""
        if self._error:
            raise self._error
        self._buf += data
        frames: List[Frame] = []
        while True:
            frame = self._next()
            if frame is None:
                return frames
            frames.append(frame)

    def _next(self) -> Optional[Frame]:
        if not self._buf:
            return None
        if self._response and self._saw_exit:
            raise self._fail("data_after_exit", "bytes after the exit frame")
        if len(self._buf) < HEADER_SIZE:
            return None
        frame_type, size = _HEADER.unpack_from(self._buf)
        if frame_type not in TYPE_NAMES:
            raise self._fail("unknown_type", f"frame type {frame_type}")
        if size > MAX_PAYLOAD:
            raise self._fail("oversize", f"declared payload of {size} bytes")
        if len(self._buf) < HEADER_SIZE + size:
            return None
        payload = bytes(self._buf[HEADER_SIZE : HEADER_SIZE + size])
        del self._buf[: HEADER_SIZE + size]
        if frame_type == EXIT:
            self._saw_exit = True
        return Frame(frame_type, payload)

    def close(self) -> None:
        """Declares EOF: raises unless the stream ended cleanly."""
        if self._error:
            raise self._error
        if self._buf:
            if len(self._buf) < HEADER_SIZE:
                raise self._fail("truncated_header", f"{len(self._buf)} header bytes")
            raise self._fail("truncated_payload", "EOF inside a payload")
        if self._response and not self._saw_exit:
            raise self._fail("missing_exit", "stream ended without an exit frame")


def iter_frames(chunks: Iterable[bytes], response: bool = True) -> Iterator[Frame]:
    """Frames from an iterable of byte chunks, validating the end of the stream."""
    decoder = Decoder(response)
    for chunk in chunks:
        yield from decoder.feed(chunk)
    decoder.close()
