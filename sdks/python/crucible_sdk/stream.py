"""A one-shot exec's output as an iterator of events, re-attaching when the connection breaks.

A one-shot command runs on when its connection drops (unless it asked for
`on_disconnect="kill"`), and the daemon can replay its output from any byte the client
names. So a broken connection mid-stream need not lose the command: the stream re-attaches
from the bytes it already yielded, up to `resumes` times, and the caller sees one unbroken
sequence of events.
"""

from __future__ import annotations

import time
from typing import Callable, Generator, List, Optional

from . import codec
from ._sync_io import Response
from .errors import ConnectionLost, CrucibleError, ProtocolError
from .models import ExecResult
from .result import Collector, Event, Exit, OutputCallback, RunResult, event_of

Reattach = Callable[[int], Response]


class ExecStream:
    """`for event in stream`: Stdout, Stderr ..., then one Exit. Closing it early (or leaving
    a `with` block) drops the connection; a command that keeps running can be found again
    by `exec_id`."""

    def __init__(self, response: Response, cmd: List[str], reattach: Optional[Reattach],
                 resumes: int, offset: int = 0) -> None:
        self.cmd = cmd
        #: The command's exec_id (X-Crucible-Exec-Id).
        self.exec_id = response.header("x-crucible-exec-id")
        #: How the command ended, once the Exit event has been yielded.
        self.result: Optional[ExecResult] = None
        self._response = response
        self._reattach = reattach
        self._resumes = resumes
        self._offset = offset
        self._events = self._run()

    def __iter__(self) -> ExecStream:
        return self

    def __next__(self) -> Event:
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
        collector = Collector(on_stdout, on_stderr)
        try:
            for event in self._events:
                collector.add(event)
        finally:
            self._response.close()
        return collector.finish(self.cmd, self.exec_id)

    def _run(self) -> Generator[Event, None, None]:
        received = self._offset
        tries = 0
        while True:
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
                            self.result = event.result
                        else:
                            received += len(event.data)
                        yield event
                decoder.close()
                return
            except codec.DecodeError as e:
                response.close()
                raise ProtocolError(f"invalid frame stream from the daemon: {e}") from e
            except ConnectionLost as broken:
                response.close()
                last: CrucibleError = broken
            while True:
                if self._reattach is None or not self.exec_id or tries >= self._resumes:
                    raise ConnectionLost(
                        f"the exec stream of {self.exec_id or 'a command'} broke after "
                        f"{received} output bytes{' and ' + str(tries) + ' re-attaches' if tries else ''}:"
                        f" {last.message}") from last
                tries += 1
                time.sleep(0.1 * 2 ** tries)
                try:
                    self._response = self._reattach(received)
                    break
                except CrucibleError as e:
                    if e.status:  # the daemon answered: the command is not there to follow
                        raise
                    last = e
