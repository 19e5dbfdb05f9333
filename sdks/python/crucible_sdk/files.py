"""`sandbox.files`: files in and out of a sandbox, through the daemon's tar endpoints."""

from __future__ import annotations

import os
import pathlib
import posixpath
from typing import IO, TYPE_CHECKING, Optional, Union

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
        """Copies a guest file to the local path, or a guest directory into the local
        directory (through the image's `tar`). Returns the local path."""
        target = pathlib.Path(local)
        tmp = target.with_name(target.name + ".crucible-part")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as out:
                self._client.get_file_to(self._id, path, out, container=self._container)
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

