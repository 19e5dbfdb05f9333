"""A one-shot exec's output as an async iterator of events, re-attaching on a broken
connection exactly as the blocking ExecStream does (see crucible_sdk.stream)."""

from __future__ import annotations

import asyncio
from typing import AsyncGenerator, Awaitable, Callable, List, Optional

from .. import codec
from ..errors import ConnectionLost, CrucibleError, ProtocolError
from ..models import ExecResult
from ..result import Collector, Event, Exit, OutputCallback, RunResult, event_of
from ._io import AsyncResponse

Opener = Callable[[], Awaitable[AsyncResponse]]
Reattach = Callable[[str, int], Awaitable[AsyncResponse]]


class AsyncExecStream:
    """`async for event in stream`: Stdout, Stderr ..., then one Exit. The request is sent
    by `start()` or the first iteration; `aclose()` (or leaving `async with`) drops the
    connection, and a command that keeps running can be found again by `exec_id`."""

    def __init__(self, opener: Opener, cmd: List[str], reattach: Optional[Reattach],
                 resumes: int, offset: int = 0) -> None:
        self.cmd = cmd
        self.exec_id = ""
        self.result: Optional[ExecResult] = None
        self._opener: Optional[Opener] = opener
        self._response: Optional[AsyncResponse] = None
        self._reattach = reattach
        self._resumes = resumes
        self._offset = offset
        self._events = self._run()

    async def start(self) -> AsyncExecStream:
        """Sends the request (raising the daemon's refusal here) if not yet sent."""
        if self._opener is not None:
            opener, self._opener = self._opener, None
            self._response = await opener()
            self.exec_id = self._response.header("x-crucible-exec-id") or self.exec_id
        return self

    def __aiter__(self) -> AsyncExecStream:
        return self

    async def __anext__(self) -> Event:
        return await self._events.__anext__()

    async def __aenter__(self) -> AsyncExecStream:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._events.aclose()
        if self._response is not None:
            self._response.close()

    async def collect(self, on_stdout: Optional[OutputCallback] = None,
                      on_stderr: Optional[OutputCallback] = None) -> RunResult:
        collector = Collector(on_stdout, on_stderr)
        try:
            async for event in self._events:
                collector.add(event)
        finally:
            if self._response is not None:
                self._response.close()
        return collector.finish(self.cmd, self.exec_id)

    async def _run(self) -> AsyncGenerator[Event, None]:
        await self.start()
        received = self._offset
        tries = 0
        while True:
            decoder = codec.Decoder(response=True)
            response = self._response
            assert response is not None
            try:
                while True:
                    piece = await response.read_some()
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
                        f"{received} output bytes: {last.message}") from last
                tries += 1
                await asyncio.sleep(0.1 * 2 ** tries)
                try:
                    self._response = await self._reattach(self.exec_id, received)
                    break
                except CrucibleError as e:
                    if e.status:
                        raise
                    last = e
