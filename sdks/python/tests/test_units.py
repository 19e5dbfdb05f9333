"""The SDK's pieces without a daemon: HTTP/1.1 parsing, error mapping, models, the pool."""

import json
import pathlib
import subprocess
import sys

import pytest

from crucible_sdk import _api, _http1, codec, errors
from crucible_sdk.models import CreateSandbox, ExecRequest, ExecResult, SandboxInfo, TerminalSize
from crucible_sdk.pool import parse_pool

TOOLS = pathlib.Path(__file__).resolve().parents[1] / "tools"


@pytest.mark.parametrize("split", [1, 2, 3, 7, 1000])
def test_chunked_bodies_decode_in_any_split(split):
    body = b"5;ext=1\r\nhello\r\n1\r\n \r\nA\r\n0123456789\r\n0\r\nTrailer: x\r\n\r\nNEXT"
    decoder = _http1.ChunkedDecoder()
    out = b""
    for i in range(0, len(body), split):
        out += b"".join(decoder.feed(body[i:i + split]))
    assert out == b"hello 0123456789"
    assert decoder.done and decoder.leftover == b"NEXT"


@pytest.mark.parametrize("bad", [b"zz\r\nx", b"3\r\nabcXY", b"1" * 2000])
def test_malformed_chunks_are_protocol_errors(bad):
    with pytest.raises(errors.ProtocolError):
        _http1.ChunkedDecoder().feed(bad)


def test_response_heads():
    head = _http1.parse_head(b"HTTP/1.1 200 OK\r\nX-A: 1\r\nx-a: 2\r\nContent-Length: 5")
    assert (head.status, head.get("x-a"), head.content_length, head.keep_alive) == (
        200, "1, 2", 5, True)
    closing = _http1.parse_head(b"HTTP/1.1 404 Not Found\r\nConnection: close")
    assert not closing.keep_alive and closing.until_close
    with pytest.raises(errors.ProtocolError):
        _http1.parse_head(b"SSH-2.0-OpenSSH")
    with pytest.raises(ValueError):
        _http1.request_head("GET", "/", "h", [("X", "a\r\nb")], 0)


@pytest.mark.parametrize("status,code,cls", [
    (400, "invalid_request", errors.InvalidRequest), (400, "refused_entry", errors.RefusedEntry),
    (401, "unauthorized", errors.Unauthorized), (403, "egress_not_allowed", errors.EgressNotAllowed),
    (404, "exec_not_found", errors.ExecNotFound), (409, "conflict", errors.Conflict),
    (409, "cache_busy", errors.CacheBusy), (413, "no_space", errors.NoSpace),
    (429, "too_many_requests", errors.TooManyRequests), (500, "internal", errors.InternalError),
    (502, "agent_error", errors.AgentError), (503, "shutting_down", errors.ShuttingDown),
    (503, "backend_unavailable", errors.BackendUnavailable),
    (507, "insufficient_storage", errors.InsufficientStorage),
    (413, "image_too_large", errors.ImageTooLarge), (400, "invalid_image", errors.InvalidImage),
    (409, "some_new_code", errors.Conflict), (418, "teapot", errors.CrucibleError),
])
def test_each_code_has_its_class(status, code, cls):
    e = errors.from_response(status, json.dumps({"code": code, "message": "m"}).encode())
    assert type(e) is cls and (e.status, e.code, e.message) == (status, code, "m")


def test_not_found_is_told_apart_by_message_and_endpoint():
    def body(message):
        return json.dumps({"code": "not_found", "message": message}).encode()
    assert type(errors.from_response(404, body('no sandbox with id "sb-1"'),
                                     errors.FileNotFound)) is errors.SandboxNotFound
    assert type(errors.from_response(404, body("no such file"),
                                     errors.FileNotFound)) is errors.FileNotFound
    garbage = errors.from_response(502, b"<html>bad gateway</html>")
    assert type(garbage) is errors.AgentError and garbage.code == "unknown"


def test_models_read_unknown_fields_and_write_minimal_requests():
    result = ExecResult.from_dict({"exit_code": 1, "from_the_future": True})
    assert (result.exit_code, result.signal, result.usage) == (1, "", None)
    assert ExecRequest(cmd=["true"]).to_dict() == {"cmd": ["true"]}
    assert CreateSandbox().to_dict() == {}
    req = _api.create_request(network=["a.example:443"], memory_mib=256)
    assert req.to_dict() == {"memory_mib": 256, "network": {"allow": ["a.example:443"]}}
    req = _api.create_request(backend="microvm", container_slots=2)
    assert req.to_dict() == {"backend": "microvm", "container_slots": 2}
    info = SandboxInfo.from_dict({
        "id": "sb-0123456789abcdef", "state": "running", "backend": "namespace",
        "image": "default", "memory_mib": 512, "vcpus": 1, "created_at_ms": 1,
        "expires_at_ms": 2, "labels": {}, "active_execs": 0,
        "timings": {"create_to_ready_ms": 3, "agent_uptime_ms": 4}})
    assert info.timings.create_to_ready_ms == 3.0 and info.network is None and info.caches == []


