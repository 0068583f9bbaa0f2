"""Content-addressed blob storage: codecs, chunking and where each blob lives."""

from .local import LocalBlobStore
from .objects import CHUNK_SIZE, BlobCodec, Blobs

__all__ = ["CHUNK_SIZE", "BlobCodec", "Blobs", "LocalBlobStore"]
