#!/usr/bin/env python3
"""Writes the committed seed corpora under fuzz/corpus/<target>/ (run from anywhere).

Seeds are small real inputs: the conformance fixtures for the frame decoder, real agent
requests, real HTTP heads and ExecRequest bodies, real tar archives (with the escape variants
the extractor must refuse) and well-formed vsock / virtqueue scenarios. Re-running it rewrites
the same files; libFuzzer grows its own corpus elsewhere (see `cargo xtask fuzz`).
"""

import io
import json
import os
import struct
import tarfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CORPUS = os.path.join(HERE, "corpus")


def write(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def frame_decoder():
    manifest = json.load(open(os.path.join(ROOT, "fixtures", "manifest.json")))
    for i, fx in enumerate(manifest["fixtures"]):
        if fx["file"] == "chunked_200k.bin":
            continue  # 200 KB: max_payload.bin already covers maximal frames
        data = open(os.path.join(ROOT, "fixtures", fx["file"]), "rb").read()
        flags = 0 if fx["direction"] == "guest_to_host" else 1
        # [flags][split seed][stream]; vary the seed so the splits differ between seeds.
        write("frame_decoder", fx["file"].replace(".bin", ""), bytes([flags, (17 * i + 1) % 256]) + data)


def message(obj):
    body = json.dumps(obj, separators=(",", ":")).encode()
    return struct.pack(">I", len(body)) + body


def agent_request():
    reqs = {
        "ping": {"op": "ping"},
        "shutdown": {"op": "shutdown"},
        "exec_true": {"op": "exec", "request": {"cmd": ["true"]}},
        "exec_full": {"op": "exec", "interactive": True, "request": {
            "cmd": ["sh", "-c", "echo $X; pwd"], "env": {"X": "1", "PATH": "/bin"},
            "cwd": "/tmp", "timeout_s": 30}},
        "exec_bad_env": {"op": "exec", "request": {"cmd": ["env"], "env": {"A=B": "c"}}},
        "exec_nul": {"op": "exec", "request": {"cmd": ["a\u0000b"]}},
        "put_files": {"op": "put_files", "path": "/work"},
        "get_file": {"op": "get_file", "path": "/etc/hostname"},
        "unknown_field": {"op": "ping", "extra": 1},
    }
    for name, obj in reqs.items():
        write("agent_request", name, bytes([3]) + message(obj))
    write("agent_request", "too_large", bytes([1]) + b"\xff\xff\xff\xff{}")
    write("agent_request", "cut_body", bytes([0x82]) + struct.pack(">I", 40) + b'{"op":"pi')


def http_exec_request():
    bodies = [
        {"cmd": ["true"]},
        {"cmd": ["sh", "-c", "cat"], "env": {"A": "b"}, "cwd": "/", "timeout_s": 5},
        {"cmd": []},
        {"cmd": ["x"], "timeout_s": -1},
        {"cmd": ["x"], "cwd": "rel"},
        {"cmd": ["x"], "bogus": True},
    ]
    heads = [
        b"POST /sandboxes/sb-0123456789abcdef/exec?stdin=1 HTTP/1.1\r\nHost: x\r\n"
        b"Content-Length: %d\r\n\r\n",
        b"POST /sandboxes/sb-1/exec?stdin=true&x=y HTTP/1.1\r\nAuthorization: Bearer k\r\n"
        b"content-length:  %d \r\n\r\n",
        b"POST /sandboxes/sb-1/exec?stdin=1 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n"
        b"Content-Length: %d\r\n\r\n",
        b"POST /sandboxes/sb-1/exec?stdin=1 HTTP/1.1\r\nUpgrade: tcp\r\nConnection: Upgrade\r\n"
        b"Content-Length: %d\r\n\r\n",
        b"POST /sandboxes/sb-1/exec HTTP/1.1\r\nContent-Length: %d\r\n\r\n",
        b"GET /sandboxes/sb-1/exec?stdin=1 HTTP/1.1\r\nContent-Length: %d\r\n\r\n",
        b"POST /sandboxes/sb-1/exec?stdin=maybe HTTP/1.1\r\nContent-Length: %d\r\n\r\n",
    ]
    for i, head in enumerate(heads):
        body = json.dumps(bodies[i % len(bodies)]).encode()
        write("http_exec_request", "head%d" % i, (head % len(body)) + body)
    write("http_exec_request", "no_length",
          b"POST /sandboxes/sb-1/exec?stdin=1 HTTP/1.1\r\nHost: x\r\n\r\n{\"cmd\":[\"true\"]}")


def http1_head():
    # [split][flags][bytes]: flags' bits 0-5 are the most header fields, bit 6 a 256-byte
    # head limit. Requests and responses of every shape the three readers see, and the
    # shapes a smuggler would send.
    heads = {
        "hijack": b"POST /sandboxes/sb-0123456789abcdef/exec?stdin=1 HTTP/1.1\r\nHost: x\r\n"
                  b"Authorization: Bearer k\r\nContent-Length: 5\r\n\r\n{\"a\"}",
        "one_shot_close": b"POST /sandboxes/sb-1/exec HTTP/1.1\r\nContent-Length: 2\r\n"
                          b"Connection: keep-alive, close\r\n\r\n{}",
        "chunked_expect": b"POST /x HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n"
                          b"Expect: 100-continue\r\n\r\n",
        "proxy_get": b"GET http://Example.ORG:8080/a/b?c=d HTTP/1.1\r\nHost: evil.example\r\n"
                     b"Proxy-Connection: keep-alive\r\nConnection: keep-alive, X-Secret\r\n"
                     b"X-Secret: hop\r\n\r\n",
        "connect_ipv6": b"CONNECT [::1]:8443 HTTP/1.1\r\nHost: [::1]:8443\r\n\r\n\x16\x03\x01",
        "options_star": b"OPTIONS * HTTP/1.0\r\nX-Tab:\ta\tb\t\r\n\r\n",
        "bare_lf_upgrade": b"GET /x HTTP/1.1\nUpgrade: tcp\nConnection: Upgrade\n\n",
        "leading_empty_line": b"\r\nGET / HTTP/1.1\r\nX-Obs: caf\xc3\xa9\r\n\r\n",
        "response_chunked": b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\n"
                            b"transfer-encoding: chunked\r\n\r\n5\r\n",
        "response_error": b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\n"
                          b"Content-Length: 12\r\nConnection: close\r\n\r\n{\"e\":\"x\"}",
        "response_101": b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: tcp\r\n"
                        b"Connection: Upgrade\r\n\r\n\x01\x00",
        "response_no_reason": b"HTTP/1.0 204\r\n\r\n",
        "length_and_chunked": b"POST / HTTP/1.1\r\nContent-Length: 5\r\n"
                              b"Transfer-Encoding: chunked\r\n\r\n",
        "two_lengths": b"POST / HTTP/1.1\r\nContent-Length: 5\r\ncontent-length: 5\r\n\r\n",
        "obs_fold": b"POST / HTTP/1.1\r\nContent-Length: 5\r\n ignored: 6\r\n\r\n",
        "space_before_colon": b"POST / HTTP/1.1\r\nTransfer-Encoding : chunked\r\n\r\n",
        "http2_preface": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    }
    for i, (name, head) in enumerate(heads.items()):
        write("http1_head", name, bytes([(37 * i + 11) % 256, 0x20]) + head)
    # Over a 256-byte limit, and over a 2-field limit.
    write("http1_head", "over_256_bytes",
          bytes([128, 0x40 | 0x20]) + b"GET / HTTP/1.1\r\nX-Big: " + b"a" * 300 + b"\r\n\r\n")
    write("http1_head", "over_2_fields",
          bytes([200, 2]) + b"GET / HTTP/1.1\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n")


def tar_bytes(members):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for m in members:
            info = tarfile.TarInfo(m["name"])
            info.type = m.get("type", tarfile.REGTYPE)
            info.mode = m.get("mode", 0o644)
            info.linkname = m.get("link", "")
            data = m.get("data", b"")
            info.size = len(data) if info.type == tarfile.REGTYPE else 0
            tar.addfile(info, io.BytesIO(data) if info.type == tarfile.REGTYPE else None)
    return buf.getvalue()


def tar_extract():
    D, F, S, H = tarfile.DIRTYPE, tarfile.REGTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE
    cases = {
        "plain": [{"name": "a", "type": D, "mode": 0o755}, {"name": "a/b.txt", "data": b"hi\n"}],
        "dot_slash": [{"name": "./x/./y", "data": b"y"}],
        "dotdot": [{"name": "../escape", "data": b"x"}],
        "absolute": [{"name": "/tmp/escape", "data": b"x"}],
        "symlink_out": [{"name": "l", "type": S, "link": "/etc"},
                        {"name": "l/passwd", "data": b"x"}],
        "symlink_rel_out": [{"name": "d", "type": D}, {"name": "d/l", "type": S, "link": "../../x"}],
        "symlink_in_then_write": [{"name": "t", "data": b"t"}, {"name": "l", "type": S, "link": "t"},
                                  {"name": "l", "data": b"over"}],
        "symlink_dir_parent": [{"name": "d", "type": D}, {"name": "l", "type": S, "link": "d"},
                               {"name": "l/f", "data": b"f"}],
        "hardlink_out": [{"name": "h", "type": H, "link": "../../etc/passwd"}],
        "hardlink_in": [{"name": "f", "data": b"f"}, {"name": "h", "type": H, "link": "f"}],
        "hardlink_to_symlink": [{"name": "l", "type": S, "link": "."},
                                {"name": "h", "type": H, "link": "l"}],
        "replace_dir_with_file": [{"name": "d", "type": D}, {"name": "d", "data": b"x"}],
        "fifo": [{"name": "p", "type": tarfile.FIFOTYPE}],
        "setuid": [{"name": "s", "data": b"#!/bin/sh\n", "mode": 0o4755}],
    }
    for name, members in cases.items():
        write("tar_extract", name, tar_bytes(members))
    # PAX long names (GNU_FORMAT uses ././@LongLink for long names).
    write("tar_extract", "long_name", tar_bytes([{"name": "d/" + "n" * 150, "data": b"z"}]))


def desc(addr, length, flags=0, nxt=0):
    return struct.pack("<QIHH", addr, length, flags, nxt)


def blk_header(kind, sector):
    return struct.pack("<IIQ", kind, 0, sector)


def virtqueue_memory(descs, heads, avail_idx=None, extra=()):
    """Guest memory: descriptor table at 0, avail ring at 0x100, used ring at 0x200."""
    mem = bytearray(0xa00)
    for i, d in enumerate(descs):
        mem[16 * i:16 * i + 16] = d
    idx = len(heads) if avail_idx is None else avail_idx
    mem[0x100:0x104] = struct.pack("<HH", 0, idx)
    for i, h in enumerate(heads):
        mem[0x104 + 2 * i:0x106 + 2 * i] = struct.pack("<H", h)
    for addr, data in extra:
        mem[addr:addr + len(data)] = data
    return bytes(mem)


def virtqueue_chain():
    NEXT, WRITE, INDIRECT = 1, 2, 4
    IN, OUT, FLUSH, GET_ID = 0, 1, 4, 8
    headers = [(0x300, blk_header(IN, 0)), (0x310, blk_header(OUT, 1)),
               (0x320, blk_header(GET_ID, 0)), (0x330, blk_header(FLUSH, 0)),
               (0x340, blk_header(IN, 15)), (0x350, blk_header(OUT, 2**61)),
               (0x400, b"\xab" * 512)]
    mixed = [
        desc(0x300, 16, NEXT, 1), desc(0x400, 512, WRITE | NEXT, 2), desc(0x600, 1, WRITE),
        desc(0x310, 16, NEXT, 4), desc(0x400, 512, NEXT, 5), desc(0x601, 1, WRITE),
        desc(0x320, 16, NEXT, 7), desc(0x700, 21, WRITE),
    ]
    def seed(flags, size_log2, memory, desc_addr=0, avail=0x100, used=0x200):
        return bytes([flags, size_log2]) + struct.pack("<III", desc_addr, avail, used) + memory
    write("virtqueue_chain", "in_out_get_id", seed(0, 3, virtqueue_memory(mixed, [0, 3, 6], extra=headers)))
    write("virtqueue_chain", "read_only_write", seed(1, 3, virtqueue_memory(mixed, [3, 0], extra=headers)))
    flush_and_edge = [
        desc(0x330, 16, NEXT, 1), desc(0x602, 1, WRITE),
        desc(0x340, 16, NEXT, 3), desc(0x400, 1024, WRITE | NEXT, 4), desc(0x603, 1, WRITE),
        desc(0x350, 16, NEXT, 6), desc(0x400, 512, NEXT, 7), desc(0x604, 1, WRITE),
    ]
    write("virtqueue_chain", "flush_and_out_of_range",
          seed(0, 3, virtqueue_memory(flush_and_edge, [0, 2, 5], extra=headers)))
    loop = [desc(0x300, 16, NEXT, 1), desc(0x400, 512, WRITE | NEXT, 0)]
    write("virtqueue_chain", "loop", seed(0, 3, virtqueue_memory(loop, [0], extra=headers)))
    indirect_table = desc(0x300, 16, NEXT, 1) + desc(0x400, 512, WRITE | NEXT, 2) + desc(0x605, 1, WRITE)
    indirect = [desc(0x800, len(indirect_table), INDIRECT)]
    write("virtqueue_chain", "indirect",
          seed(0, 3, virtqueue_memory(indirect, [0], extra=headers + [(0x800, indirect_table)])))
    write("virtqueue_chain", "bad_avail_idx", seed(0, 3, virtqueue_memory(mixed, [0], avail_idx=1000, extra=headers)))
    write("virtqueue_chain", "high_region", seed(0, 3, virtqueue_memory(
        [desc(0x300, 16, NEXT, 1), desc(0x20000, 512, WRITE | NEXT, 2), desc(0x20ffc, 8, WRITE)],
        [0], extra=headers)))
    write("virtqueue_chain", "misaligned", seed(0, 3, virtqueue_memory(mixed, [0], extra=headers), desc_addr=8))
    write("virtqueue_chain", "not_power_of_two", seed(0, 0x80 | 6, virtqueue_memory(mixed, [0], extra=headers)))


def vsock_packet():
    def send(port, sel, opc, flags=0, data=b"", shape=0, sel_extra=b""):
        return bytes([0, shape, port, sel]) + sel_extra + bytes([opc, flags, len(data)]) + data
    rx = bytes([2, 0x03])
    backend = bytes([6])
    REQUEST, RESPONSE, RST, SHUTDOWN, RW, CREDIT_UPDATE, CREDIT_REQUEST = 1, 2, 3, 4, 5, 6, 7
    # The guest connects to the host service; data both ways; the guest shuts down.
    write("vsock_packet", "guest_connect", rx + send(0, 0, REQUEST) + backend
          + bytes([4, 0, 5, 0]) + b"hello" + backend + send(0, 0, RW, data=b"ping")
          + send(0, 0, CREDIT_REQUEST) + rx + send(0, 0, SHUTDOWN, flags=3) + backend)
    # A host client connects to guest port 1; the guest accepts; data both ways; the host closes.
    write("vsock_packet", "host_connect", rx + bytes([3, 0, 0]) + backend
          + send(0, 1, RESPONSE, sel_extra=b"\x00") + backend + bytes([4, 0, 4, 0]) + b"data"
          + backend + send(0, 1, RW, data=b"abc", shape=0x40, sel_extra=b"\x00")
          + send(0, 1, CREDIT_UPDATE, sel_extra=b"\x00") + bytes([5, 0]) + backend + rx + backend)
    # The guest refuses a host connection.
    write("vsock_packet", "host_connect_refused", rx + bytes([3, 0, 1]) + backend
          + send(1, 1, RST, sel_extra=b"\x00") + backend)
    # Malformed handshake lines, and a connection to a port nobody serves.
    write("vsock_packet", "bad_handshake", rx + bytes([3, 2, 12]) + b"CONNECT x\n\n\n\n" + backend
          + bytes([3, 1]) + struct.pack("<I", 0xffffffff) + backend + send(2, 2, REQUEST) + backend)
    # Tiny and odd rx buffers, split rx buffers, a packet whose header lies about its length.
    write("vsock_packet", "odd_buffers", bytes([2, 0x0b, 10]) + struct.pack("<H", 30)
          + struct.pack("<H", 20) + bytes([2, 0x05]) + struct.pack("<HH", 100, 0)
          + send(0, 0, REQUEST) + backend + bytes([0, 0x20, 0, 0, RW, 0, 2]) + b"xy"
          + struct.pack("<I", 70000) + backend)
    # The host floods a guest connection that advertised little credit.
    write("vsock_packet", "credit", rx + bytes([0, 0x08, 0, 0, REQUEST, 0]) + struct.pack("<I", 10)
          + bytes([0]) + backend + bytes([4, 0]) + struct.pack("<H", 100) + b"z" * 100 + backend
          + bytes([0, 0x18, 0, 0, CREDIT_UPDATE, 0]) + struct.pack("<II", 50, 10) + bytes([0])
          + backend + rx + backend)


if __name__ == "__main__":
    frame_decoder()
    agent_request()
    http_exec_request()
    http1_head()
    tar_extract()
    virtqueue_chain()
    vsock_packet()
