"""Large artifacts outside the workspace, attached to a checkpoint by name.

An adapter's weights, a KV-cache dump or a dataset is too big to copy at every checkpoint and
does not belong in the workspace tree. It is attached by name (``weights``) and stored as
*content-defined* chunks (FastCDC, through the compiled ``pyfastcdc``): chunk boundaries
follow the content, not fixed offsets, so changing a few MB of a multi-GB file, or inserting
bytes near its start, stores about that much again; every other chunk is deduplicated.
Fixed-size chunks (what workspace files use) would re-store everything after an insertion.

Why pyfastcdc: a compiled FastCDC 2020 cutter (~750 MB/s here); the pure-Python ``fastcdc``
package and a hand-written rolling hash are two orders of magnitude too slow for GB files.
Average chunk 512 KiB (min 128 KiB, max 2 MiB): small enough that a 4 MB edit re-stores
about 5 MB, large enough that a 10 GB file is ~16k chunk files, not millions.

Storage reuses the blob layer unchanged: the chunks are blobs (loose files in the blob
directory, or rows where there is none) and the artifact is a chunk list named by the SHA-256
of the whole content - the same shape as a large workspace file. So reading verifies every
chunk and the whole, and GC, ``verify`` and bundles only need to know that a checkpoint's
``artifacts`` are references (they do).

Both directions stream: the file is read through a bounded buffer while it is cut, and a
restore writes chunk by chunk into a temporary file beside the target, fsyncs it, and renames
it over the target only after the whole content verified. All-zero
chunks are skipped with a seek, so sparse files stay sparse when restored.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from ._fsutil import atomic_file, sweep_temp_files
from .errors import StoreError, UsageError
from .model import ArtifactRef
from .stores.base import BlobRow

if TYPE_CHECKING:
    from pyfastcdc import FastCDC

    from .blobs.objects import Blobs

__all__ = [
    "AVG_CHUNK",
    "ArtifactRef",
    "check_name",
    "read_artifact",
    "restore_artifact",
    "store_artifacts",
]

AVG_CHUNK = 512 << 10
"""FastCDC's target chunk size (min a quarter of it, max four times it)."""
_READ_BUFFER = 8 << 20
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@+-]{0,127}")

Progress = Callable[[int, int], None]
PathArg = str | os.PathLike[str]


