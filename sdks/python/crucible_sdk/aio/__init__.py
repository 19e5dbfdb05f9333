"""The asyncio face of the SDK: `AsyncSandbox` and `AsyncClient`, with the blocking API's
surface (`await sb.run(...)`, `async for ev in sb.stream(...)`, `async with
sb.interactive(...)`), on asyncio streams over the Unix socket or TCP."""

from .client import AsyncClient
from .sandbox import AsyncContainer, AsyncFiles, AsyncRoot, AsyncSandbox
from .session import AsyncSession
from .stream import AsyncExecStream

__all__ = ["AsyncClient", "AsyncContainer", "AsyncExecStream", "AsyncFiles", "AsyncRoot",
           "AsyncSandbox", "AsyncSession"]
