"""Names, numbers and small helpers of the archive format (see docs/archive-format.md).

Everything a reader of the format needs to agree on lives here: record type numbers and
arities, file and directory names, the JSON shape of positions, and the atomic-write and
fsync discipline used for every metadata file.
"""
from __future__ import annotations

import json
import os
import re
from datetime import datetime, timedelta, timezone
from typing import Any, Iterable, NamedTuple


from dcptool.errors import UsageError

from . import crypto, storage

#: archive.json "format" value and the format version this code writes and reads.
FORMAT_NAME = "dcptool-archive"
#: archive.json's format name for an archive of a whole cluster (archive/cluster.py)
CLUSTER_FORMAT_NAME = "dcptool-cluster-archive"
FORMAT_VERSION = 3
#: every format version this code reads (1 and 2: keys without a collection prefix, all in
#: the default collection; a reader gives them the 0x00 prefix)
READ_VERSIONS = (1, 2, 3)
#: the first format whose item keys carry their collection id (LEB128 prefix)
COLLECTIONS_VERSION = 3
MANIFEST_FORMAT = "dcptool-manifest"

ARCHIVE_JSON = "archive.json"
BACKUPS_DIR = "backups"
LOCK_FILE = "lock"
MANIFEST_JSON = "manifest.json"
#: a continuous backup's status (`backup --continuous`, read by info and point-in-time reads)
CONTINUOUS_JSON = "continuous.json"
BACKUP_JSON = "backup.json"  # written when a backup begins: its intent (id, parent, type, level)

FULL = "full"
INCREMENTAL = "incremental"
BACKUP_TYPES = (FULL, INCREMENTAL)

DEFAULT_LEVEL = 3
#: uncompressed bytes per zstd frame (a frame is compressed once the buffer passes this)
DEFAULT_BLOCK_SIZE = 1 << 20
#: uncompressed bytes all open vbucket writers of one process buffer together: past it, a
#: writer that appended writes its block out once it holds MIN_BLOCK_SIZE
DEFAULT_BLOCK_BUDGET = 32 << 20
MIN_BLOCK_SIZE = 64 << 10
DEFAULT_SEGMENT_BYTES = 256 << 20  # a data file is closed and the next segment opened past this
#: a frame whose header claims more than this many uncompressed bytes is rejected as corrupt
#: (a frame holds ~block size plus at most one record; memcached values are <= 20 MiB)
MAX_FRAME_CONTENT = 64 << 20

FILE_MODE = 0o600
DIR_MODE = 0o700

# ---------------------------------------------------------------------------------------------
# Records: msgpack arrays whose first element is the record type.

HEADER = 0        # (0, "dcptool-archive", version, vbucket, backup_id, segment)
STREAM = 1        # (1, uuid, seqno, snap_start, snap_end, failover_log)
SNAPSHOT = 2      # (2, start, end, flags)
REC_MUTATION = 3      # (3, seqno, rev_seqno, cas, flags, expiry, datatype, key, value, xattrs|nil)
REC_DELETION = 4      # (4, seqno, rev_seqno, cas, key, delete_time, datatype, value)
REC_EXPIRATION = 5    # (5, seqno, rev_seqno, cas, key, delete_time, datatype, value)
ROLLBACK = 6      # (6, seqno, vbucket_uuid)
END = 7           # (7, uuid, seqno, snap_start, snap_end)
#: format 3: a DCP system event (scope or collection created or dropped) in seqno order;
#: collection_id is nil for scope events, name "" for drops, max_ttl 0 when none
REC_SYSTEM_EVENT = 8  # (8, seqno, event, manifest_uid, scope_id, collection_id, name, max_ttl)

RECORD_NAMES = {
    HEADER: "header", STREAM: "stream", SNAPSHOT: "snapshot", REC_MUTATION: "mutation",
    REC_DELETION: "deletion", REC_EXPIRATION: "expiration", ROLLBACK: "rollback", END: "end",
    REC_SYSTEM_EVENT: "system-event",
}
RECORD_ARITY = {
    HEADER: 6, STREAM: 6, SNAPSHOT: 4, REC_MUTATION: 10, REC_DELETION: 8, REC_EXPIRATION: 8,
    ROLLBACK: 3, END: 5, REC_SYSTEM_EVENT: 8,
}
ITEM_TYPES = (REC_MUTATION, REC_DELETION, REC_EXPIRATION)

#: index of the key inside each item record type
KEY_INDEX = {REC_MUTATION: 7, REC_DELETION: 4, REC_EXPIRATION: 4}

# ---------------------------------------------------------------------------------------------
# File names inside a backup directory.

DATA_RE = re.compile(r"^vb-(\d{4,5})-(\d{3,})\.mpk\.zst$")
DONE_RE = re.compile(r"^vb-(\d{4,5})\.done\.json$")
BACKUP_ID_RE = re.compile(r"^\d{8}T\d{6}\.\d{6}Z$")
#: a pack: small data files of several vbuckets stored one after another (see packing.py)
PACK_RE = re.compile(r"^pack-([0-9a-f]{16})\.mpk\.zst$")
#: a done batch: the summaries of the vbuckets a backup task finished with one pack
BATCH_RE = re.compile(r"^done-(\d{8}T\d{6}\.\d{6}Z)-([0-9a-f]{16})\.json$")


