"""Where the daemon is: a Unix socket path, `unix:PATH` or `http://host:port`, and the key.

Parsed once per client so that every connection (JSON, exec streams, hijacked and WebSocket
sessions) goes to the same place with the same credentials.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

DEFAULT_SOCKET = "/run/crucible/crucible.sock"


@dataclass(frozen=True)
class Address:
    """`path` is set for a Unix socket, `host`/`port` for TCP."""

    path: str = ""
    host: str = ""
    port: int = 0

    @property
    def is_unix(self) -> bool:
        return bool(self.path)

    @property
    def host_header(self) -> str:
        # The daemon routes nothing on Host; a Unix socket has no authority, so any name does.
        return f"{self.host}:{self.port}" if not self.is_unix else "crucible"

    def __str__(self) -> str:
        return f"unix:{self.path}" if self.is_unix else f"http://{self.host}:{self.port}"


def parse_address(host: Optional[str] = None) -> Address:
    """`host`, else $CRUCIBLE_HOST, else the local daemon's socket."""
    raw = host or os.environ.get("CRUCIBLE_HOST") or DEFAULT_SOCKET
    if raw.startswith("https://"):
        raise ValueError("crucible's API is plain HTTP; put a TLS proxy in front for https://")
    if raw.startswith("http://"):
        authority = raw[len("http://"):].rstrip("/")
        name, sep, port = authority.rpartition(":")
        if not sep or not name or "/" in authority or not port.isdigit():
            raise ValueError(f"invalid daemon address {raw!r}: expected http://HOST:PORT")
        return Address(host=name.strip("[]"), port=int(port))
    path = raw[len("unix:"):] if raw.startswith("unix:") else raw
    if not path:
        raise ValueError(f"invalid daemon address {raw!r}: empty socket path")
    return Address(path=path)


def api_key_from_env(api_key: Optional[str]) -> Optional[str]:
    return api_key if api_key is not None else os.environ.get("CRUCIBLE_API_KEY") or None
