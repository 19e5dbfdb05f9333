"""The exceptions the SDK raises: one class per error code of the daemon.

Every failure of a call is a `CrucibleError` carrying the daemon's `status`, `code` and
`message` (status 0 when no HTTP answer was had: unreachable daemon, broken stream, WebSocket
close). Classes nest where one failure is a kind of another, so that `except NotFound` also
catches a missing sandbox, file, image, cache or command.

A command that runs and fails is not an error of the SDK: its exit code is in the result (ask
for `check=True` to turn a failure into `CommandFailed`).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Dict, Optional, Type

if TYPE_CHECKING:
    from .result import RunResult


class CrucibleError(Exception):
    """The daemon refused or failed a request, or could not be reached (status 0)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{message} (HTTP {status}, {code})" if status else f"{message} ({code})")
        self.status = status
        self.code = code
        self.message = message


# -- the daemon's answers, by code ------------------------------------------------------------


class InvalidRequest(CrucibleError):
    """400 invalid_request: bad JSON, an unknown field, failed validation, a bad id or path."""


class RefusedEntry(InvalidRequest):
    """400 refused_entry: a tar entry would escape its destination (or is a device node)."""


class IsADirectory(InvalidRequest):
    """400 is_a_directory: a file download named a directory."""


class InvalidImage(InvalidRequest):
    """400 invalid_image: the archive is not a usable image."""


class Unauthorized(CrucibleError):
    """401 unauthorized: a wrong API key, or none over TCP."""


class PermissionDenied(CrucibleError):
    """403 permission_denied: the agent may not read or write that guest path."""


class EgressNotAllowed(CrucibleError):
    """403 egress_not_allowed: a network rule outside the operator's --egress-allow."""


class NotFound(CrucibleError):
    """404 not_found: the sandbox, file, image, cache or route does not exist."""


class SandboxNotFound(NotFound):
    """404: no sandbox with this id (or another key's: to it, the sandbox does not exist)."""


class FileNotFound(NotFound):
    """404: no such file in the sandbox."""


class ImageNotFound(NotFound):
    """404: no image of this name."""


class CacheNotFound(NotFound):
    """404: no cache of this name."""


class ExecNotFound(NotFound):
    """404: no command with this exec_id can be found (code exec_not_found), or none of that
    name runs when it is signalled (the daemon then says not_found)."""


class ContainerNotFound(NotFound):
    """404 container_not_found: the sandbox has no container of this name."""


class MethodNotAllowed(CrucibleError):
    """405 method_not_allowed."""


class RequestTimeout(CrucibleError):
    """408 request_timeout: the request (or an upload) stalled for 30 s."""


class ContainerNotReady(CrucibleError):
    """422 container_not_ready: a container of the create did not become ready (its main
    process exited, or its check did not pass in time); the message ends with its log's last
    lines, and the sandbox is gone."""


class Conflict(CrucibleError):
    """409 conflict: the sandbox is dead or being deleted, the cache or image is in use, or
    another client is attached to the command."""


class CacheBusy(Conflict):
    """409 cache_busy: another sandbox holds the cache."""


class NotSupported(Conflict):
    """409 not_supported: the sandbox's backend cannot do this (stats, for one)."""


class LengthRequired(CrucibleError):
    """411 length_required."""


class PayloadTooLarge(CrucibleError):
    """413 payload_too_large: a JSON body over 2 MiB."""


class NoSpace(PayloadTooLarge):
    """413 no_space: an upload filled the sandbox's disk."""


class ImageTooLarge(PayloadTooLarge):
    """413 image_too_large: past the daemon's --image-max-mib."""


class UpgradeRequired(CrucibleError):
    """426 upgrade_required: a WebSocket endpoint reached without the handshake."""


class TooManyRequests(CrucibleError):
    """429 too_many_requests: the sandbox cap or the per-sandbox exec cap; retry."""


class HeadersTooLarge(CrucibleError):
    """431 headers_too_large."""


class InternalError(CrucibleError):
    """500 internal: the daemon failed (a sandbox could not be started)."""


class IoError(InternalError):
    """500 io_error: the agent failed on a file for another reason."""


class AgentError(CrucibleError):
    """502 agent_error: the sandbox's agent failed or could not be reached."""


class ServiceUnavailable(CrucibleError):
    """503: the daemon cannot take this now."""


class BackendUnavailable(ServiceUnavailable):
    """503 backend_unavailable: the requested backend cannot run on this host."""


class ShuttingDown(ServiceUnavailable):
    """503 shutting_down: the daemon is stopping."""


