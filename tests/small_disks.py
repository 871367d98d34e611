"""Small real filesystems for node data directories, which a test can fill up.

`SmallDisk` makes an ext4 image of a few MiB in the test's directory, attaches it to a
loop device and mounts it at a data directory, so a node there meets a real disk: its
fsyncs reach a journal, its writes fail with ENOSPC once the disk is full. (A tmpfs
would fail writes alike, but its fsync does nothing.) `fill()` takes every free block
with a filler file (fallocate), `free()` deletes it. `close()` unmounts and detaches what
this disk made, by its own mount point and loop device, also after a failure; stop the
processes using it first.

Needs root, `losetup`, `mkfs.ext4` and `mount` (scripts/test.sh installs e2fsprogs).
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from pathlib import Path
from types import TracebackType
from typing import Self

#: Allocations the filler tries, largest first: what the largest leaves, a smaller one takes.
_FILL_STEPS = [1 << shift for shift in range(26, 11, -1)]  # 64 MiB down to 4 KiB


def unavailable_reason() -> str | None:
    """Why this machine cannot make small disks, or None when it can."""
    if os.geteuid() != 0:
        return "small disks need root (loop devices, mounts)"
    for tool in ("losetup", "mkfs.ext4", "mount", "umount"):
        if shutil.which(tool) is None:
            return f"small disks need `{tool}`"
    return None


def _run(*argv: str) -> str:
    result = subprocess.run(argv, check=False, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {result.returncode}: {result.stderr.strip()}")
    return result.stdout.strip()


class SmallDisk:
    """An ext4 filesystem of `size_mib` on a loop device, mounted at `mount_point`."""

    def __init__(self, image: Path, mount_point: Path, size_mib: int) -> None:
        self.image = image
        self.mount_point = mount_point
        self.size_mib = size_mib
        self.device: str | None = None
        self.mounted = False
        self._filler = mount_point / ".filler"

    def __enter__(self) -> Self:
        try:
            self.open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def open(self) -> None:
        """Makes the image (sparse), the filesystem (no blocks reserved for root: the nodes
        run as root here) and mounts it, with an empty directory at the mount point."""
        self.image.parent.mkdir(parents=True, exist_ok=True)
        with open(self.image, "wb") as image:
            image.truncate(self.size_mib << 20)
        _run("mkfs.ext4", "-q", "-F", "-m", "0", str(self.image))
        self.device = _run("losetup", "--find", "--show", str(self.image))
        self.mount_point.mkdir(parents=True, exist_ok=True)
        _run("mount", "-t", "ext4", self.device, str(self.mount_point))
        self.mounted = True
        (self.mount_point / "lost+found").rmdir()  # the data directory starts empty

    def close(self) -> None:
        """Unmounts, detaches the loop device and deletes the image; safe to call twice."""
        if self.mounted:
            _run("umount", str(self.mount_point))
            self.mounted = False
        if self.device is not None:
            _run("losetup", "--detach", self.device)
            self.device = None
        self.image.unlink(missing_ok=True)

    def free_bytes(self) -> int:
        stat = os.statvfs(self.mount_point)
        return stat.f_bavail * stat.f_frsize

    def fill(self) -> None:
        """Takes every free block with the filler file: writes that need a new block fail
        with ENOSPC until `free()`."""
        fd = os.open(self._filler, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            size = os.fstat(fd).st_size
            for step in _FILL_STEPS:
                while True:
                    try:
                        os.posix_fallocate(fd, size, step)
                    except OSError as error:
                        if error.errno != errno.ENOSPC:
                            raise
                        break
                    size += step
        finally:
            os.close(fd)

    def free(self) -> None:
        """Deletes the filler: the space is back."""
        self._filler.unlink(missing_ok=True)
