"""Tar archives for the files endpoints, with the standard library's tarfile.

Uploads are built in a spooled temporary file (memory up to SPOOL bytes, disk beyond) so that
a large tree never sits whole in memory and its Content-Length is known before sending.
Downloads of a directory are extracted with tarfile's "data" filter where Python has it, and
otherwise with the same refusals checked by hand: nothing lands outside the destination.
"""

from __future__ import annotations

import io
import os
import pathlib
import tarfile
import tempfile
import time
from typing import IO, Union

SPOOL = 32 * 1024 * 1024
PathLike = Union[str, "os.PathLike[str]"]


def spool() -> IO[bytes]:
    return tempfile.SpooledTemporaryFile(max_size=SPOOL)


def pack_dir(local: PathLike, include_root: bool) -> IO[bytes]:
    """A tar of the directory `local`: its contents at the archive's top, or (include_root)
    under its own name. Rewound, ready to send."""
    path = pathlib.Path(local)
    if not path.is_dir():
        raise NotADirectoryError(f"{path} is not a directory")
    out = spool()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        if include_root:
            tar.add(str(path), arcname=path.resolve().name)
        else:
            for child in sorted(path.iterdir()):
                tar.add(str(child), arcname=child.name)
    out.seek(0)
    return out


def pack_file(name: str, data: bytes, mode: int) -> bytes:
    """A tar of one regular file."""
    buf = io.BytesIO()
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    info.mtime = int(time.time())
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def size_of(f: IO[bytes]) -> int:
    f.seek(0, io.SEEK_END)
    size = f.tell()
    f.seek(0)
    return size


def extract(archive: IO[bytes], dest: PathLike) -> int:
    """Extracts a tar stream beneath `dest`; returns how many members it wrote."""
    target = pathlib.Path(dest)
    target.mkdir(parents=True, exist_ok=True)
    count = 0
    with tarfile.open(fileobj=archive, mode="r|*") as tar:
        for member in tar:
            if hasattr(tarfile, "data_filter"):
                tar.extract(member, str(target), filter="data")
            else:  # Python before the extraction filters: the same refusals, by hand
                _check(member, target)
                tar.extract(member, str(target))
            count += 1
    return count


def _check(member: tarfile.TarInfo, target: pathlib.Path) -> None:
    root = target.resolve()
    where = (root / member.name).resolve()
    if member.name.startswith("/") or not str(where).startswith(str(root)):
        raise ValueError(f"refusing tar member {member.name!r}: outside {root}")
    if member.isdev() or member.isfifo():
        raise ValueError(f"refusing tar member {member.name!r}: a device or fifo")
    if member.issym() or member.islnk():
        link = (where.parent / member.linkname).resolve()
        if member.linkname.startswith("/") or not str(link).startswith(str(root)):
            raise ValueError(f"refusing tar member {member.name!r}: a link out of {root}")