def test_generated_models_match_openapi():
    done = subprocess.run([sys.executable, str(TOOLS / "gen_models.py"), "--check"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_bad_input_fails_before_sending():
    with pytest.raises(ValueError):
        _api.command([])
    with pytest.raises(TypeError):
        _api.command(["echo", 1])  # type: ignore[list-item]
    assert _api.command("echo hi") == ["sh", "-c", "echo hi"]
    with pytest.raises(ValueError):
        _api.exec_request(["true"], timeout=10**7)
    with pytest.raises(ValueError):
        _api.signal_number(0)
    with pytest.raises(ValueError):
        _api.files_target("sb-0123456789abcdef", "relative/path")
    with pytest.raises(ValueError):
        _api.sandbox_path("")


def test_tty_options_reach_the_request_and_are_checked_before_sending():
    plain = _api.exec_request(["sh"])
    assert plain.to_dict() == {"cmd": ["sh"]} and _api.exec_body(plain) == b'{"cmd":["sh"]}'
    tty = _api.exec_request(["sh"], tty=True)
    assert json.loads(_api.exec_body(tty)) == {"cmd": ["sh"], "tty": True}
    sized = _api.exec_request(["sh"], tty=True, tty_size=(30, 100))
    assert json.loads(_api.exec_body(sized)) == {
        "cmd": ["sh"], "tty": True, "tty_size": {"rows": 30, "cols": 100}}
    same = _api.exec_request(["sh"], tty=True, tty_size=TerminalSize(rows=30, cols=100))
    assert same.tty_size == sized.tty_size
    assert _api.exec_request(["sh"], tty=True, tty_size=(0, 65535)).tty_size == TerminalSize(
        rows=0, cols=65535)
    with pytest.raises(ValueError, match="tty_size"):
        _api.exec_request(["sh"], tty_size=(30, 100))  # no terminal to size
    with pytest.raises(ValueError, match="tty_size rows"):
        _api.exec_request(["sh"], tty=True, tty_size=(-1, 100))
    with pytest.raises(ValueError, match="tty_size cols"):
        _api.exec_request(["sh"], tty=True, tty_size=(30, 65536))
    with pytest.raises(TypeError, match="tty_size cols"):
        _api.exec_request(["sh"], tty=True, tty_size=(30, 100.0))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="tty_size"):
        _api.exec_request(["sh"], tty=True, tty_size=[30, 100])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="tty"):
        _api.exec_request(["sh"], tty=1)  # type: ignore[arg-type]


class _Recorder:
    """A session's channel that keeps what is sent."""

    exec_id = "ex-1"

    def __init__(self):
        self.sent = []

    def send(self, data):
        self.sent.append(data)

    def recv(self):
        return b""

    def closing_error(self):
        return None

    def close(self):
        pass


def test_resize_sends_a_resize_frame_and_checks_its_arguments():
    from crucible_sdk.session import Session

    channel = _Recorder()
    session = Session(channel, ["sh"], tty=True)
    session.resize(40, 120)
    frames = codec.Decoder(response=False).feed(b"".join(channel.sent))
    assert [(f.type, f.type_name, f.payload) for f in frames] == [
        (codec.RESIZE, "resize", b'{"rows":40,"cols":120}')]
    session.resize(0, 65535)
    assert channel.sent[-1][8:] == b'{"rows":0,"cols":65535}'
    channel.sent.clear()
    for rows, cols, error, named in [
        (-1, 80, ValueError, "rows"), (65536, 80, ValueError, "rows"),
        (24, -5, ValueError, "cols"), (24, 1 << 20, ValueError, "cols"),
        (24.5, 80, TypeError, "rows"), ("24", 80, TypeError, "rows"),
        (True, 80, TypeError, "rows"), (24, None, TypeError, "cols"),
    ]:
        with pytest.raises(error, match=named):
            session.resize(rows, cols)
    assert channel.sent == [], "nothing is sent for bad arguments"
    # A session without a terminal has nothing to resize: refused here, nothing sent.
    plain = Session(channel, ["cat"])
    assert not plain.tty
    with pytest.raises(ValueError, match="tty=True"):
        plain.resize(24, 80)
    assert channel.sent == []
    # Once the session has ended there is no terminal left to resize: nothing is sent.
    session.close()
    session.resize(30, 90)
    assert channel.sent == []


