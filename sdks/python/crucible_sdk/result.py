"""What a command yields: typed events while it runs, and a `RunResult` once it has ended."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Union

from . import codec
from .errors import CommandFailed, ProtocolError
from .models import ExecResult, Usage

OutputCallback = Callable[[bytes], object]
_decode = json.JSONDecoder().decode


@dataclass(frozen=True)
class Stdout:
    """Bytes the command wrote to stdout (a chunk boundary means nothing)."""

    data: bytes


@dataclass(frozen=True)
class Stderr:
    """Bytes the command wrote to stderr."""

    data: bytes


@dataclass(frozen=True)
class Exit:
    """The command ended; always the last event of a stream."""

    result: ExecResult


Event = Union[Stdout, Stderr, Exit]


def exit_result(payload: bytes) -> ExecResult:
    try:
        return ExecResult.from_dict(json.loads(payload))
    except (ValueError, KeyError, TypeError) as e:
        raise ProtocolError(f"an exit frame that is not an ExecResult: {e}") from e


def exit_json(payload: bytes) -> Dict[str, Any]:
    """The exit frame's document, checked only as far as RunResult reads it unparsed."""
    try:
        value = _decode(payload.decode())
        if isinstance(value, dict) and type(value["exit_code"]) is int:
            return value
    except (ValueError, KeyError, TypeError):
        pass
    raise ProtocolError(f"an exit frame that is not an ExecResult: {payload[:200]!r}")


def event_of(frame: codec.Frame) -> Event:
    kind = frame.type
    if kind == codec.STDOUT:
        return Stdout(frame.payload)
    if kind == codec.STDERR:
        return Stderr(frame.payload)
    if kind == codec.EXIT:
        return Exit(exit_result(frame.payload))
    raise ProtocolError(f"the daemon sent a {frame.type_name} frame, which only clients send")


@dataclass(frozen=True)
class ContainerLog:
    """A container's log (`GET …/containers/{name}/logs`): what its main process wrote, every
    run of it, the latest MiB the daemon keeps; `exit` once it has exited for good (its
    `output_dropped_bytes` counts what the log no longer holds), None while it runs."""

    stdout: bytes
    stderr: bytes
    exit: Optional[ExecResult]

    @property
    def stdout_text(self) -> str:
        return self.stdout.decode("utf-8", "replace")

    @property
    def stderr_text(self) -> str:
        return self.stderr.decode("utf-8", "replace")


def parse_log(data: bytes) -> ContainerLog:
    """A container's log from its frame stream, which ends with an exit frame only once the
    container has exited for good."""
    decoder = codec.Decoder(response=False)
    out: List[bytes] = []
    err: List[bytes] = []
    exit: Optional[ExecResult] = None
    try:
        frames = decoder.feed(data)
        decoder.close()
    except codec.DecodeError as e:
        raise ProtocolError(f"a container log that is not a frame stream: {e}") from e
    for frame in frames:
        if exit is not None:
            raise ProtocolError("a container log with frames after its exit frame")
        event = event_of(frame)
        if isinstance(event, Stdout):
            out.append(event.data)
        elif isinstance(event, Stderr):
            err.append(event.data)
        else:
            exit = event.result
    return ContainerLog(b"".join(out), b"".join(err), exit)


