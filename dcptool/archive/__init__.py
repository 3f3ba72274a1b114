"""The backup archive: layout, manifest, vbucket writer and reader, recovery of partial
backups, chain resolution and verification, and the lifecycle of a backup (plan, write,
progress, commit, recover) and of a merge (archive.merging: plan, stage, publish, remove).
Pure files: no sockets, no Spark.

The format is described in docs/archive-format.md.
"""
from .archive import (
    LATEST,
    Archive,
    BackupPlan,
    BackupProgress,
    BackupWriter,
    PartialBackup,
    VBucketStart,
    backup_path,
)
from .errors import (
    ArchiveError,
    ArchiveLockedError,
    ChainError,
    CorruptFileError,
    NotAnArchiveError,
    PartialBackupExistsError,
    ResolutionError,
    SummaryMismatchError,
)
from .format import (
    REC_DELETION,
    END,
    REC_EXPIRATION,
    FULL,
    HEADER,
    INCREMENTAL,
    ITEM_TYPES,
    KEY_INDEX,
    REC_MUTATION,
    RECORD_NAMES,
    ROLLBACK,
    SNAPSHOT,
    STREAM,
    ArchivePosition,
)
from .frames import iter_file_records, iter_frame_batches
from .reader import Backup, VBucketHistory, iter_vbucket_batches, iter_vbucket_records
from .recovery import VBucketRecovery, recover_backup, recover_vbucket
from .resolve import mark_dead, part_cuts, resolve, resolved_in_seqno_order, snapshot_boundaries
from .writer import VBucketWriter

__all__ = [
    "Archive", "BackupWriter", "BackupPlan", "BackupProgress", "VBucketStart", "PartialBackup",
    "LATEST", "backup_path", "VBucketWriter", "Backup",
    "VBucketHistory", "VBucketRecovery", "ArchivePosition",
    "ArchiveError", "ArchiveLockedError", "ChainError", "CorruptFileError", "NotAnArchiveError",
    "PartialBackupExistsError", "ResolutionError", "SummaryMismatchError",
    "HEADER", "STREAM", "SNAPSHOT", "REC_MUTATION", "REC_DELETION", "REC_EXPIRATION", "ROLLBACK", "END",
    "ITEM_TYPES", "KEY_INDEX", "RECORD_NAMES", "FULL", "INCREMENTAL",
    "iter_file_records", "iter_frame_batches", "iter_vbucket_batches", "iter_vbucket_records",
    "recover_backup", "recover_vbucket", "resolve", "resolved_in_seqno_order", "part_cuts",
    "mark_dead", "snapshot_boundaries",
]
