"""Python SDK for crucible sandboxes."""

from .codec import (
    EXIT,
    HEADER_SIZE,
    MAX_PAYLOAD,
    STDERR,
    STDIN,
    STDIN_CLOSE,
    STDOUT,
    DecodeError,
    Decoder,
    Frame,
    encode_frame,
    encode_frames,
)

from .client import Client, CrucibleError, ExecOutput, Session

__all__ = [
    "Client",
    "CrucibleError",
    "ExecOutput",
    "Session",
    "EXIT",
    "HEADER_SIZE",
    "MAX_PAYLOAD",
    "STDERR",
    "STDIN",
    "STDIN_CLOSE",
    "STDOUT",
    "DecodeError",
    "Decoder",
    "Frame",
    "encode_frame",
    "encode_frames",
]