class TooManyConnections(ServiceUnavailable):
    """503 too_many_connections: the daemon holds --max-connections connections."""


class HttpVersionNotSupported(CrucibleError):
    """505 http_version_not_supported."""


class InsufficientStorage(CrucibleError):
    """507 insufficient_storage: the daemon's disk budget has no room."""


# -- failures with no answer from the daemon --------------------------------------------------


class ConnectionFailed(CrucibleError):
    """The daemon could not be reached (status 0, code "unreachable")."""

    def __init__(self, message: str) -> None:
        super().__init__(0, "unreachable", message)


class ConnectionLost(CrucibleError):
    """The connection broke mid-answer, or the frame stream was invalid (status 0, code
    "connection_lost"); `__cause__` says how."""

    def __init__(self, message: str) -> None:
        super().__init__(0, "connection_lost", message)


class Timeout(CrucibleError):
    """The daemon sent nothing within the client's timeout (status 0, code "timeout")."""

    def __init__(self, message: str) -> None:
        super().__init__(0, "timeout", message)


class ProtocolError(CrucibleError):
    """The daemon's answer was not what the protocol says (status 0, code "protocol")."""

    def __init__(self, message: str) -> None:
        super().__init__(0, "protocol", message)


class CommandFailed(CrucibleError):
    """`check=True` and the command did not exit 0 (status 0, code "command_failed")."""

    def __init__(self, result: RunResult) -> None:
        how = result.describe()
        super().__init__(0, "command_failed", f"command {result.cmd!r} {how}")
        self.result = result


_BY_CODE: Dict[str, Type[CrucibleError]] = {
    "invalid_request": InvalidRequest,
    "refused_entry": RefusedEntry,
    "is_a_directory": IsADirectory,
    "invalid_image": InvalidImage,
    "unauthorized": Unauthorized,
    "permission_denied": PermissionDenied,
    "egress_not_allowed": EgressNotAllowed,
    "not_found": NotFound,
    "exec_not_found": ExecNotFound,
    "container_not_found": ContainerNotFound,
    "container_not_ready": ContainerNotReady,
    "method_not_allowed": MethodNotAllowed,
    "request_timeout": RequestTimeout,
    "conflict": Conflict,
    "cache_busy": CacheBusy,
    "not_supported": NotSupported,
    "length_required": LengthRequired,
    "payload_too_large": PayloadTooLarge,
    "no_space": NoSpace,
    "image_too_large": ImageTooLarge,
    "upgrade_required": UpgradeRequired,
    "too_many_requests": TooManyRequests,
    "headers_too_large": HeadersTooLarge,
    "internal": InternalError,
    "io_error": IoError,
    "agent_error": AgentError,
    "backend_unavailable": BackendUnavailable,
    "shutting_down": ShuttingDown,
    "too_many_connections": TooManyConnections,
    "http_version_not_supported": HttpVersionNotSupported,
    "insufficient_storage": InsufficientStorage,
}

# A code this SDK does not know (a newer daemon's) still gets the class of its status.
_BY_STATUS: Dict[int, Type[CrucibleError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    404: NotFound,
    405: MethodNotAllowed,
    408: RequestTimeout,
    409: Conflict,
    411: LengthRequired,
    413: PayloadTooLarge,
    426: UpgradeRequired,
    429: TooManyRequests,
    431: HeadersTooLarge,
    500: InternalError,
    502: AgentError,
    503: ServiceUnavailable,
    505: HttpVersionNotSupported,
    507: InsufficientStorage,
}

# The daemon's words for a sandbox nobody (visible to this key) has: docs/api.md, Ownership.
_NO_SANDBOX = "no sandbox with id"


def error_class(status: int, code: str) -> Type[CrucibleError]:
    return _BY_CODE.get(code) or _BY_STATUS.get(status) or CrucibleError


def from_response(status: int, body: bytes,
                  not_found: Optional[Type[NotFound]] = None) -> CrucibleError:
    """The exception for an error answer. `not_found` is what a 404 `not_found` means on this
    endpoint (a file, an image, ...) when the message does not say the sandbox is missing."""
    try:
        envelope = json.loads(body)
        code, message = str(envelope["code"]), str(envelope["message"])
    except (ValueError, KeyError, TypeError):
        code, message = "unknown", body.decode(errors="replace").strip() or f"HTTP {status}"
    cls = error_class(status, code)
    if code == "not_found":
        if message.startswith(_NO_SANDBOX):
            cls = SandboxNotFound
        elif not_found is not None:
            cls = not_found
    return cls(status, code, message)
