#!/usr/bin/env python3
"""A read-only FUSE passthrough of a folder, with the kernel's attribute and entry caches off, so
that every open, stat, directory lookup and read is a request to this user-space server, as
each is a round trip to the servers of a cluster filesystem (NFS, Lustre, GPFS) whose client
has nothing cached. bench_shards reads its datasets through it to measure what one file per
image costs on such a filesystem against tar shards (docs/BENCHMARKS.md, "Data: tar shards
against files"). It adds no delay of its own: the round trip is FUSE's (two context switches
and this Python server), below a network's.

Needs libfuse2 (Debian: fuse, libfuse2) and fusepy (pip install fusepy), and /dev/fuse.

Usage: fuse_passthrough.py SOURCE MOUNTPOINT     (foreground; unmount with fusermount -u)
"""
import errno
import os
import sys

from fuse import FUSE, FuseOSError, Operations


class Passthrough(Operations):
    def __init__(self, root):
        self.root = os.path.realpath(root)

    def _path(self, path):
        return os.path.join(self.root, path.lstrip("/"))

    def getattr(self, path, fh=None):
        try:
            st = os.lstat(self._path(path))
        except OSError as e:
            raise FuseOSError(e.errno)
        return {k: getattr(st, k) for k in ("st_atime", "st_ctime", "st_gid", "st_mode",
                                            "st_mtime", "st_nlink", "st_size", "st_uid")}

    def readdir(self, path, fh):
        return [".", ".."] + os.listdir(self._path(path))

    def open(self, path, flags):
        if flags & (os.O_WRONLY | os.O_RDWR):
            raise FuseOSError(errno.EROFS)
        return os.open(self._path(path), flags)

    def read(self, path, size, offset, fh):
        return os.pread(fh, size, offset)

    def release(self, path, fh):
        os.close(fh)

    def statfs(self, path):
        st = os.statvfs(self._path(path))
        return {k: getattr(st, k) for k in ("f_bavail", "f_bfree", "f_blocks", "f_bsize",
                                            "f_favail", "f_ffree", "f_files", "f_flag",
                                            "f_frsize", "f_namemax")}


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    FUSE(Passthrough(sys.argv[1]), sys.argv[2], foreground=True, ro=True, nothreads=True,
         attr_timeout=0, entry_timeout=0, negative_timeout=0)


if __name__ == "__main__":
    main()
