"""A one-shot exec's output as an iterator of events, re-attaching when the connection breaks.

A one-shot command runs on when its connection drops (unless it asked for
`on_disconnect="kill"`), and the daemon can replay its output from any byte the client
names. So a broken connection mid-stream need not lose the command: the stream re-attaches
from the bytes it already yielded, up to `resumes` times, and the caller sees one unbroken
sequence of events.
"""

from __future__ import annotations

import struct
import time
from typing import Any, Callable, Dict, Generator, List, Optional

from . import codec
from ._sync_io import Response
from .errors import ConnectionLost, CrucibleError, ProtocolError
from .models import ExecResult
from .result import Collector, Event, Exit, OutputCallback, RunResult, event_of, exit_json

Reattach = Callable[[int], Response]
_HEADER = struct.Struct(">B3xI")


class ExecStream:
    """`for event in stream`: Stdout, Stderr ..., then one Exit. Closing it early (or leaving
    a `with` block) drops the connection; a command that keeps running can be found again
    by `exec_id`."""

    def __init__(self, response: Response, cmd: List[str], reattach: Optional[Reattach],
                 resumes: int, offset: int = 0) -> None:
        self.cmd = cmd
        #: The command's exec_id (X-Crucible-Exec-Id).
        self.exec_id = response.header("x-crucible-exec-id")
        self._result: Optional[ExecResult] = None
        self._result_of: Optional[RunResult] = None
        self._response = response
        self._reattach = reattach
        self._resumes = resumes
        self._offset = offset
        self._started = False
        self._events = self._run()

    @property
    def result(self) -> Optional[ExecResult]:
        """How the command ended, once its Exit event has been read."""
        if self._result is None and self._result_of is not None:
            self._result = self._result_of.result
        return self._result

    def __iter__(self) -> ExecStream:
        return self

    def __next__(self) -> Event:
        self._started = True
        return next(self._events)

    def __enter__(self) -> ExecStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._events.close()
        self._response.close()

    def collect(self, on_stdout: Optional[OutputCallback] = None,
                on_stderr: Optional[OutputCallback] = None) -> RunResult:
        """Reads the rest of the stream into a RunResult, passing output to the callbacks as
        it arrives."""
        if self._started:
            collector = Collector(on_stdout, on_stderr)
            try:
                for event in self._events:
                    collector.add(event)
            finally:
                self._response.close()
            return collector.finish(self.cmd, self.exec_id)
        return self._collect_fast(on_stdout, on_stderr)

    def _collect_fast(self, on_stdout: Optional[OutputCallback],
                      on_stderr: Optional[OutputCallback]) -> RunResult:
        # The hot path of run(): frames parsed inline, no event objects, since an exec of
        # `true` is a millisecond and each layer of Python costs a visible part of it. A
        # break falls back to the event path, which re-attaches.
        self._started = True
        out: List[bytes] = []
        err: List[bytes] = []
        result: Optional[Dict[str, Any]] = None
        buf = b""
        received = self._offset
        response = self._response
        unpack = _HEADER.unpack_from
        try:
            while True:
                piece = response.read_some()
                if not piece:
                    break
                buf = buf + piece if buf else piece
                pos, end = 0, len(buf)
                while end - pos >= 8:
                    kind, size = unpack(buf, pos)
                    stop = pos + 8 + size
                    if kind not in (1, 2, 3) or size > codec.MAX_PAYLOAD or result is not None:
                        raise self._invalid(buf[pos:])
                    if stop > end:
                        break
                    payload = buf[pos + 8:stop]
                    pos = stop
                    if kind == 1:
                        out.append(payload)
                        received += size
                        if on_stdout is not None:
                            on_stdout(payload)
                    elif kind == 2:
                        err.append(payload)
                        received += size
                        if on_stderr is not None:
                            on_stderr(payload)
                    else:
                        result = exit_json(payload)
                buf = buf[pos:] if pos < end else b""
            if buf or result is None:
                raise self._invalid(buf, eof=True)
        except ConnectionLost as broken:
            response.close()
            self._offset = received
            self._events = self._run(broken)
            collector = Collector(on_stdout, on_stderr)
            collector.seed(out, err)
            for event in self._events:
                collector.add(event)
            return collector.finish(self.cmd, self.exec_id)
        run = RunResult(self.cmd, self.exec_id, b"".join(out), b"".join(err), result)
        self._result_of = run
        return run

    def _invalid(self, rest: bytes, eof: bool = False) -> ProtocolError:
        """The codec's verdict on what the fast path refused (so the error is named alike)."""
        self._response.close()
        decoder = codec.Decoder(response=False)
        try:
            decoder.feed(rest)
            if eof:
                decoder.close()
        except codec.DecodeError as e:
            return ProtocolError(f"invalid frame stream from the daemon: {e}")
        if not rest and eof:
            return ProtocolError("invalid frame stream from the daemon: missing_exit: "
                                 "the stream ended without an exit frame")
        return ProtocolError("invalid frame stream from the daemon: data_after_exit or a "
                             "frame type only clients send")

    def _run(self, broken: Optional[CrucibleError] = None) -> Generator[Event, None, None]:
        self._started = True
        received = self._offset
        tries = 0
        last = broken
        while True:
            if last is None:
                decoder = codec.Decoder(response=True)
                response = self._response
                try:
                    while True:
                        piece = response.read_some()
                        if not piece:
                            break
                        for frame in decoder.feed(piece):
                            event = event_of(frame)
                            if isinstance(event, Exit):
                                self._result = event.result
                            else:
                                received += len(event.data)
                            yield event
                    decoder.close()
                    return
                except codec.DecodeError as e:
                    response.close()
                    raise ProtocolError(f"invalid frame stream from the daemon: {e}") from e
                except ConnectionLost as e:
                    response.close()
                    last = e
            if self._reattach is None or not self.exec_id or tries >= self._resumes:
                raise ConnectionLost(
                    f"the exec stream of {self.exec_id or 'a command'} broke after "
                    f"{received} output bytes"
                    f"{' and ' + str(tries) + ' re-attaches' if tries else ''}: "
                    f"{last.message}") from last
            tries += 1
            time.sleep(0.1 * 2 ** tries)
            try:
                self._response = self._reattach(received)
                last = None
            except CrucibleError as e:
                if e.status:  # the daemon answered: the command is not there to follow
                    raise
                last = e