def test_async_resize_checks_as_the_blocking_one_does():
    import asyncio

    from crucible_sdk.aio.session import AsyncSession

    class AsyncRecorder(_Recorder):
        async def send(self, data):
            self.sent.append(data)

    async def main():
        channel = AsyncRecorder()
        session = AsyncSession(channel, ["sh"], tty=True)
        await session.resize(50, 132)
        assert channel.sent == [codec.encode_frame(codec.RESIZE, b'{"rows":50,"cols":132}')]
        with pytest.raises(ValueError, match="cols"):
            await session.resize(50, 70000)
        with pytest.raises(TypeError, match="rows"):
            await session.resize(None, 80)
        with pytest.raises(ValueError, match="tty=True"):
            await AsyncSession(channel, ["cat"]).resize(24, 80)
        assert len(channel.sent) == 1

    asyncio.run(main())


def test_a_resize_frame_from_the_daemon_is_a_protocol_error():
    """Resize frames go from client to daemon only: in an output stream, the decoder knows the
    type (as the Rust one does) and the SDK refuses the frame, on either read path."""
    from crucible_sdk.stream import ExecStream

    data = (codec.encode_frame(codec.STDOUT, b"x")
            + codec.encode_frame(codec.RESIZE, b'{"rows":1,"cols":1}')
            + (FIXTURES / "no_output.bin").read_bytes())
    assert [f.type for f in codec.Decoder(response=True).feed(data)] == [1, 6, 3]
    with pytest.raises(errors.ProtocolError):
        ExecStream(_Canned(data, 5), ["x"], None, 0).collect()
    with pytest.raises(errors.ProtocolError, match="resize"):
        list(ExecStream(_Canned(data, 5), ["x"], None, 0))


def test_pool_metrics_parse():
    text = """# HELP crucible_pool_ready ready
crucible_pool_ready{shape="default,memory=512,vcpus=1,backend=namespace"} 3
crucible_pool_size{shape="default,memory=512,vcpus=1,backend=namespace"} 4
crucible_pool_hits_total 9
crucible_pool_misses_total 1
crucible_pool_unpooled_total 2
crucible_pool_died_total 0
"""
    status = parse_pool(text)
    assert [(s.shape, s.ready, s.size) for s in status.shapes] == [
        ("default,memory=512,vcpus=1,backend=namespace", 3, 4)]
    assert (status.hits, status.misses, status.unpooled, status.hit_rate) == (9, 1, 2, 0.9)


class _Canned:
    """A response whose body is a recorded frame stream, in pieces of `split` bytes."""

    def __init__(self, data, split):
        self._pieces = [data[i:i + split] for i in range(0, len(data), split)]
        self.status = 200

    def header(self, name, default=""):
        return "ex-canned" if name == "x-crucible-exec-id" else default

    def read_some(self):
        return self._pieces.pop(0) if self._pieces else b""

    def close(self):
        pass


FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "fixtures"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
RESPONSES = [f for f in MANIFEST["fixtures"] if f["direction"] == "guest_to_host"]


@pytest.mark.parametrize("fixture", RESPONSES, ids=lambda f: f["file"])
@pytest.mark.parametrize("split", [1, 9, 70000])
def test_run_and_stream_read_the_fixtures_alike(fixture, split):
    """run()'s inline frame parser and the event iterator agree with the codec on every
    recorded stream: same output and result for valid ones, a ProtocolError for invalid."""
    from crucible_sdk.stream import ExecStream

    data = (FIXTURES / fixture["file"]).read_bytes()
    fast = ExecStream(_Canned(data, split), ["x"], None, 0)
    slow = ExecStream(_Canned(data, split), ["x"], None, 0)
    if fixture["invalid"] or any(f["type"] not in (1, 2, 3) for f in fixture["frames"]):
        with pytest.raises(errors.ProtocolError):
            fast.collect()
        with pytest.raises(errors.ProtocolError):
            list(slow)
        return
    result = fast.collect()
    events = list(slow)
    out = b"".join(e.data for e in events if type(e).__name__ == "Stdout")
    assert result.stdout == out and result.result == events[-1].result
    assert result.result.to_dict() == {k: v for k, v in ExecResult.from_dict(
        fixture["frames"][-1]["exec_result"]).to_dict().items()}


def test_the_websocket_transport_without_its_extra_says_how_to_get_it():
    code = ("import sys; sys.modules['websockets'] = None\n"
            "import crucible_sdk\n"
            "from crucible_sdk import _api\n"
            "c = crucible_sdk.Client('/nonexistent.sock')\n"
            "try:\n"
            "    c.interactive('sb-0123456789abcdef', _api.exec_request(['true']), 'websocket')\n"
            "except ImportError as e:\n"
            "    print(e)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=str(TOOLS.parent))
    assert "pip install 'crucible-sdk[websockets]'" in done.stdout, done.stdout + done.stderr