class RunResult:
    """A finished command: its output, and how it ended (the fields of its ExecResult)."""

    __slots__ = ("cmd", "exec_id", "stdout", "stderr", "_raw", "_result")

    def __init__(self, cmd: List[str], exec_id: str, stdout: bytes, stderr: bytes,
                 result: Union[ExecResult, Dict[str, Any]]) -> None:
        self.cmd = cmd
        #: The command's exec_id (given, or made up by the daemon): what `attach` takes.
        self.exec_id = exec_id
        self.stdout = stdout
        self.stderr = stderr
        # run() hands over the exit frame's JSON as parsed: the model is built when asked
        # for, as most callers read only the exit code.
        if isinstance(result, ExecResult):
            self._result: Optional[ExecResult] = result
            self._raw: Dict[str, Any] = {}
        else:
            self._result = None
            self._raw = result

    def __repr__(self) -> str:
        return (f"RunResult(cmd={self.cmd!r}, exec_id={self.exec_id!r}, "
                f"exit_code={self.exit_code}, stdout={self.stdout[:80]!r}, "
                f"stderr={self.stderr[:80]!r})")

    @property
    def result(self) -> ExecResult:
        """The exit frame's ExecResult."""
        if self._result is None:
            self._result = ExecResult.from_dict(self._raw)
        return self._result

    @property
    def exit_code(self) -> int:
        """The exit status; -1 when killed by a signal or never started."""
        if self._result is None:
            return int(self._raw["exit_code"])
        return self._result.exit_code

    @property
    def signal(self) -> str:
        """The signal that killed it (`"SIGKILL"`), else ""."""
        if self._result is None:
            return str(self._raw.get("signal", ""))
        return self._result.signal

    @property
    def timed_out(self) -> bool:
        return self.result.timed_out

    @property
    def oom_killed(self) -> bool:
        return self.result.oom_killed

    @property
    def usage(self) -> Optional[Usage]:
        """Resource usage, None when none was collected."""
        return self.result.usage

    @property
    def duration_ms(self) -> int:
        return self.result.duration_ms

    @property
    def error(self) -> str:
        """Why the command could not run or was lost; "" on a normal exit."""
        if self._result is None:
            return str(self._raw.get("error", ""))
        return self._result.error

    @property
    def output_dropped_bytes(self) -> int:
        """Output a re-attach asked for that the agent no longer kept."""
        return self.result.output_dropped_bytes or 0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.signal and not self.error

    @property
    def stdout_text(self) -> str:
        """stdout as UTF-8 (undecodable bytes replaced)."""
        return self.stdout.decode("utf-8", "replace")

    @property
    def stderr_text(self) -> str:
        return self.stderr.decode("utf-8", "replace")

    def describe(self) -> str:
        """How it ended, in words."""
        r = self.result
        if r.timed_out:
            return "timed out"
        if r.signal:
            return f"was killed by {r.signal}" + (" (out of memory)" if r.oom_killed else "")
        if r.error:
            return f"failed: {r.error}"
        return f"exited with {r.exit_code}"

    def check(self) -> RunResult:
        """Itself when the command succeeded; else raises CommandFailed."""
        if not self.ok:
            raise CommandFailed(self)
        return self


class Collector:
    """Accumulates a stream's output (calling the callbacks as it arrives) into a RunResult."""

    __slots__ = ("_out", "_err", "_on_stdout", "_on_stderr", "result")

    def __init__(self, on_stdout: Optional[OutputCallback] = None,
                 on_stderr: Optional[OutputCallback] = None) -> None:
        self._out: List[bytes] = []
        self._err: List[bytes] = []
        self._on_stdout = on_stdout
        self._on_stderr = on_stderr
        self.result: Optional[ExecResult] = None

    def seed(self, out: List[bytes], err: List[bytes]) -> None:
        """Output already received (and passed to the callbacks) before the events."""
        self._out[:0] = out
        self._err[:0] = err

    def add(self, event: Event) -> None:
        if isinstance(event, Stdout):
            self._out.append(event.data)
            if self._on_stdout is not None:
                self._on_stdout(event.data)
        elif isinstance(event, Stderr):
            self._err.append(event.data)
            if self._on_stderr is not None:
                self._on_stderr(event.data)
        else:
            self.result = event.result

    def finish(self, cmd: List[str], exec_id: str) -> RunResult:
        if self.result is None:
            raise ProtocolError("the stream ended without an exit frame")
        return RunResult(cmd, exec_id, b"".join(self._out), b"".join(self._err), self.result)
