"""Blob encoding: batches compressed on a worker thread are the rows encoding makes one by one."""

from __future__ import annotations

import os
import random

import pytest

from stashpoint.blobs.objects import BlobCodec, Blobs
from stashpoint.crypto import Cipher
from stashpoint.stores.memory import MemoryStore


def _items() -> list[tuple[bytes, bytes]]:
    """Empty, tiny (never compressed), text, incompressible and barely compressible blobs."""
    import hashlib

    rng = random.Random(5)
    datas = [b"", b"x", b"y" * 63, b"z" * 64]
    datas += [b"def f(x):\n    return x\n" * rng.randint(3, 400) for _ in range(20)]
    datas += [rng.randbytes(rng.randint(64, 20_000)) for _ in range(20)]
    datas += [rng.randbytes(900) + b"\0" * 100 for _ in range(5)]  # saves < 10 %: raw
    return [(hashlib.sha256(d).digest(), d) for d in datas]


@pytest.mark.parametrize("backend", ["multi", "one by one"])
def test_a_batch_compressed_later_is_encoded_as_each_blob_alone(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    blobs = Blobs(MemoryStore(), None)
    if backend == "one by one":  # python-zstandard's cffi backend has no multi_compress
        real = blobs._cctx

        class NoMulti:
            def __init__(self) -> None:
                self.compress = real().compress

        monkeypatch.setattr(blobs, "_cctx", NoMulti)
    items = _items()
    rows = blobs.rows_of(items, blobs.encode_later(items).result())
    assert rows == [blobs.encode(d, data) for d, data in items]
    assert {r.codec for r in rows} == {BlobCodec.RAW, BlobCodec.ZSTD}
    for row, (d, data) in zip(rows, items, strict=True):
        assert blobs.inflate(d, row.codec, row.size, row.data) == data


def test_a_batch_compressed_later_is_sealed_in_an_encrypted_store() -> None:
    blobs = Blobs(MemoryStore(), None, cipher=Cipher(os.urandom(32)))
    items = _items()
    rows = blobs.rows_of(items, blobs.encode_later(items).result())
    plain = Blobs(MemoryStore(), None)
    alones = [plain.encode(d, x) for d, x in items]
    for row, (d, data), alone in zip(rows, items, alones, strict=True):
        codec, frame = blobs.open_frame(d, row.codec, row.data)
        assert (codec, frame, row.size) == (alone.codec, alone.data, alone.size)
        assert blobs.inflate(d, codec, row.size, frame) == data


class _Spy:
    """A compressor that records how many bytes each call was given."""

    def __init__(self, real: object, seen: list[int]) -> None:
        self._real, self._seen = real, seen

    def compress(self, data: bytes) -> bytes:
        self._seen.append(len(data))
        return self._real.compress(data)  # type: ignore[attr-defined, no-any-return]

    def multi_compress_to_buffer(self, datas: list[bytes], threads: int = 0) -> object:
        self._seen.extend(len(d) for d in datas)
        return self._real.multi_compress_to_buffer(datas, threads=threads)  # type: ignore[attr-defined]


def test_an_incompressible_large_blob_is_stored_raw_after_compressing_a_sample_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Random bytes (a workspace's binaries, media, archives) do not save the 10 % a
    compressed blob must: zstd sees a sample of them, not all, alone and in a batch. A large
    text blob and one whose bytes compress only in part are still compressed whole."""
    import hashlib

    blobs = Blobs(MemoryStore(), None)
    real = blobs._cctx()
    seen: list[int] = []
    monkeypatch.setattr(blobs, "_cctx", lambda: _Spy(real, seen))
    rng = random.Random(9)
    noise = rng.randbytes(3 << 20)
    text = b"def f(x):\n    return x + 1\n" * 40_000
    half = rng.randbytes(300_000) + b"\0" * 700_000  # saves ~70 %
    for data in (noise, noise[: 200 << 10], text, half):
        digest = hashlib.sha256(data).digest()
        seen.clear()
        row = blobs.encode(digest, data)
        batch = blobs.rows_of([(digest, data)], blobs.encode_later([(digest, data)]).result())
        assert batch == [row]
        assert blobs.inflate(digest, row.codec, row.size, row.data) == data
        if data in (text, half):
            assert row.codec == BlobCodec.ZSTD and len(data) in seen
        else:
            assert row.codec == BlobCodec.RAW and row.data == data
            assert seen and max(seen) <= 64 << 10  # a sample, twice: alone, then in a batch


def test_a_batch_with_incompressible_blobs_among_others_keeps_each_in_its_place() -> None:
    import hashlib

    blobs = Blobs(MemoryStore(), None)
    rng = random.Random(3)
    datas = [b"", rng.randbytes(200_000), b"x" * 100, rng.randbytes(150_000), b"y" * 300_000]
    datas += [rng.randbytes(500), b"z" * 5000]
    items = [(hashlib.sha256(d).digest(), d) for d in datas]
    rows = blobs.rows_of(items, blobs.encode_later(items).result())
    assert rows == [blobs.encode(d, data) for d, data in items]
    raw, zstd = BlobCodec.RAW, BlobCodec.ZSTD
    assert [r.codec for r in rows] == [raw, raw, zstd, raw, zstd, raw, zstd]
    for row, (d, data) in zip(rows, items, strict=True):
        assert blobs.inflate(d, row.codec, row.size, row.data) == data
