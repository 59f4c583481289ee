"""The capture dump writer and reader, importable from ``sessions.capture``.

The code lives in the plugin package (``plugin/eagle3_capture/writer.py``) because that folder is copied,
self-contained, onto SGLang's PYTHONPATH; this module re-exports the very same functions so that the
emulator's model backend and the extraction collector use the identical writer and reader.
"""
from __future__ import annotations

from sessions.capture.plugin.eagle3_capture.writer import (
    CHUNK_SUFFIX,
    ERROR_FILE,
    FORMAT,
    BackgroundWriter,
    CaptureDirError,
    ChunkError,
    ChunkInfo,
    check_capture_dir,
    chunk_name,
    chunks_complete,
    covered_tokens,
    list_chunks,
    read_chunk_metadata,
    read_chunks,
    read_error_marker,
    remove_chunks,
    validate_rid,
    write_chunks,
    write_error_marker,
)

__all__ = [
    "CHUNK_SUFFIX", "ERROR_FILE", "FORMAT", "BackgroundWriter", "CaptureDirError", "ChunkError", "ChunkInfo",
    "check_capture_dir", "chunk_name", "chunks_complete", "covered_tokens", "list_chunks",
    "read_chunk_metadata", "read_chunks", "read_error_marker", "remove_chunks", "validate_rid",
    "write_chunks", "write_error_marker",
]
