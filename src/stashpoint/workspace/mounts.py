"""Mount points inside a workspace: another filesystem is not the workspace's.

A bind mount or a tmpfs at ``ws/mp/m`` shows its own files at that path; a snapshot that took
them in made a later rewind to a checkpoint taken before the mount delete files outside the
project, chmod the mounted directory, then fail with EBUSY on it, leaving an unfinished
restore. So, as ``tar --one-file-system`` and ``rsync -x`` do, a snapshot does not descend
into a directory on another device than the workspace root, and a restore never deletes,
writes or chmods in or at a mount point.

``st_dev`` alone misses a bind mount of a directory of the same filesystem (the usual case:
``mount --bind ~/data ws/data``): on Linux the mount table (``/proc/self/mountinfo``) names
every mount point, so both are used. Read once per snapshot or restore (~30 µs, most of it
the kernel writing the table); under a watcher only when a poll says the table changed.
"""

from __future__ import annotations

import os
import re

__all__ = ["MOUNT_TABLE", "mount_points"]

MOUNT_TABLE = "/proc/self/mountinfo"
_OCTAL = re.compile(rb"\\([0-7]{3})")


def _escape(path: bytes) -> bytes:
    """A path as the mount table writes it (space, tab, newline and backslash in octal)."""
    for ch in b"\\ \t\n":
        path = path.replace(bytes((ch,)), b"\\%03o" % ch)
    return path


def mount_points(root: bytes) -> frozenset[bytes]:
    """The mount points strictly below ``root``, as paths relative to it (empty where the
    system has no mount table to read: then only ``st_dev`` tells)."""
    try:
        with open(MOUNT_TABLE, "rb") as f:
            table = f.read()
    except OSError:
        return frozenset()
    real = os.path.realpath(root).rstrip(b"/")
    prefix = _escape(real) + b"/"
    if b" " + prefix not in table:  # the usual case: nothing is mounted below the root
        return frozenset()
    found = set()
    for line in table.splitlines():
        fields = line.split(b" ", 5)  # id, parent, major:minor, root, mount point, ...
        if len(fields) > 4 and fields[4].startswith(prefix):
            found.add(_OCTAL.sub(lambda m: bytes((int(m.group(1), 8),)), fields[4][len(prefix) :]))
    return frozenset(found)
