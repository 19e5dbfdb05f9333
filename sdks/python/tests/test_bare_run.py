"""run()'s lean read of a short answer, without a daemon: what it reads itself, and that it
hands everything else, every byte intact, to the general path (which then judges it)."""

import json
import socket
import threading

import pytest

from crucible_sdk import _bare_run, _http1, _sync_io, codec, errors
from crucible_sdk.stream import ExecStream

EXIT = json.dumps({"exit_code": 3, "duration_ms": 1, "signal": "", "timed_out": False,
                   "oom_killed": False, "error": ""}).encode()


def chunked(*chunks: bytes, end: bytes = b"0\r\n\r\n") -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + end


def frames(*pairs) -> bytes:
    return b"".join(codec.encode_frame(kind, payload) for kind, payload in pairs)


NORMAL = frames((codec.STDOUT, b"out\r\n0\r\n\r\n"), (codec.STDERR, b"err"),
                (codec.STDOUT, b"more"), (codec.EXIT, EXIT))


def connection_fed(pieces, close=True):
    """A Connection whose peer writes `pieces` one by one (then closes, if asked)."""
    ours, theirs = socket.socketpair()
    ours.settimeout(10)

    def feed():
        try:
            for piece in pieces:
                theirs.sendall(piece)
                threading.Event().wait(0.01)  # separate reads, as over a real socket
        except OSError:
            pass  # the reader closed its end once it had judged the answer
        if close:
            theirs.close()

    threading.Thread(target=feed, daemon=True).start()
    return _sync_io.Connection(ours, 10), theirs


def test_a_whole_body_parses_into_output_and_exit_document():
    out, err, doc = _bare_run.parse_body(chunked(NORMAL))
    assert (out, err, doc["exit_code"]) == (b"out\r\n0\r\n\r\nmore", b"err", 3)
    split = chunked(NORMAL[:5], NORMAL[5:40], NORMAL[40:])
    assert _bare_run.parse_body(split) == (out, err, doc)


@pytest.mark.parametrize("cut", [1, 4, 9, 15, 17, 30])
def test_an_answer_read_in_pieces_is_whole_however_it_is_split(cut):
    body = chunked(NORMAL[:cut], NORMAL[cut:])
    # Pieces that end exactly where a chunk's data holds the terminator's bytes.
    at = body.index(b"0\r\n\r\n") + 5
    conn, _ = connection_fed([body[:at], body[at:]], close=False)
    done = _bare_run.read_result(conn)
    assert done is not None and done[:2] == (b"out\r\n0\r\n\r\nmore", b"err")
    assert conn.buf == b""


def test_a_clean_prefix_asks_for_more_and_odd_bodies_are_for_the_general_path():
    whole = chunked(NORMAL)
    assert _bare_run.parse_body(whole[:20]) is _bare_run._MORE
    assert _bare_run.parse_body(whole[:-2]) is _bare_run._MORE
    odd = [
        chunked(NORMAL).replace(b"\r\n", b";x=1\r\n", 1),          # a chunk extension
        chunked(NORMAL, end=b"0\r\nTrailer: x\r\n\r\n"),            # trailers
        chunked(NORMAL) + b"NEXT\r\n\r\n",                          # bytes after the body
        chunked(frames((codec.EXIT, EXIT), (codec.STDOUT, b"x"))),  # data after the exit
        chunked(frames((codec.STDIN, b"x"), (codec.EXIT, EXIT))),   # a client's frame type
        chunked(frames((codec.STDOUT, b"x"))),                      # no exit frame
        chunked(frames((codec.EXIT, b"[1]"))),                      # not an ExecResult
        chunked(b"\x01\x00\x00\x00\x00\x01\x00\x01" + b"x" * 65537 + frames((codec.EXIT, EXIT))),
        b" 5\r\nhello\r\n0\r\n\r\n",                                # a space in a size
        b"5\r\nhelloXY0\r\n\r\n",                                   # data not ended by CRLF
    ]
    for body in odd:
        assert _bare_run.parse_body(body) is None, body[:40]


def general_path(conn, head=b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked"):
    response = _sync_io.Response(_http1.parse_head(head), conn, None)
    return ExecStream(response, ["cmd"], None, 0).collect()


@pytest.mark.parametrize("body,outcome", [
    (chunked(NORMAL, end=b"0\r\nTrailer: x\r\n\r\n"), 3),
    (chunked(NORMAL).replace(b"\r\n", b";x=1\r\n", 1), 3),
    (chunked(frames((codec.EXIT, EXIT), (codec.STDOUT, b"x"))), "data_after_exit"),
    (chunked(frames((codec.STDOUT, b"x"))), "missing_exit"),
    (chunked(frames((codec.EXIT, b"[1]"))), "not an ExecResult"),
])
def test_what_it_hands_back_the_general_path_reads_from_its_first_byte(body, outcome):
    conn, _ = connection_fed([body[:7], body[7:]])
    assert _bare_run.read_result(conn) is None
    assert conn.buf == body
    if isinstance(outcome, int):
        result = general_path(conn)
        assert (result.exit_code, result.stdout, result.stderr) == (
            outcome, b"out\r\n0\r\n\r\nmore", b"err")
    else:
        with pytest.raises(errors.ProtocolError, match=outcome):
            general_path(conn)


def test_a_long_answer_streams_on_through_the_general_path():
    big = frames(*[(codec.STDOUT, bytes([i % 251]) * 65536) for i in range(3)],
                 (codec.EXIT, EXIT))
    body = chunked(*[big[i:i + 30000] for i in range(0, len(big), 30000)])
    conn, _ = connection_fed([body[i:i + 40000] for i in range(0, len(body), 40000)])
    assert _bare_run.read_result(conn) is None
    assert len(conn.buf) > _bare_run.LIMIT
    result = general_path(conn)
    assert result.stdout == b"".join(bytes([i % 251]) * 65536 for i in range(3))


def test_a_broken_connection_leaves_what_arrived_for_the_re_attach():
    body = chunked(NORMAL)
    conn, _ = connection_fed([body[:25]])
    assert _bare_run.read_result(conn) is None
    assert conn.buf == body[:25]
    with pytest.raises(errors.ConnectionLost):
        general_path(conn)
