"""The values a job's driver ships to its Spark tasks and the tasks bring back.

Frozen dataclasses (picklable for Spark) instead of dicts, so each field has one name from
the planner to the task and back.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dcptool.archive import Archive
from dcptool.client.position import Position


@dataclass(frozen=True, slots=True)
class VBucketPlan:
    """One vbucket of a backup: stream it from `start` to the node's seqno `end`.

    `failover_log` is the node's (recorded in the stream record); with `resume` the files a
    killed attempt left are continued and the writer knows the exact start."""

    vbucket: int
    start: Position
    end: int
    failover_log: tuple[tuple[int, int], ...] = ()
    resume: bool = False


@dataclass(frozen=True, slots=True)
class BackupTask:
    """One Spark task of a backup: a group of vbuckets and where their files go (the
    opened archive, its data key with it)."""

    opts: Any  # picklable connection options
    archive: Archive
    backup_id: str
    parent: str | None
    plans: tuple[VBucketPlan, ...]
    session: str
    #: the node is a member of a cluster: each vbucket streams from its active node
    cluster: bool = False
    #: the stream filter of --include-data/--exclude-data (None: every collection)
    stream_filter: Any = None
    #: the selection applied by the task instead (backupdata.ClientFilter), when selected
    #: collections were dropped since the previous backup
    client_filter: Any = None


@dataclass(frozen=True, slots=True)
class VBucketSummary:
    """What a task brings back for one vbucket: the entry the manifest records (the writer's
    summary) and, apart from it, the run's statistics for the log (None for a vbucket kept
    from a killed attempt): opens, retries, resumed, seconds, and once per task `snappy`."""

    entry: dict[str, Any]
    run: dict[str, Any] | None = None

    @property
    def vbucket(self) -> int:
        return self.entry["vbucket"]




@dataclass(frozen=True, slots=True)
class RestoreTask:
    """One Spark task of a restore: write the state of `vbuckets` as of `backup`."""

    opts: Any  # picklable connection options (None for a dry run)
    archive: Archive
    backup: str
    vbuckets: tuple[int, ...]
    #: the node's vbucket count (records are routed by it)
    node_vbuckets: int
    key_filter: str | None = None
    force: bool = False
    dry_run: bool = False
    #: on a cluster: {vbucket: address of its active node}
    routes: dict[int, str] | None = None
    #: the archive's vbucket count (0: the node's); when it differs from the node's, a
    #: cluster's writes are regrouped by the target vbucket of each key
    archive_vbuckets: int = 0
    #: restore to this time (ns since the epoch): each vbucket to its last snapshot
    #: boundary at or before it (archive/pointintime.py); None: as of `backup`
    at: int | None = None


@dataclass(frozen=True, slots=True)
class RestoreTaskResult:
    """What a restore task brings back: its write counts (`WriteCounts.as_dict()`) and its
    run statistics for the log (vbuckets {vb: counts by kind}, seconds, pid)."""

    counts: dict[str, Any]
    run: dict[str, Any]



@dataclass(frozen=True, slots=True)
class VBucketComparePlan:
    """One vbucket of `verify --against`: the archive's parts of it along the chain (backup
    id, manifest entry), where the archive ended, the node's high seqno, how far to stream
    the node (the lower of the two) and what the driver noticed already."""

    vbucket: int
    parts: tuple[tuple[str, dict[str, Any]], ...]
    end_seqno: int
    node_high: int
    stream_end: int
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class CompareTask:
    """One Spark task of `verify --against`."""

    opts: Any  # picklable connection options
    archive: Archive
    name: str  # the DCP connection's name
    plans: tuple[VBucketComparePlan, ...]
    max_keys: int = 5
    #: a node of another vbucket count than the archive: the node's vbuckets to stream
    #: whole ((vbucket, high seqno), ...) and the archive's count, by which each node key
    #: is given to the plan of its archive vbucket (empty: the plans' own vbuckets)
    node_streams: tuple[tuple[int, int], ...] = ()
    archive_vbuckets: int = 0



@dataclass(frozen=True, slots=True)
class ScanPartition:
    """One partition of a read of an archive (`spark.read.format("dcptool")`).

    Without `resolved` each unit is (backup id, manifest entry, rollback cut or None): the
    records of one vbucket of one backup. With `resolved` each unit is (vbucket, [(backup
    id, manifest entry), ...] along the chain): that vbucket's resolved state."""

    archive: Archive
    units: tuple[Any, ...]
    resolved: bool = False
    values: bool = True
    validate: bool = False
    #: the bucket of a cluster archive this partition reads (its rows get a `bucket`
    #: column); None for a bucket archive read alone
    bucket: str | None = None
    #: with `resolved`: the state as of this time (ns since the epoch), each vbucket cut
    #: at its last snapshot boundary at or before it (archive/pointintime.py)
    at: int | None = None
    #: with `at`: (backup id, merged?, start time in ns) of each backup of the chain read
    #: (archive/pointintime.py's part_meta: a merged backup gives only its start and end
    #: as boundaries; a rollback counts from its backup's start)
    parts_meta: tuple[tuple[str, bool, int], ...] = ()



@dataclass(frozen=True, slots=True)
class StreamPartition:
    """One partition of a micro-batch of `spark.readStream.format("dcptool-stream")`:
    {vbucket: (start offset entry, end offset entry)} (the offsets' JSON form)."""

    opts: Any  # picklable connection options
    name: str  # the DCP connection's name
    vbuckets: dict[int, tuple[dict[str, Any], dict[str, Any]]]
    values: bool = True


__all__ = ["VBucketPlan", "BackupTask", "VBucketSummary", "RestoreTask", "RestoreTaskResult",
           "VBucketComparePlan", "CompareTask", "ScanPartition",
           "StreamPartition"]
