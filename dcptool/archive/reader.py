"""Reading committed backups: the records of a vbucket, file by file, checked as they go."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

from . import storage
from .errors import CorruptFileError
from .format import BACKUPS_DIR, FORMAT_NAME, HEADER, ITEM_TYPES, entry_location
from .frames import iter_frame_batches


def iter_vbucket_batches(backup_dir: str | os.PathLike[str], entry: dict[str, Any], *,
                         check_sha256: bool = False, validate: bool = True,
                         key: Any = None) -> Iterator[list[tuple]]:
    """Record batches (one per zstd frame) of one vbucket of one backup, in order.

    `entry` is the vbucket's manifest entry (or done summary). Each file's size is checked
    against it before reading and its header record against the vbucket, backup and segment
    it should hold (so misplaced or swapped files are refused); with `check_sha256` the
    SHA-256 is compared once each file is read. `validate` (default) checks that every
    record has its type's field layout, so consumers can index fields without guarding.
    `key`: the archive's data key (None for a plain archive).
    """
    backup_dir = storage.location(backup_dir)
    vb = entry["vbucket"]
    backup_id = entry["backup"]
    for segment, f in enumerate(entry["files"]):
        path = entry_location(backup_dir, f)
        first = True
        for batch in iter_frame_batches(path, expect_size=f["size"],
                                        expect_sha256=f["sha256"] if check_sha256 else None,
                                        validate=validate, key=key):
            if first:
                first = False
                head = batch[0] if batch else None
                if not head or head[0] != HEADER or len(head) != 6 or head[1] != FORMAT_NAME:
                    raise CorruptFileError(path, "does not start with a dcptool header record")
                if head[3] != vb or head[4] != backup_id or head[5] != segment:
                    raise CorruptFileError(
                        path, f"holds segment {head[5]} of vbucket {head[3]} of backup {head[4]}, "
                              f"not segment {segment} of vbucket {vb} of backup {backup_id} "
                              "(file swapped or misplaced)")
            yield batch
        if first:
            raise CorruptFileError(path, "holds no records")


def iter_vbucket_records(backup_dir: str | os.PathLike[str], entry: dict[str, Any], *,
                         check_sha256: bool = False, validate: bool = True,
                         key: Any = None) -> Iterator[tuple]:
    """Every record of one vbucket of one backup, header, stream and end records included."""
    for batch in iter_vbucket_batches(backup_dir, entry, check_sha256=check_sha256,
                                      validate=validate, key=key):
        yield from batch


class Backup:
    """A committed backup: its manifest and a way to read each vbucket's records."""

    def __init__(self, archive: Any, manifest: dict[str, Any]):
        self.archive_path = archive.path
        #: the archive's data key (None: a plain archive)
        self.key = archive.key
        self.manifest = manifest
        self.id: str = manifest["id"]
        self.parent: str | None = manifest.get("parent")
        self.type: str = manifest["type"]
        self.dir = self.archive_path / BACKUPS_DIR / self.id
        self._entries = {e["vbucket"]: e for e in manifest["vbuckets"]}

    def __repr__(self) -> str:
        return f"Backup({self.id!r}, type={self.type!r}, parent={self.parent!r})"

    @property
    def vbuckets(self) -> list[int]:
        return sorted(self._entries)

    def entry(self, vbucket: int) -> dict[str, Any] | None:
        """The vbucket's manifest entry, None when this backup does not hold the vbucket."""
        return self._entries.get(vbucket)

    def files(self, vbucket: int | None = None) -> list[tuple[int, Path]]:
        """(vbucket, path) of every data file (of one vbucket), in reading order."""
        vbs = self.vbuckets if vbucket is None else [vbucket]
        return [(vb, entry_location(self.dir, f)) for vb in vbs if vb in self._entries
                for f in self._entries[vb]["files"]]

    def records(self, vbucket: int, *, check_sha256: bool = False,
                validate: bool = True) -> Iterator[tuple]:
        """All records of the vbucket in this backup ([] when it holds none)."""
        entry = self._entries.get(vbucket)
        if entry is None:
            return iter(())
        return iter_vbucket_records(self.dir, entry, check_sha256=check_sha256,
                                    validate=validate, key=self.key)

    def batches(self, vbucket: int, *, check_sha256: bool = False,
                validate: bool = True) -> Iterator[list[tuple]]:
        """The vbucket's records one zstd frame (~1 MiB) at a time."""
        entry = self._entries.get(vbucket)
        if entry is None:
            return iter(())
        return iter_vbucket_batches(self.dir, entry, check_sha256=check_sha256,
                                    validate=validate, key=self.key)

    def items(self, vbucket: int) -> Iterator[tuple]:
        """Only the mutation, deletion and expiration records."""
        for rec in self.records(vbucket):
            if rec[0] in ITEM_TYPES:
                yield rec


class VBucketHistory:
    """One backup's records of one vbucket, re-readable: an iterable part for resolution."""

    def __init__(self, backup: Backup, vbucket: int, *, check_sha256: bool = False,
                 validate: bool = True):
        self.backup = backup
        self.vbucket = vbucket
        self.check_sha256 = check_sha256
        #: False: the records were checked already (verify's check of the chain, which
        #: checks every record's layout as `validate` does, and more)
        self.validate = validate

    def __iter__(self) -> Iterator[tuple]:
        return self.backup.records(self.vbucket, check_sha256=self.check_sha256,
                                   validate=self.validate)

    def batches(self) -> Iterator[list[tuple]]:
        """The same records a zstd frame at a time."""
        return self.backup.batches(self.vbucket, check_sha256=self.check_sha256,
                                   validate=self.validate)
