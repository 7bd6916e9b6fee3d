"""A FUSE pass-through file system without hard links, like Databricks' /Volumes.

Run as a process: `python -m tests.fuse.nolink_fs BACKING MOUNTPOINT` mounts BACKING
at MOUNTPOINT in the foreground until unmounted (fusermount3 -u). Everything is
passed through to BACKING except link(2), which fails with ENOSYS ("Function not
implemented"), the answer Unity Catalog volumes and other FUSE mounts give and the
one that makes delta-rs' default commit (a hard link, never replacing) fail.
"""

from __future__ import annotations

import errno
import os
import sys
from typing import Any

from mfusepy import FUSE, FuseOSError, Operations

_STAT_KEYS = (
    "st_atime", "st_ctime", "st_gid", "st_mode", "st_mtime", "st_nlink", "st_size", "st_uid"
)  # fmt: skip
_STATVFS_KEYS = (
    "f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files", "f_flag",
    "f_frsize", "f_namemax",
)  # fmt: skip


class NoLinkPassthrough(Operations):  # type: ignore[misc]
    def __init__(self, backing: str) -> None:
        self.backing = os.path.realpath(backing)

    def _real(self, path: str) -> str:
        return os.path.join(self.backing, path.lstrip("/"))

    def _call(self, function: Any, *args: Any) -> Any:
        try:
            return function(*args)
        except OSError as exc:
            raise FuseOSError(exc.errno or errno.EIO) from exc

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        stat = self._call(os.lstat, self._real(path))
        return {key: getattr(stat, key) for key in _STAT_KEYS}

    def readdir(self, path: str, fh: int) -> list[str]:
        return [".", "..", *self._call(os.listdir, self._real(path))]

    def access(self, path: str, amode: int) -> int:
        if not os.access(self._real(path), amode):
            raise FuseOSError(errno.EACCES)
        return 0

    def mkdir(self, path: str, mode: int) -> int:
        self._call(os.mkdir, self._real(path), mode)
        return 0

    def rmdir(self, path: str) -> int:
        self._call(os.rmdir, self._real(path))
        return 0

    def create(self, path: str, mode: int, fi: Any = None) -> int:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        return int(self._call(os.open, self._real(path), flags, mode))

    def open(self, path: str, flags: int) -> int:
        return int(self._call(os.open, self._real(path), flags))

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        return bytes(self._call(os.pread, fh, size, offset))

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        return int(self._call(os.pwrite, fh, data, offset))

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        self._call(os.truncate, self._real(path), length)
        return 0

    def flush(self, path: str, fh: int) -> int:
        return 0

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        self._call(os.fsync, fh)
        return 0

    def release(self, path: str, fh: int) -> int:
        self._call(os.close, fh)
        return 0

    def unlink(self, path: str) -> int:
        self._call(os.unlink, self._real(path))
        return 0

    def rename(self, old: str, new: str) -> int:
        self._call(os.rename, self._real(old), self._real(new))
        return 0

    def link(self, target: str, source: str) -> int:
        raise FuseOSError(errno.ENOSYS)

    def chmod(self, path: str, mode: int) -> int:
        self._call(os.chmod, self._real(path), mode)
        return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        self._call(os.utime, self._real(path), times)
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        stat = self._call(os.statvfs, self._real(path))
        return {key: getattr(stat, key) for key in _STATVFS_KEYS}


if __name__ == "__main__":
    backing, mountpoint = sys.argv[1:3]
    FUSE(NoLinkPassthrough(backing), mountpoint, foreground=True, nothreads=True)
