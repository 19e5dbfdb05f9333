"""Python SDK for crucible sandboxes.

    from crucible_sdk import Sandbox
    with Sandbox.create() as sb:
        print(sb.run(["echo", "hello"]).stdout_text, end="")

`crucible_sdk.aio` has the same surface on asyncio. The sync client needs nothing beyond the
standard library; the WebSocket transport needs the `websockets` extra.
"""

from .client import Client
from .codec import (EXIT, HEADER_SIZE, MAX_PAYLOAD, RESIZE, STDERR, STDIN, STDIN_CLOSE, STDOUT,
                    DecodeError, Decoder, Frame, encode_frame, encode_frames)
from .errors import (AgentError, BackendUnavailable, CacheBusy, CacheNotFound, CommandFailed,
                     Conflict, ConnectionFailed, ConnectionLost, ContainerNotFound,
                     ContainerNotReady, CrucibleError,
                     EgressNotAllowed, ExecNotFound, FileNotFound, ImageNotFound,
                     ImageTooLarge, InsufficientStorage, InternalError, InvalidImage,
                     InvalidRequest, IsADirectory, NoSpace, NotFound, NotSupported,
                     PayloadTooLarge, PermissionDenied, ProtocolError, RefusedEntry,
                     SandboxNotFound, ServiceUnavailable, ShuttingDown, Timeout,
                     TooManyRequests, Unauthorized)
from .files import FileMeta, Files
from .models import (CacheMount, ContainerInfo, ContainerRequest, CreateSandbox, ExecRequest,
                     ExecResult, ReadyCheck, Rlimit, SharedMount, TerminalSize, VolumeMount)
from .pool import PoolShape, PoolStatus
from .result import ContainerLog, Event, Exit, RunResult, Stderr, Stdout
from .sandbox import Container, Root, Sandbox
from .session import Session
from .stream import ExecStream

from .aio import (AsyncClient, AsyncContainer, AsyncExecStream, AsyncFiles, AsyncRoot,
                  AsyncSandbox, AsyncSession)

__version__ = "0.2.0"

__all__ = [
    "AsyncClient", "AsyncContainer", "AsyncExecStream", "AsyncFiles", "AsyncRoot",
    "AsyncSandbox", "AsyncSession",
    "AgentError", "BackendUnavailable", "CacheBusy", "CacheMount", "CacheNotFound", "Client",
    "CommandFailed", "Conflict", "ConnectionFailed", "ConnectionLost", "Container",
    "ContainerInfo", "ContainerLog", "ContainerNotFound", "ContainerNotReady",
    "ContainerRequest", "CreateSandbox",
    "CrucibleError", "DecodeError", "Decoder", "EXIT", "EgressNotAllowed", "Event",
    "ExecNotFound", "ExecRequest", "ExecResult", "ExecStream", "Exit", "FileMeta", "FileNotFound", "Files",
    "Frame", "HEADER_SIZE", "ImageNotFound", "ImageTooLarge", "InsufficientStorage",
    "InternalError", "InvalidImage", "InvalidRequest", "IsADirectory", "MAX_PAYLOAD", "NoSpace",
    "NotFound", "NotSupported", "PayloadTooLarge", "PermissionDenied", "PoolShape",
    "PoolStatus", "ProtocolError", "RESIZE", "ReadyCheck", "RefusedEntry", "Rlimit", "Root",
    "RunResult", "STDERR", "STDIN",
    "STDIN_CLOSE", "STDOUT", "Sandbox", "SandboxNotFound", "ServiceUnavailable", "Session",
    "SharedMount",
    "ShuttingDown", "Stderr", "Stdout", "TerminalSize", "Timeout", "TooManyRequests",
    "Unauthorized",
    "VolumeMount", "encode_frame", "encode_frames", "__version__",
]
