"""The undo journal: what makes a store write safe against SIGKILL, or a power cut, at any instant.

Why. DuckDB writes a committed batch into the file at the checkpoint, and a checkpoint cut short is harmless for
almost everything it writes: new data goes to free blocks, and the database header that makes it current is written
last, into the one of two header slots not in use. The exception is the metadata blocks (``pragma_metadata_info``):
DuckDB rewrites them in place, whole 256 KiB blocks under one checksum that covers both the sub-blocks the current
header uses and the ones being filled. A SIGKILL during that write (the kernel stops a buffered write between pages)
leaves a block whose checksum fails, and DuckDB then refuses the whole file, though every byte the current header
needs is intact: every measurement in the store is lost to a kill at the wrong millisecond.

What. Before a write, the store saves here the before-image of the file's headers and of the regions a checkpoint
may overwrite in place (its metadata blocks), synced to disk, and after the checkpoint it marks the journal empty
(the file stays, overwritten by the next write: a write costs no file creation). A journal found whole at the next
open means a write was cut short: if the file's headers are still the saved ones, the checkpoint never made its
header current, so putting the saved regions back returns the file to the state that header describes (the batch
itself is in DuckDB's write-ahead log, which the next open replays); if a header changed, the checkpoint finished
and the journal is simply marked empty. A journal that is not whole (its checksum fails) was cut short while being
saved, before the checkpoint began, and is marked empty too. Putting back is idempotent, so a kill during recovery
is recovered alike.

The contract it relies on: only one checkpoint runs between `save` and `discard` (the store sets DuckDB's automatic
checkpoint threshold out of reach, so the checkpoint at DETACH is the only one), and the file's layout is
:data:`HEADER_BYTES` of headers followed by fixed-size blocks (``tests/test_store.py`` tears a metadata block and
checks both).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Sequence
from pathlib import Path

#: DuckDB's file header and its two alternating database headers, 4 KiB each, before the first block.
HEADER_BYTES = 3 * 4096
_MAGIC = b"ios-ray undo journal 2\n"
_LENGTH = struct.Struct(">Q")
_DIGEST_BYTES = hashlib.sha256().digest_size


def block_region(block_id: int, block_size: int) -> tuple[int, int]:
    """The (offset, length) of a block in the file, in DuckDB's layout."""
    return HEADER_BYTES + block_id * block_size, block_size


def pending(journal: Path) -> bool:
    """Whether `journal` holds a saved before-image: a write was cut short, or is under way (callers hold the
    store's lock)."""
    try:
        with journal.open("rb") as file:
            return file.read(len(_MAGIC)) == _MAGIC
    except FileNotFoundError:
        return False


def save(file: Path, journal: Path, regions: Sequence[tuple[int, int]]) -> None:
    """Write the before-image of `file`'s headers and of `regions` to `journal` and sync it (an OSError, or a kill,
    part-way leaves a journal that is not whole, which :func:`recover` drops)."""
    saved = [(0, HEADER_BYTES), *regions]
    with file.open("rb") as source:
        images = []
        for offset, length in saved:
            source.seek(offset)
            images.append(source.read(length))
    index = json.dumps([[offset, len(image)] for (offset, _), image in zip(saved, images)]).encode()
    body = b"".join([_MAGIC, _LENGTH.pack(len(index)), index, *images])
    data = body + hashlib.sha256(body).digest()
    fd = _open(journal)
    try:
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
        os.fdatasync(fd)
    finally:
        os.close(fd)


def recover(file: Path, journal: Path) -> bool:
    """Undo the write that `journal` was saved for, where its checkpoint did not finish, and mark it empty;
    True when regions were put back (False: nothing pending, a journal not whole, or a checkpoint that finished)."""
    try:
        images = _parse(journal.read_bytes())
    except FileNotFoundError:
        return False
    restore = False
    if images:
        (_, headers), *regions = images
        with file.open("r+b") as target:
            restore = target.read(HEADER_BYTES) == headers
            if restore:
                for offset, image in regions:
                    target.seek(offset)
                    target.write(image)
                target.flush()
                os.fsync(target.fileno())
    discard(journal)
    return restore


def discard(journal: Path) -> None:
    """Mark the journal empty once its write's checkpoint finished (unsynced: a journal that comes back after a
    power cut is recognised as finished by its changed headers)."""
    try:
        fd = os.open(journal, os.O_WRONLY)
    except FileNotFoundError:
        return
    try:
        os.pwrite(fd, bytes(len(_MAGIC)), 0)
    finally:
        os.close(fd)


def _open(journal: Path) -> int:
    """The journal's descriptor, for writing; a journal created here has its folder entry synced."""
    try:
        fd = os.open(journal, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:
        return os.open(journal, os.O_WRONLY)
    folder = os.open(journal.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)
    return fd


def _parse(data: bytes) -> list[tuple[int, bytes]]:
    """The saved (offset, image) pairs of a whole journal, the headers first; none for one empty or not whole."""
    body, digest = data[:-_DIGEST_BYTES], data[-_DIGEST_BYTES:]
    if not body.startswith(_MAGIC) or hashlib.sha256(body).digest() != digest:
        return []
    (length,) = _LENGTH.unpack_from(body, len(_MAGIC))
    position = len(_MAGIC) + _LENGTH.size
    index = json.loads(body[position : position + length])
    position += length
    images = []
    for offset, size in index:
        images.append((offset, body[position : position + size]))
        position += size
    return images
