"""`sandbox.files`: files in and out of a sandbox, through the daemon's tar endpoints."""

from __future__ import annotations

import email.utils
import os
import pathlib
import posixpath
from typing import IO, TYPE_CHECKING, Callable, NamedTuple, Optional, Union

from . import _api, _tar
from .errors import IsADirectory
from .models import FilesPutResult

if TYPE_CHECKING:
    from .client import Client

Data = Union[bytes, str]


def split_guest_path(path: str) -> tuple[str, str]:
    if not isinstance(path, str) or not path.startswith("/") or path.endswith("/"):
        raise ValueError(f"a guest file path must be absolute and name a file, got {path!r}")
    directory, name = posixpath.split(posixpath.normpath(path))
    return directory, name


class FileMeta(NamedTuple):
    """What a file download says of the file besides its bytes."""

    #: Bytes received.
    size: int
    #: Its mode bits in the sandbox (`X-Crucible-Mode`), setuid and all; None if not said.
    mode: Optional[int]
    #: Its modification time, in seconds since the epoch (`Last-Modified`); None if not said.
    modified: Optional[float]


def file_meta(size: int, header: Callable[[str], str]) -> FileMeta:
    """The metadata of a download from its response's `header` lookup; a header that is
    missing or malformed reads as None."""
    mode: Optional[int] = None
    try:
        mode = int(header("x-crucible-mode"), 8)
    except ValueError:
        pass
    modified: Optional[float] = None
    text = header("last-modified")
    if text:
        try:
            modified = email.utils.parsedate_to_datetime(text).timestamp()
        except (TypeError, ValueError):
            pass
    return FileMeta(size, mode, modified)


def keep_meta(path: pathlib.Path, meta: FileMeta) -> None:
    """Gives a downloaded file its mode and time, as `cp -p` does, but never setuid, setgid
    or sticky: a sandbox must not plant those on the host of whoever downloads its files."""
    if meta.mode is not None:
        os.chmod(path, meta.mode & 0o777)
    if meta.modified is not None:
        os.utime(path, (meta.modified, meta.modified))


def dir_tar_command(path: str) -> list[str]:
    # The files endpoint serves one file; a directory comes out through the image's tar.
    return ["tar", "-C", path, "-cf", "-", "."]


class Files:
    """Files of a sandbox's own root, or of one of its containers (`container`)."""

    def __init__(self, client: Client, sandbox_id: str,
                 container: Optional[str] = None) -> None:
        self._client = client
        self._id = sandbox_id
        self._container = container

    def write(self, path: str, data: Data, mode: int = 0o644) -> FilesPutResult:
        """Writes one file (str as UTF-8), creating its directory."""
        directory, name = split_guest_path(path)
        payload = data.encode() if isinstance(data, str) else data
        return self._client.put_tar(self._id, directory, _tar.pack_file(name, payload, mode),
                                    container=self._container)

    def read(self, path: str) -> bytes:
        """One file's bytes."""
        return self._client.get_file(self._id, path, container=self._container)

    def read_text(self, path: str) -> str:
        return self.read(path).decode()

    def upload_dir(self, local: _tar.PathLike, dest: str,
                   include_root: bool = False) -> FilesPutResult:
        """Copies the local directory's contents into `dest` (or the directory itself, under
        its own name, with include_root)."""
        archive = _tar.pack_dir(local, include_root)
        try:
            return self._client.put_tar(self._id, dest, archive, container=self._container)
        finally:
            archive.close()

    def upload_tar(self, dest: str, archive: Union[bytes, IO[bytes]]) -> FilesPutResult:
        """Extracts a tar archive (bytes or a binary file) beneath `dest`."""
        return self._client.put_tar(self._id, dest, archive, container=self._container)

    def download(self, path: str, local: _tar.PathLike) -> pathlib.Path:
        """Copies a guest file to the local path, with its mode and modification time (never
        setuid, setgid or sticky), or a guest directory into the local directory (through
        the image's `tar`, modes and times kept likewise). Returns the local path."""
        target = pathlib.Path(local)
        tmp = target.with_name(target.name + ".crucible-part")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as out:
                meta = self._client.get_file_meta_to(self._id, path, out,
                                                     container=self._container)
            keep_meta(tmp, meta)
            os.replace(tmp, target)
            return target
        except IsADirectory:
            pass
        finally:
            if tmp.exists():
                tmp.unlink()
        spooled = _tar.spool()
        try:
            stream = self._client.exec(self._id, _api.exec_request(dir_tar_command(path)),
                                       container=self._container)
            result = stream.collect(on_stdout=spooled.write)
            if not result.ok:
                result.check()
            spooled.seek(0)
            _tar.extract(spooled, target)
        finally:
            spooled.close()
        return target

