"""How the LangGraph saver packs LangGraph's serialized values inside stashpoint's state.

A value is LangGraph's ``(type, bytes)`` pair as its serializer wrote it, stored as ``flag,
len(type), type, data`` (data zstd-compressed with a fixed dictionary of LangChain's message
envelope when that saves 10 %), base64-encoded where it sits in a JSON state value. The saver
(:mod:`stashpoint.integrations.langgraph`) writes it and the readers of a store (diffs,
``show``, the web UI) read it, without LangGraph: this module imports neither LangGraph nor
anything above the content layer.
"""

from __future__ import annotations

import base64
import threading

import zstandard

from .errors import IntegrityError, SerializationError

RECORD_META = "langgraph"
"""The key of a record's meta the saver writes: ``{"id", "p", "ns"}`` of a put, ``{"removed":
why}`` of its marker of removed checkpoints (readers tell the saver's records by it)."""
_MAX_PAYLOAD = 512 * 1024 * 1024
_ZSTD_MIN = 64
_codecs = threading.local()


# Bytes of LangChain messages as LangGraph's serializer writes them, without content: a zstd
# "raw content" dictionary, so each message's envelope (module, class and field names)
# compresses to a few references. Stored data depends on it: never change it; a new
# dictionary needs a new flag in _pack.
_DICTIONARY_V1 = base64.b64decode(
    "x60FlL5sYW5nY2hhaW5fY29yZS5tZXNzYWdlcy5zeXN0ZW2tU3lzdGVtTWVzc2FnZYanY29udGVudKCxYWRkaXRp"
    "b25hbF9rd2FyZ3OAsXJlc3BvbnNlX21ldGFkYXRhgKR0eXBlpnN5c3RlbaRuYW1lwKJpZNkkMDAwMDAwMDAtMDAw"
    "MC0wMDAwLTAwMDAtMDAwMDAwMDAwMDAws21vZGVsX3ZhbGlkYXRlX2pzb27HqgWUvWxhbmdjaGFpbl9jb3JlLm1l"
    "c3NhZ2VzLmh1bWFurEh1bWFuTWVzc2FnZYanY29udGVudKCxYWRkaXRpb25hbF9rd2FyZ3OAsXJlc3BvbnNlX21l"
    "dGFkYXRhgKR0eXBlpWh1bWFupG5hbWXAomlk2SQwMDAwMDAwMC0wMDAwLTAwMDAtMDAwMC0wMDAwMDAwMDAwMDCz"
    "bW9kZWxfdmFsaWRhdGVfanNvbsfzBZS8bGFuZ2NoYWluX2NvcmUubWVzc2FnZXMudG9vbKtUb29sTWVzc2FnZYmn"
    "Y29udGVudKCxYWRkaXRpb25hbF9rd2FyZ3OAsXJlc3BvbnNlX21ldGFkYXRhgKR0eXBlpHRvb2ykbmFtZcCiaWTZ"
    "JDAwMDAwMDAwLTAwMDAtMDAwMC0wMDAwLTAwMDAwMDAwMDAwMKx0b29sX2NhbGxfaWTZJDAwMDAwMDAwLTAwMDAt"
    "MDAwMC0wMDAwLTAwMDAwMDAwMDAwMKhhcnRpZmFjdMCmc3RhdHVzp3N1Y2Nlc3OzbW9kZWxfdmFsaWRhdGVfanNv"
    "bsgBawWUumxhbmdjaGFpbl9jb3JlLm1lc3NhZ2VzLmFpqUFJTWVzc2FnZYmnY29udGVudKCxYWRkaXRpb25hbF9r"
    "d2FyZ3OAsXJlc3BvbnNlX21ldGFkYXRhgqptb2RlbF9uYW1loK1maW5pc2hfcmVhc29upHN0b3CkdHlwZaJhaaRu"
    "YW1lwKJpZNkkMDAwMDAwMDAtMDAwMC0wMDAwLTAwMDAtMDAwMDAwMDAwMDAwqnRvb2xfY2FsbHORhKRuYW1lpHRv"
    "b2ykYXJnc4GlcXVlcnmgomlk2SQwMDAwMDAwMC0wMDAwLTAwMDAtMDAwMC0wMDAwMDAwMDAwMDCkdHlwZal0b29s"
    "X2NhbGyyaW52YWxpZF90b29sX2NhbGxzkK51c2FnZV9tZXRhZGF0YYOsaW5wdXRfdG9rZW5zAa1vdXRwdXRfdG9r"
    "ZW5zAax0b3RhbF90b2tlbnMCs21vZGVsX3ZhbGlkYXRlX2pzb27H0QWUumxhbmdjaGFpbl9jb3JlLm1lc3NhZ2Vz"
    "LmFpqUFJTWVzc2FnZYmnY29udGVudKCxYWRkaXRpb25hbF9rd2FyZ3OAsXJlc3BvbnNlX21ldGFkYXRhgKR0eXBl"
    "omFppG5hbWXAomlk2SQwMDAwMDAwMC0wMDAwLTAwMDAtMDAwMC0wMDAwMDAwMDAwMDCqdG9vbF9jYWxsc5CyaW52"
    "YWxpZF90b29sX2NhbGxzkK51c2FnZV9tZXRhZGF0YcCzbW9kZWxfdmFsaWRhdGVfanNvbg=="
)
_ZDICT = zstandard.ZstdCompressionDict(_DICTIONARY_V1, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
_ZDICT.precompute_compress(level=3)  # once, not per compressor
_codecs = threading.local()


def _compressor() -> zstandard.ZstdCompressor:
    c: zstandard.ZstdCompressor | None = getattr(_codecs, "c", None)
    if c is None:
        c = _codecs.c = zstandard.ZstdCompressor(level=3, dict_data=_ZDICT, write_dict_id=False)
    return c


def _decompressor() -> zstandard.ZstdDecompressor:
    d: zstandard.ZstdDecompressor | None = getattr(_codecs, "d", None)
    if d is None:
        d = _codecs.d = zstandard.ZstdDecompressor(dict_data=_ZDICT)
    return d


# -- payloads: LangGraph's (type, bytes), compact ---------------------------------------------


def _pack(typed: tuple[str, bytes]) -> bytes:
    """``flag, len(type), type, data``: data compressed (flag 1: zstd with the dictionary
    above) when that saves 10 %, else as it is (flag 0)."""
    type_, data = typed
    name = type_.encode()
    if len(name) > 255:
        raise SerializationError(f"serializer type name too long: {type_[:40]!r}…")
    flag, data = 0, bytes(data)
    if len(data) >= _ZSTD_MIN:
        small = _compressor().compress(data)
        if len(small) <= len(data) * 0.9:
            flag, data = 1, small
    return bytes((flag, len(name))) + name + data


def _unpack(blob: bytes, d: zstandard.ZstdDecompressor | None = None) -> tuple[str, bytes]:
    if len(blob) < 2 or blob[0] > 1 or len(blob) < 2 + blob[1]:
        raise IntegrityError("malformed LangGraph value in the store")
    n = blob[1]
    type_, data = blob[2 : 2 + n].decode(), blob[2 + n :]
    if blob[0] == 1:
        size = zstandard.frame_content_size(data)
        if size < 0 or size > _MAX_PAYLOAD:
            raise IntegrityError("malformed compressed LangGraph value in the store")
        data = (d or _decompressor()).decompress(data)
    return type_, data


def _text(packed: bytes) -> str:
    """A packed payload as stored in state: base64 text (a JSON string, no tag around it)."""
    return base64.b64encode(packed).decode("ascii")
