"""Python SDK for crucible sandboxes.

    from crucible_sdk import Sandbox
    with Sandbox.create() as sb:
        print(sb.run(["echo", "hello"]).stdout_text, end="")

`crucible_sdk.aio` has the same surface on asyncio. The sync client needs nothing beyond the
standard library; the WebSocket transport needs the `websockets` extra.
"""

from .client import Client
from .codec import (EXIT, HEADER_SIZE, MAX_PAYLOAD, STDERR, STDIN, STDIN_CLOSE, STDOUT,
                    DecodeError, Decoder, Frame, encode_frame, encode_frames)
from .errors import (AgentError, BackendUnavailable, CacheBusy, CacheNotFound, CommandFailed,
                     Conflict, ConnectionFailed, ConnectionLost, CrucibleError,
                     EgressNotAllowed, ExecNotFound, FileNotFound, ImageNotFound,
                     ImageTooLarge, InsufficientStorage, InternalError, InvalidImage,
                     InvalidRequest, IsADirectory, NoSpace, NotFound, NotSupported,
                     PayloadTooLarge, PermissionDenied, ProtocolError, RefusedEntry,
                     SandboxNotFound, ServiceUnavailable, ShuttingDown, Timeout,
                     TooManyRequests, Unauthorized)
from .files import Files
from .models import CacheMount, CreateSandbox, ExecRequest, ExecResult, Rlimit, VolumeMount
from .pool import PoolShape, PoolStatus
from .result import Event, Exit, RunResult, Stderr, Stdout
from .sandbox import Sandbox
from .session import Session
from .stream import ExecStream

from .aio import AsyncClient, AsyncExecStream, AsyncFiles, AsyncSandbox, AsyncSession

__version__ = "0.2.0"

__all__ = [
    "AsyncClient", "AsyncExecStream", "AsyncFiles", "AsyncSandbox", "AsyncSession",
    "AgentError", "BackendUnavailable", "CacheBusy", "CacheMount", "CacheNotFound", "Client",
    "CommandFailed", "Conflict", "ConnectionFailed", "ConnectionLost", "CreateSandbox",
    "CrucibleError", "DecodeError", "Decoder", "EXIT", "EgressNotAllowed", "Event",
    "ExecNotFound", "ExecRequest", "ExecResult", "ExecStream", "Exit", "FileNotFound", "Files",
    "Frame", "HEADER_SIZE", "ImageNotFound", "ImageTooLarge", "InsufficientStorage",
    "InternalError", "InvalidImage", "InvalidRequest", "IsADirectory", "MAX_PAYLOAD", "NoSpace",
    "NotFound", "NotSupported", "PayloadTooLarge", "PermissionDenied", "PoolShape",
    "PoolStatus", "ProtocolError", "RefusedEntry", "Rlimit", "RunResult", "STDERR", "STDIN",
    "STDIN_CLOSE", "STDOUT", "Sandbox", "SandboxNotFound", "ServiceUnavailable", "Session",
    "ShuttingDown", "Stderr", "Stdout", "Timeout", "TooManyRequests", "Unauthorized",
    "VolumeMount", "encode_frame", "encode_frames", "__version__",
]
