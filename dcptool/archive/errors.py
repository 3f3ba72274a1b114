"""Typed archive errors. Each names the file (or archive) it is about."""
from __future__ import annotations

from pathlib import Path

from dcptool.errors import DcptoolError


class ArchiveError(DcptoolError):
    """Something about an archive prevents the operation."""


class NotAnArchiveError(ArchiveError):
    """The path does not exist or does not hold a dcptool archive."""

    exit_code = 2


class ArchiveExistsError(ArchiveError):
    """An archive is already there (created by another run, perhaps a moment ago)."""


class ArchiveLockedError(ArchiveError):
    """Another writer holds the archive lock."""


class PartialBackupExistsError(ArchiveError):
    """A killed backup left a partial backup that must be resumed or purged first."""


class ChainError(ArchiveError):
    """The parent links of the committed backups do not form a valid chain."""


class CorruptFileError(ArchiveError):
    """A file's bytes are not what the format or the manifest says they should be."""

    def __init__(self, path: str | Path, reason: str, *, offset: int | None = None,
                 hint: str | None = None):
        where = f"{path}" if offset is None else f"{path} at byte {offset}"
        super().__init__(f"{where}: {reason}", hint=hint or "run 'dcptool verify' on the archive")
        self.path = str(path)
        self.reason = reason
        self.offset = offset


class SummaryMismatchError(ArchiveError):
    """A vbucket summary handed to commit does not match the files on disk."""


class ResolutionError(ArchiveError):
    """The records handed to chain resolution break an invariant of the format."""
