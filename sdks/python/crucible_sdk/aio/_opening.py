"""An awaitable that is also an async context manager: `x = await f()` or
`async with f() as x`, the latter closing x at the end of the block."""

from __future__ import annotations

from typing import Any, Coroutine, Generator, Generic, Optional, Protocol, TypeVar


class AsyncClosable(Protocol):
    async def aclose(self) -> None: ...


C = TypeVar("C", bound=AsyncClosable)


class Opening(Generic[C]):
    __slots__ = ("_coro", "_value")

    def __init__(self, coro: Coroutine[Any, Any, C]) -> None:
        self._coro = coro
        self._value: Optional[C] = None

    def __await__(self) -> Generator[Any, None, C]:
        return self._coro.__await__()

    async def __aenter__(self) -> C:
        self._value = await self._coro
        return self._value

    async def __aexit__(self, *exc: object) -> None:
        if self._value is not None:
            await self._value.aclose()
