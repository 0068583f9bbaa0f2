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