def check_name(name: str) -> str:
    """An artifact name is a short token (letters, digits, ``_.@+-``): it shows up in the
    CLI (``--artifact NAME=PATH``) and in default file names on fetch."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise UsageError(
            f"invalid artifact name {name!r}: use up to 128 letters, digits and _.@+- "
            "(starting with a letter or digit)"
        )
    return name


def _chunker() -> FastCDC:
    try:
        from pyfastcdc import FastCDC
    except ImportError as exc:  # pragma: no cover - a core dependency
        raise UsageError("artifacts need the pyfastcdc package: pip install pyfastcdc") from exc
    return FastCDC(AVG_CHUNK)


def store_artifacts(
    blobs: Blobs,
    specs: Mapping[str, PathArg | None],
    progress: Progress | None = None,
) -> tuple[dict[str, ArtifactRef | None], list[BlobRow]]:
    """Read and store the named files; returns name -> reference (None: detach that name)
    and the rows the checkpoint commit must carry (chunk lists; chunks are written here).

    Nothing is recorded until the checkpoint that references them commits, so an error
    midway (a file vanished, disk full) leaves only unreferenced chunks for GC.
    """
    refs: dict[str, ArtifactRef | None] = {}
    todo: list[tuple[str, Path]] = []
    for name, path in specs.items():
        check_name(name)
        if path is None:
            refs[name] = None
            continue
        todo.append((name, Path(os.path.abspath(os.fspath(path)))))
    if not todo:
        return refs, []
    writer = blobs.writer()
    cdc = _chunker()
    done = [0, 0]  # artifacts, bytes

    def counted(chunks: Iterator[memoryview]) -> Iterator[memoryview]:
        for piece in chunks:
            done[1] += len(piece)
            if progress is not None:
                progress(done[0], done[1])
            yield piece

    for name, path in todo:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)  # a FIFO must not block
        except FileNotFoundError:
            raise UsageError(f"artifact {name!r}: {path} does not exist") from None
        except OSError as exc:
            raise UsageError(f"artifact {name!r}: cannot read {path}: {exc.strerror}") from exc
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise UsageError(f"artifact {name!r}: {path} is not a regular file")
        try:
            with os.fdopen(fd, "rb", buffering=0) as f:
                pieces = (c.data for c in cdc.cut_stream(f))
                digest, size, n = writer.add_chunks(counted(pieces))
                after = os.fstat(f.fileno())
        except OSError as exc:  # a read error, or the store's disk is full
            raise StoreError(f"artifact {name!r} from {path} was not stored: {exc}") from exc
        if (after.st_size, after.st_mtime_ns) != (st.st_size, st.st_mtime_ns) or size != (
            st.st_size
        ):
            # Something wrote to it meanwhile: what was read may be half old, half new.
            raise UsageError(
                f"artifact {name!r}: {path} changed while it was being read; nothing was "
                "recorded (attach it again once its writer is done)"
            )
        refs[name] = ArtifactRef(digest.hex(), size, str(path), stat.S_IMODE(st.st_mode), n)
        done[0] += 1
    return refs, writer.take_pending()


def merge(
    base: Mapping[str, ArtifactRef], changes: Mapping[str, ArtifactRef | None]
) -> dict[str, ArtifactRef]:
    """A checkpoint's artifacts: its parent's, with the names just attached or detached."""
    out = dict(base)
    for name, ref in changes.items():
        if ref is None:
            out.pop(name, None)
        else:
            out[name] = ref
    return dict(sorted(out.items()))


def read_artifact(blobs: Blobs, ref: ArtifactRef) -> Iterator[bytes]:
    """The artifact's content, chunk by chunk, each chunk verified; the whole content is
    checked against the digest after the last chunk (an error then means: discard it)."""
    return blobs.iter_content(bytes.fromhex(ref.digest))


def restore_target(ref: ArtifactRef, dest: PathArg | None, name: str) -> Path:
    """Where a restore writes: ``dest`` (a directory gets the original file name) or the
    path the artifact was attached from. Refuses what is not a plain absolute file path."""
    if dest is None:
        raw = ref.path
        if not os.path.isabs(raw) or "\0" in raw or ".." in Path(raw).parts:
            raise UsageError(f"artifact {name!r} records an unsafe path {raw!r}; give a target")
        target = Path(raw)
    else:
        target = Path(os.path.abspath(os.fspath(dest)))
        if target.is_dir():
            target = target / (Path(ref.path).name or name)
    if target.is_dir() or (target.is_symlink() and target.resolve().is_dir()):
        raise UsageError(f"cannot restore artifact {name!r} over the directory {target}")
    return target


_ZEROS = bytes(4 * AVG_CHUNK)


def restore_artifact(
    blobs: Blobs,
    ref: ArtifactRef,
    target: Path,
    *,
    progress: Progress | None = None,
    durable: bool = True,
    replace: bool = True,
) -> int:
    """Write the artifact to ``target`` atomically (temp file beside it, fsync, rename,
    directory fsync); returns the bytes written. A damaged store raises IntegrityError and
    leaves ``target`` as it was. A symlink at ``target`` is replaced, never followed.
    Without ``replace``, anything at ``target`` when the file is published raises
    FileExistsError and is left as it was."""
    target.parent.mkdir(parents=True, exist_ok=True)
    total = 0
    with atomic_file(target, durable=durable, replace=replace) as fd:
        for part in read_artifact(blobs, ref):
            n = len(part)
            if n <= len(_ZEROS) and part == _ZEROS[:n]:
                os.lseek(fd, n, os.SEEK_CUR)  # leave a hole: sparse stays sparse
            else:
                view = memoryview(part)
                while view:
                    view = view[os.write(fd, view) :]
            total += n
            if progress is not None:
                progress(0, total)
        os.ftruncate(fd, total)  # the file's length when it ends in a hole
        os.fchmod(fd, ref.mode & 0o7777)
    return total


def sweep_leftovers(targets: Mapping[str, Path]) -> None:
    """Remove temp files that a killed restore left beside its targets (dead writers only)."""
    for parent in {t.parent for t in targets.values()}:
        if parent.is_dir():
            sweep_temp_files(parent, recursive=False)