def data_file_name(vbucket: int, segment: int) -> str:
    return f"vb-{vbucket:04d}-{segment:03d}.mpk.zst"


def done_file_name(vbucket: int) -> str:
    return f"vb-{vbucket:04d}.done.json"


def pack_name(token: str) -> str:
    return f"pack-{token}.mpk.zst"


def batch_name(stamp: str, token: str) -> str:
    return f"done-{stamp}-{token}.json"


def entry_location(backup_dir: Any, entry: dict[str, Any]) -> Any:
    """Where the data file a summary's file entry names lies: the file of that name in the
    backup directory, or its byte range of a pack (entries with "pack" and "offset")."""
    where = storage.location(backup_dir)
    pack = entry.get("pack")
    if pack is None:
        return where / entry["name"]
    return storage.Member(where / pack, entry["offset"], entry["size"], entry["name"])


def entries_records(entries: Iterable[dict[str, Any]]) -> int:
    """The records a set of vbucket summaries (manifest entries) hold, by their counts:
    what the progress bars of the commands that read them count."""
    return sum(int(e["counts"]["records"]) for e in entries)


def listed_size(entry: dict[str, Any], sizes: dict[str, int]) -> int | None:
    """The size a directory listing ({name: size}) shows for the data file `entry` names
    (a pack member: what of its range the pack holds); None when it is not listed."""
    where = entry.get("pack") or entry["name"]
    if where not in sizes:
        return None
    if "pack" not in entry:
        return sizes[where]
    return storage.range_held(entry["offset"], entry["size"], sizes[where])


def vbucket_ranges(vbuckets: Iterable[int]) -> list[list[int]]:
    """[0, 1, 2, 5] -> [[0, 2], [5, 5]]: a manifest's `unchanged` list."""
    out: list[list[int]] = []
    for vb in sorted(set(vbuckets)):
        if out and out[-1][1] == vb - 1:
            out[-1][1] = vb
        else:
            out.append([vb, vb])
    return out


def expand_ranges(ranges: Iterable[Any]) -> list[int]:
    """The inverse of vbucket_ranges."""
    return [vb for lo, hi in ranges for vb in range(int(lo), int(hi) + 1)]


def parse_data_name(name: str) -> tuple[int, int] | None:
    """(vbucket, segment) for a data file name, None for anything else."""
    m = DATA_RE.match(name)
    if not m:
        return None
    return int(m.group(1)), int(m.group(2))


# ---------------------------------------------------------------------------------------------
# Positions and failover logs.


class ArchivePosition(NamedTuple):
    """Where a vbucket stream stands, as the archive records it: the vbucket version plus the
    snapshot around it (the client's `dcptool.client.position.Position` converts to and from
    it with `from_archive`/`to_archive`).

    This is exactly what a DCP stream request needs to resume: (vbucket uuid, start seqno,
    snapshot start, snapshot end). On a snapshot boundary snap_start == snap_end == seqno.
    """

    uuid: int
    seqno: int
    snap_start: int
    snap_end: int

    @classmethod
    def at(cls, uuid: int, seqno: int) -> "ArchivePosition":
        """A position on a snapshot boundary."""
        return cls(uuid, seqno, seqno, seqno)

    @classmethod
    def coerce(cls, value: Any) -> "ArchivePosition":
        """Accept a ArchivePosition, a 4-sequence, the JSON dict form, or any object with uuid,
        seqno, snap_start and snap_end attributes (such as the client's stream position)."""
        if isinstance(value, ArchivePosition):
            return value
        if hasattr(value, "snap_end") and hasattr(value, "uuid"):
            return cls(int(value.uuid), int(value.seqno), int(value.snap_start),
                       int(value.snap_end))
        if isinstance(value, dict):
            try:
                return cls(int(value["uuid"]), int(value["seqno"]), int(value["snap_start"]),
                           int(value["snap_end"]))
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"not a position: {value!r}") from exc
        try:
            uuid, seqno, ss, se = value
            return cls(int(uuid), int(seqno), int(ss), int(se))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"not a position: {value!r}") from exc

    def to_json(self) -> dict[str, int]:
        return {"uuid": self.uuid, "seqno": self.seqno, "snap_start": self.snap_start,
                "snap_end": self.snap_end}


def coerce_failover_log(log: Iterable[Any] | None) -> list[list[int]]:
    """Failover log as [[uuid, seqno], ...], newest entry first."""
    out: list[list[int]] = []
    for entry in log or ():
        if isinstance(entry, dict):
            uuid, seqno = entry["uuid"], entry["seqno"]
        else:
            uuid, seqno = entry
        out.append([int(uuid), int(seqno)])
    return out


