"""The spec's four conformance steps against fixtures/manifest.json."""

import hashlib
import json
import pathlib

import pytest

from crucible_sdk import codec

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "fixtures"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
VALID = [f for f in MANIFEST["fixtures"] if not f["invalid"]]
INVALID = [f for f in MANIFEST["fixtures"] if f["invalid"]]


def test_header_constants_match_the_codec():
    assert MANIFEST["header_size"] == codec.HEADER_SIZE
    assert MANIFEST["max_payload_size"] == codec.MAX_PAYLOAD
    assert MANIFEST["frame_types"] == {name: t for t, name in codec.TYPE_NAMES.items()}


@pytest.mark.parametrize("fixture", VALID, ids=lambda f: f["file"])
@pytest.mark.parametrize("split", [None, 1, 1000])
def test_valid_fixture_decodes_to_manifest_frames(fixture, split):
    data = (FIXTURES / fixture["file"]).read_bytes()
    chunks = [data] if split is None else [data[i : i + split] for i in range(0, len(data), split)]
    response = fixture["direction"] == "guest_to_host"
    frames = list(codec.iter_frames(chunks, response=response))
    assert len(frames) == len(fixture["frames"])
    for frame, want in zip(frames, fixture["frames"]):
        assert frame.type == want["type"]
        assert frame.type_name == want["type_name"]
        assert len(frame.payload) == want["length"]
        assert hashlib.sha256(frame.payload).hexdigest() == want["sha256"]
        if "text" in want:
            assert frame.payload.decode() == want["text"]
        if frame.type == codec.EXIT:
            assert json.loads(frame.payload) == want["exec_result"]


@pytest.mark.parametrize("fixture", INVALID, ids=lambda f: f["file"])
def test_invalid_fixture_fails_with_named_error(fixture):
    data = (FIXTURES / fixture["file"]).read_bytes()
    with pytest.raises(codec.DecodeError) as raised:
        list(codec.iter_frames([data], response=fixture["direction"] == "guest_to_host"))
    assert raised.value.kind == fixture["error"]


def test_encoding_stdin_session_is_byte_identical():
    fixture = next(f for f in MANIFEST["fixtures"] if f["file"] == "stdin_session.bin")
    assert fixture["direction"] == "host_to_guest"
    encoded = b"".join(
        codec.encode_frame(f["type"], f.get("text", "").encode()) for f in fixture["frames"]
    )
    assert encoded == (FIXTURES / "stdin_session.bin").read_bytes()


def test_encoding_tty_session_is_byte_identical():
    """The resize frames' payloads are the TerminalSize JSON exactly as the fixture has it,
    whether encoded from the manifest or by a terminal session's resize()."""
    import asyncio

    from crucible_sdk.aio.session import AsyncSession
    from crucible_sdk.session import Session

    fixture = next(f for f in MANIFEST["fixtures"] if f["file"] == "tty_session.bin")
    assert fixture["direction"] == "host_to_guest"
    want = (FIXTURES / "tty_session.bin").read_bytes()
    encoded = b"".join(
        codec.encode_frame(f["type"], f.get("text", "").encode()) for f in fixture["frames"]
    )
    assert encoded == want
    assert [f["type"] for f in fixture["frames"]].count(codec.RESIZE) == 2

    class Recorder:
        exec_id = "ex-1"

        def __init__(self):
            self.sent = b""

        def send(self, data):
            self.sent += data

        def recv(self):
            return b""

        def closing_error(self):
            return None

        def close(self):
            pass

    sync = Recorder()
    session = Session(sync, ["sh"], tty=True)
    session.resize(40, 120)
    session.send("stty size\r")
    session.resize(50, 132)
    session.send(b"exit\r")
    session.close_stdin()
    assert sync.sent == want

    class AsyncRecorder(Recorder):
        async def send(self, data):
            self.sent += data

    async def drive(channel):
        s = AsyncSession(channel, ["sh"], tty=True)
        await s.resize(40, 120)
        await s.send("stty size\r")
        await s.resize(50, 132)
        await s.send(b"exit\r")
        await s.close_stdin()

    asynchronous = AsyncRecorder()
    asyncio.run(drive(asynchronous))
    assert asynchronous.sent == want


def test_large_writes_are_chunked():
    data = bytes(200 * 1024)
    encoded = codec.encode_frames(codec.STDOUT, data)
    frames = codec.Decoder(response=False).feed(encoded)
    assert [len(f.payload) for f in frames] == [65536, 65536, 65536, 8192]
