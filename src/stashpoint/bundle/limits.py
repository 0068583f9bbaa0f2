"""What reading a bundle, and restoring what it holds, may cost: the limits a bundle is
checked against, and the ones for bundles this process wrote itself.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Limits:
    """Bounds on what reading a bundle, and restoring what it holds, may cost; exceeding one
    refuses the bundle (exit 1) before anything is written.

    Why these defaults: a bundle is a file someone else made, and a few KiB of it can declare
    terabytes of files or millions of directories. Every limit is checked against what the
    bundle declares, before anything is decompressed; contents are then decompressed and
    hashed in pieces of at most 1 MiB, so memory does not grow with what is declared. The
    defaults fit a laptop; ``stashpoint import --max-size/--max-files/--max-depth/--max-path``
    raise them for a bundle you trust (:meth:`raised`).
    """

    max_bytes: int = 4 << 30
    """Decompressed bytes of all entries together."""
    max_ratio: int = 1000
    """... and at most this many times the file's size (a decompression bomb's tell; 0: no
    such rule), which also bounds what one checkpoint restores ..."""
    ratio_floor: int = 64 << 20
    """... except that any bundle may expand to this much."""
    max_entry: int = 1 << 30
    """One entry, decompressed (state values are not chunked, so this is a value's limit)."""
    max_entries: int = 2_000_000
    """Entries in the file (each costs memory while it is checked)."""
    max_meta: int = 256 << 20
    """Records, logs, trees and chunk lists, which are held in memory while checking."""
    max_depth: int = 256
    """Directory nesting (restores recurse per level)."""
    max_path: int = 1024
    """Bytes of a path below the workspace root: a restore adds the directory it writes into,
    and the whole path must stay under the 4096 bytes Linux allows (1024 on macOS)."""
    max_restore: int = 4 << 30
    """Bytes one checkpoint's files, values and artifacts restore to (a chunk list can name
    one chunk many times)."""
    max_restore_entries: int = 250_000
    """Files, directories and symlinks one checkpoint's tree may expand to: a tree can name one
    subtree under many names, so a bundle of a few KiB could otherwise ask a restore for 2**40
    of them. Counted once per distinct subtree, so checking stays cheap."""
    cache_bytes: int = 32 << 20
    """Blob payloads kept in memory between checking and writing; the rest is read twice."""

    def raised(
        self,
        *,
        size: int | None = None,
        files: int | None = None,
        depth: int | None = None,
        path: int | None = None,
    ) -> Limits:
        """These limits with the ones a user raised (or lowered) by name: ``size`` is what the
        bundle may expand to, altogether and per checkpoint, and replaces the ratio rule (the
        user said how much they expect); ``files`` is files, directories and symlinks per
        checkpoint (and the file's entries, if more)."""
        new = self
        if size is not None:
            new = replace(
                new,
                max_bytes=size,
                max_restore=size,
                max_entry=size,
                max_ratio=0,
            )
        if files is not None:
            new = replace(new, max_restore_entries=files, max_entries=max(files, new.max_entries))
        if depth is not None:
            new = replace(new, max_depth=depth)
        if path is not None:
            new = replace(new, max_path=path)
        return new

    def expansion_cap(self, file_size: int) -> int:
        """The most a bundle of ``file_size`` bytes may expand to."""
        if not self.max_ratio:
            return self.max_bytes
        return min(self.max_bytes, max(self.ratio_floor, self.max_ratio * file_size))

    def restore_cap(self, file_size: int) -> int:
        """The most one checkpoint of a bundle of ``file_size`` bytes may restore to."""
        if not self.max_ratio:
            return self.max_restore
        return min(self.max_restore, max(self.ratio_floor, self.max_ratio * file_size))


TRUSTED = Limits(
    max_bytes=1 << 50,
    max_ratio=0,
    max_entries=1 << 40,
    max_meta=1 << 40,
    max_path=1 << 20,
    max_restore=1 << 50,
    max_restore_entries=1 << 40,
)
"""For bundles this process wrote from a store of its own (``stashpoint copy``, the check
``export`` runs): their size is the source store's, not a stranger's choice. Structure is
still checked in full, and memory stays bounded as for any bundle."""