def uuid_for_seqno(failover_log: list[list[int]], seqno: int, default: int) -> int:
    """The vbucket uuid of the history branch that holds `seqno`: the newest failover log
    entry starting at or below it (the log is newest first)."""
    for uuid, start in failover_log:
        if start <= seqno:
            return uuid
    return default


# ---------------------------------------------------------------------------------------------
# Time and backup ids.


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


def iso_time(dt: datetime) -> str:
    return dt.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def backup_id_for(dt: datetime) -> str:
    return dt.astimezone(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")


def parse_backup_id(backup_id: str) -> datetime:
    return datetime.strptime(backup_id, "%Y%m%dT%H%M%S.%fZ").replace(tzinfo=timezone.utc)


# ---------------------------------------------------------------------------------------------
# Durable file operations.


def fsync_dir(path: Any) -> None:
    storage.sync_dir(storage.location(path))


def make_dir(path: Any) -> None:
    """Create a directory 0700 (and fsync its parent so the entry survives a crash)."""
    storage.make_dir(storage.location(path), DIR_MODE)


def atomic_write_bytes(path: Any, data: bytes, *, durable: bool = True) -> None:
    """Write a file so that it is either absent or complete: write a temporary file in the
    same directory, fsync it, rename it over the target, fsync the directory (one PUT on
    object storage).

    `durable=False` leaves out both fsyncs: the caller makes the file durable later (with
    `sync_filesystem`), and until then a crash may lose it or leave it empty."""
    storage.atomic_write_bytes(storage.location(path), data, durable=durable, mode=FILE_MODE)


def json_lines(obj: Any) -> str:
    """`obj` as JSON that reads well and writes fast: an object has one member per line, and
    a list member of objects one element per line; everything below that is compact (the C
    encoder: `indent` would switch json to its pure-Python encoder, several times slower on
    a manifest of 1024 vbuckets)."""
    if not isinstance(obj, dict) or not obj:
        return json.dumps(obj)
    dumps = json.dumps
    lines = []
    for k, v in obj.items():
        if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            body = "[\n    " + ",\n    ".join(dumps(x) for x in v) + "\n  ]"
        else:
            body = dumps(v)
        lines.append(f"  {dumps(str(k))}: {body}")
    return "{\n" + ",\n".join(lines) + "\n}"


def sealed_name(path: Any) -> str | None:
    """The name a file of a backup is sealed under in an encrypted archive ("ID/NAME" of
    ARCHIVE/backups/ID/NAME, or of the merge staging directory's backups/), None for a
    file outside backups/ (archive.json, keys/, logs/: never sealed)."""
    p = storage.location(path)
    bdir = p.parent
    if bdir.parent.name != BACKUPS_DIR or not BACKUP_ID_RE.match(bdir.name):
        return None
    return f"{bdir.name}/{p.name}"


def atomic_write_json(path: str | os.PathLike[str], obj: Any, *, key: Any = None,
                      durable: bool = True) -> None:
    """Write a metadata file (sealed under `key`, the data key of an encrypted archive:
    see crypto.seal_file)."""
    where = storage.location(path)
    atomic_write_bytes(where, crypto.seal_file(key, sealed_name(where),
                                               (json_lines(obj) + "\n").encode("utf-8")),
                       durable=durable)


def sync_filesystem(path: Any) -> None:
    """Make everything written to the filesystem holding `path` durable: one syncfs(2)
    on Linux (os.sync() elsewhere), instead of an fsync per file and directory; on object
    storage, wait for this process's background uploads."""
    storage.sync_filesystem(storage.location(path))


def read_bytes(path: Any, key: Any = None) -> bytes:
    """A metadata file's content (opened under `key`, the data key of an encrypted archive;
    None for a plain one)."""
    where = storage.location(path)
    return crypto.open_file(key, sealed_name(where), storage.read_bytes(where))


def read_json(path: Any, key: Any = None) -> Any:
    """Parse a JSON file (opened under `key` in an encrypted archive); raises OSError or
    ValueError (bad JSON or bad UTF-8, or crypto.TamperedError)."""
    return json.loads(read_bytes(path, key).decode("utf-8"))


#: a duration's parts: a number and a unit
_DURATION = re.compile(r"(\d+)([smhdw])")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str, *, option: str | None = None) -> timedelta:
    """'30d', '12h', '2w', '1d12h', '90m', '45s' -> a timedelta (`option`: named in the
    error)."""
    t = text.strip().lower()
    pos = 0
    seconds = 0
    for m in _DURATION.finditer(t):
        if m.start() != pos:
            break
        seconds += int(m.group(1)) * _UNIT[m.group(2)]
        pos = m.end()
    if not t or pos != len(t):
        raise UsageError(f"{option + ': ' if option else ''}duration {text!r} is not understood",
                         hint="use a number and a unit: s, m, h, d or w (e.g. 30d, 12h, 1d12h)")
    return timedelta(seconds=seconds)
