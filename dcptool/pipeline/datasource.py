"""Archives as Spark data: the PySpark data source `format("dcptool")`.

    spark.read.format("dcptool").load("/backups/default")                  # every record
    spark.read.format("dcptool").option("backup", ID).load(path)           # one backup's records
    spark.read.format("dcptool").option("resolved", "true").load(path)     # what restore writes
    spark.read.format("dcptool").option("asOf", "2026-11-28T14:03:00Z").load(path)  # as of a time

Use `dcptool.spark.read_archive` (it registers the source on demand). The schema is in
`docs/spark.md`; one row per item record (mutation, deletion, expiration).

The work is split in two plain-Python halves so they can be used (and measured) without
Spark: `plan_scan` reads manifests only and groups the work into partitions (each a group
of vbuckets, balanced by bytes: never one partition per vbucket), and `read_partition`
decodes one partition into pyarrow RecordBatches. Decoding takes whole zstd frames (one
msgpack feed per ~1 MiB), keeps records as tuples and turns a few thousand of them at a
time into Arrow columns, so Spark's per-row Python-to-Arrow conversion never runs.

`resolved=true` resolves each vbucket over the chain of the chosen backup exactly as a
restore does (docs/archive-format.md, "Rollbacks and resolution"): records of a backup
above the lowest rollback seqno of any later backup of the chain are dead and skipped, and
of the rest the newest version of each key wins (tombstones included); documents of a
collection dropped as of that backup are left out.

`asOf=TIME` (ISO 8601 with a zone, or relative: -15m) is `resolved=true` as of a time:
each vbucket of the chain that holds TIME is resolved to its last snapshot boundary at or
before TIME (the rule of `restore --to-time`, archive/pointintime.py); a time in a gap of
the archive is refused unless `nearest=true`.

Collections: `key` is the document key without its collection prefix; `scope` and
`collection` name the collection (through the archive's manifests and system events; an
id none of them names shows as its hex id with a null scope) and `collection_id` is its
id. A batch whose keys are all in the default collection gets these columns without any
per-row Python work.
"""
from __future__ import annotations

import dataclasses
import gc
import os
from bisect import bisect_left
from operator import itemgetter
from pathlib import Path
from typing import Any, Iterable, Iterator

from dcptool.archive import Archive, backup_path, crypto, storage
from dcptool.archive.chain import descendant_cuts
from dcptool.archive.format import entries_records
from dcptool.archive.reader import iter_vbucket_batches, iter_vbucket_records
from dcptool.archive.resolve import Drops, drop_dropped, part_cuts
from dcptool.errors import UsageError
from dcptool.protocol.collections import DEFAULT_COLLECTION, DEFAULT_SCOPE, split_doc_key

from .collnames import CollectionNames

from .plans import ScanPartition

NAME = "dcptool"

#: the columns, in order: (name, Spark SQL type); the `dcptool-stream` source's are these
#: less the archive-only ones (`streamsource.ARCHIVE_ONLY`)
COLUMNS = (
    ("backup_id", "string"),
    ("vbucket", "int"),
    ("type", "string"),
    ("seqno", "bigint"),
    ("rev_seqno", "bigint"),
    ("cas", "bigint"),
    ("flags", "bigint"),
    ("expiry", "bigint"),
    ("datatype", "int"),
    ("key", "string"),
    ("value", "binary"),
    ("xattrs", "binary"),
    ("deleted", "boolean"),
    ("delete_time", "bigint"),
    ("dead", "boolean"),
    ("scope", "string"),
    ("collection", "string"),
    ("collection_id", "bigint"),
)
SCHEMA_DDL = ", ".join(f"{n} {t}" for n, t in COLUMNS)
#: the columns of a cluster archive's read: every bucket's rows, each with its bucket's
#: name last (a bucket archive's read keeps COLUMNS: its schema is pinned in docs/spark.md)
CLUSTER_COLUMNS = COLUMNS + (("bucket", "string"),)
CLUSTER_SCHEMA_DDL = ", ".join(f"{n} {t}" for n, t in CLUSTER_COLUMNS)

#: rows per Arrow batch handed to Spark
BATCH_ROWS = 32768

TYPE_NAMES = ("", "", "", "mutation", "deletion", "expiration")

TRUE_WORDS = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off", ""}


def arrow_schema(columns: Iterable[tuple[str, str]] = COLUMNS):
    """The pyarrow schema of (name, Spark SQL type) columns (this source's by default)."""
    import pyarrow as pa

    types = {"string": pa.string(), "int": pa.int32(), "bigint": pa.int64(),
             "binary": pa.binary(), "boolean": pa.bool_()}
    return pa.schema([(n, types[t]) for n, t in columns])


def _flag(options: dict[str, str], name: str, default: bool = False) -> bool:
    v = options.get(name)
    if v is None:
        return default
    v = str(v).strip().lower()
    if v in TRUE_WORDS:
        return True
    if v in _FALSE:
        return False
    raise UsageError(f"option {name}: expected true or false, not {v!r}")


def default_partitions() -> int:
    return 2 * (os.cpu_count() or 1)


# -- planning (manifests only) ----------------------------------------------------------------


def _balance(units: list[tuple[int, int, Any]], n: int) -> list[list[Any]]:
    """Spread (vbucket, weight, unit) over at most n groups, whole vbuckets per group and at
    least two vbuckets per group (a task costs tens of milliseconds: one per vbucket would
    waste them), heaviest vbuckets first onto the lightest group; each group sorted by
    vbucket."""
    by_vb: dict[int, list] = {}
    weight: dict[int, int] = {}
    for vb, w, u in units:
        by_vb.setdefault(vb, []).append(u)
        weight[vb] = weight.get(vb, 0) + w
    if not by_vb:
        return []
    n = max(1, min(n, len(by_vb) // 2))
    groups: list[list[int]] = [[] for _ in range(n)]
    loads = [0] * n
    for vb in sorted(by_vb, key=lambda v: (-weight[v], v)):
        i = loads.index(min(loads))
        groups[i].append(vb)
        loads[i] += weight[vb] + 1
    return [[u for vb in sorted(g) for u in by_vb[vb]] for g in groups if g]


def plan_scan(path: Archive | str | os.PathLike[str], *, backup: str | None = None,
              vbuckets: Iterable[int] | None = None, resolved: bool = False,
              partitions: int | None = None, values: bool = True,
              validate: bool = False, at: int | None = None, nearest: bool = False,
              at_option: str = "option asOf", nearest_option: str = "option nearest"
              ) -> list[ScanPartition]:
    """The partitions of a read, for `read_partition`.

    Without `resolved`: the records of every committed backup (or only of `backup`).
    With `resolved`: the state as of `backup` (default the newest) over its chain.
    With `at` (ns since the epoch; implies `resolved`): the state as of that time over the
    chain that holds it, refused in a gap of the archive unless `nearest`.
    `path`: the opened archive (or where it is: opened here).
    """
    archive = path if isinstance(path, Archive) else Archive.open(path)
    archive = archive.at(archive.path.absolute())  # the executors' working directory is not ours
    if backup in ("", "latest"):
        backup = None
    wanted = set(vbuckets) if vbuckets is not None else None
    n = partitions or default_partitions()
    units: list[tuple[int, int, Any]] = []
    manifests = archive.manifests()
    if at is not None:
        from dcptool.archive.pointintime import plan_time

        if backup is not None:
            raise UsageError(f"{at_option} and a backup exclude each other")
        from dcptool.archive.pointintime import part_meta

        resolved = True
        chain = plan_time(archive, at, nearest=nearest, option=at_option,
                          nearest_flag=nearest_option).chain
        meta = tuple((b, *part_meta(manifests[b])) for b in chain)
        if not chain:
            return [ScanPartition(archive, (), True, values, validate, at=at)]
        backup = chain[-1]
    if resolved:
        per_vb: dict[int, list] = {}
        for bid in archive.chain_ids(manifests, backup):
            for e in manifests[bid]["vbuckets"]:
                vb = e["vbucket"]
                if wanted is not None and vb not in wanted:
                    continue
                per_vb.setdefault(vb, []).append((bid, e))
        for vb, parts in per_vb.items():
            w = sum(e["bytes"]["files"] for _, e in parts)
            units.append((vb, w, (vb, parts)))
    else:
        if backup is not None:
            if backup not in manifests:
                archive.manifest(backup)  # raises: missing or partial
            scan_ids = [backup]
        else:
            scan_ids = list(manifests)
        cuts = descendant_cuts(manifests)
        for bid in scan_ids:
            for e in manifests[bid]["vbuckets"]:
                vb = e["vbucket"]
                if wanted is not None and vb not in wanted:
                    continue
                units.append((vb, e["bytes"]["files"], (bid, e, cuts[bid].get(vb))))
    return [ScanPartition(archive, tuple(g), resolved, values, validate, at=at,
                          parts_meta=meta if at is not None else ())
            for g in _balance(units, n) or [[]]]


def is_cluster_path(path: Any) -> bool:
    """`path` holds a cluster archive (`backup --all-buckets`)."""
    from dcptool.archive.cluster import archive_kind

    return archive_kind(path) == "cluster"


def plan_cluster_scan(path: Any, *, buckets: Iterable[str] | str | None = None,
                      keys: dict[str, Any] | None = None, backup: str | None = None,
                      partitions: int | None = None, **kw: Any) -> list[ScanPartition]:
    """The partitions of a read of a cluster archive: those of each bucket's archive (the
    buckets `buckets` names, or all), each marked with its bucket. `keys`: {bucket: data
    key} of an encrypted archive's buckets (a bucket without one is unlocked with the
    passphrase of the environment or the prompt). `backup` is one bucket's backup: it
    needs one bucket. The partitions are shared out over the buckets."""
    from dcptool.archive.cluster import ClusterArchive
    from dcptool.archive.clusterread import select_buckets
    from dcptool.archive.errors import ArchiveError

    cluster = path if isinstance(path, ClusterArchive) else \
        ClusterArchive(storage.location(path), {})  # only listed: its key is not needed
    try:
        names = select_buckets(cluster, buckets, option="option bucket")
    except ArchiveError as exc:
        raise UsageError(exc.message) from None
    if backup not in (None, "", "latest") and len(names) != 1:
        raise UsageError("option backup names a backup of one bucket: give option bucket "
                         f"too (one of {', '.join(names)})")
    n = partitions or default_partitions()
    share = max(1, -(-n // max(1, len(names))))
    keys = keys or {}
    out: list[ScanPartition] = []
    for name in names:
        archive = Archive.open(cluster.bucket_path(name), key=keys.get(name))
        if not archive.committed_ids():
            continue  # a bucket whose first backup never committed: no rows
        out += [dataclasses.replace(p, bucket=name)
                for p in plan_scan(archive, backup=backup, partitions=share, **kw)
                if p.units]
    return out


def _with_bucket(batches: Iterator[Any], bucket: str) -> Iterator[Any]:
    """Each RecordBatch with the `bucket` column added (CLUSTER_COLUMNS)."""
    import pyarrow as pa

    schema = arrow_schema(CLUSTER_COLUMNS)
    name = pa.scalar(bucket, pa.string())
    for b in batches:
        yield pa.RecordBatch.from_arrays([*b.columns, pa.repeat(name, b.num_rows)],
                                         schema=schema)


# -- decoding -----------------------------------------------------------------------------------


_GET = [itemgetter(i) for i in range(10)]
#: the end of a key slice: past any key (memcached keys are at most 250 bytes)
_KEY_STOP = 2**31 - 1


def _tomb(r: tuple) -> tuple:
    """A deletion/expiration record in the mutation layout; delete time in the expiry slot."""
    return (r[0], r[1], r[2], r[3], None, r[5], r[6], r[4], r[7], None)


class ArchiveNames:
    """The collection names a partition shows: the archive's manifests (read on first
    need: a default-collection-only read never reads them) and the system events the
    partition's records hold (`add_records`)."""

    def __init__(self, archive: Archive | None):
        self.archive = archive
        self.names = CollectionNames()
        self._loaded = archive is None

    def add_records(self, records: Iterable[tuple]) -> None:
        self.names.add_records(records)

    def display(self, cid: int) -> tuple[str | None, str]:
        if not self._loaded and cid not in self.names.collections:
            self._loaded = True
            for m in self.archive.manifests().values():
                self.names.add_manifest(m.get("collections"))
        return self.names.display(cid)


def _has_events(entry: dict[str, Any]) -> bool:
    return bool(entry.get("counts", {}).get("system_events"))


class _Batches:
    """Collects item records (as mutation-layout tuples) with their backup and vbucket and
    turns them into RecordBatches of about BATCH_ROWS rows."""

    def __init__(self, values: bool = True, names: ArchiveNames | None = None):
        import pyarrow as pa
        import pyarrow.compute as pc

        self.pa = pa
        self.pc = pc
        self.schema = arrow_schema()
        self.values = values
        self.names = names or ArchiveNames(None)
        self._prefix0 = pa.scalar(b"\x00", pa.binary())
        self.rows: list[tuple] = []
        self.backups: list[str] = []
        self.vbs: list[int] = []
        self.dead: list[bool] | None = None  # None: no dead row so far in this batch
        self.types_dict = pa.array(TYPE_NAMES, pa.string())
        self.struct = pa.struct([
            ("t", pa.int8()), ("seqno", pa.int64()), ("rev", pa.int64()), ("cas", pa.int64()),
            ("flags", pa.int64()), ("slot", pa.int64()), ("datatype", pa.int32()),
            ("key", pa.binary()), ("value", pa.binary()), ("xattrs", pa.binary())])

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, batch: list[tuple], backup: str | list[str], vb: int,
            cut: int | None = None, items_only: bool = False) -> None:
        """Add the item records of `batch` (other record types are skipped; with
        `items_only` the batch holds nothing else)."""
        if items_only:
            rows = [r if r[0] == 3 else _tomb(r) for r in batch]
        else:
            rows = [r if r[0] == 3 else _tomb(r) for r in batch if 2 < r[0] < 6]
        n = len(rows)
        if not n:
            return
        self.rows.extend(rows)
        if isinstance(backup, str):
            self.backups.extend([backup] * n)
        else:
            self.backups.extend(backup)
        self.vbs.extend([vb] * n)
        if cut is not None and rows[-1][1] > cut:
            dead = [r[1] > cut for r in rows]
            if self.dead is None:
                self.dead = [False] * (len(self.rows) - n)
            self.dead.extend(dead)
        elif self.dead is not None:
            self.dead.extend([False] * n)

    def _int64(self, col):
        pa = self.pa
        try:
            return pa.array(col, pa.int64())
        except (OverflowError, pa.ArrowInvalid):
            # uint64 above 2^63 (a CAS far in the future): keep the bits, as signed
            return pa.array(col, pa.uint64()).cast(pa.int64(), safe=False)

    def _columns(self, rows: list[tuple]) -> list:
        """The ten fields of the mutation-layout tuples as Arrow arrays: converted in one
        pass as a struct array (in C), or column by column when a value does not fit the
        struct's types (a CAS from 2^63, which is kept bit for bit as a signed value)."""
        pa = self.pa
        try:
            return pa.array(rows, self.struct).flatten()
        except (OverflowError, pa.ArrowInvalid, pa.ArrowTypeError):
            pass
        cols = [list(map(_GET[i], rows)) for i in range(10)]
        return [pa.array(cols[0], pa.int8()), self._int64(cols[1]), self._int64(cols[2]),
                self._int64(cols[3]), pa.array(cols[4], pa.int64()), self._int64(cols[5]),
                pa.array(cols[6], pa.int32()), pa.array(cols[7], pa.binary()),
                pa.array(cols[8], pa.binary()), pa.array(cols[9], pa.binary())]

    def _collections(self, keys, rows: list[tuple], n: int):
        """(key without prefix, scope, collection, collection id) columns of doc keys."""
        pa, pc = self.pa, self.pc
        if n and pc.all(pc.equal(pc.binary_slice(keys, 0, 1), self._prefix0)).as_py():
            # (an explicit stop: without one pyarrow 26 fails on a 1-byte key, an empty key
            # in the default collection: "Negative buffer resize")
            plain = pc.binary_slice(keys, 1, _KEY_STOP)
            scope = pa.repeat(pa.scalar(DEFAULT_SCOPE), n)
            coll = pa.repeat(pa.scalar(DEFAULT_COLLECTION), n)
            cid = pa.repeat(pa.scalar(0, pa.int64()), n)
        else:
            plain_l, cids = [], []
            for k in map(_GET[7], rows):
                c, kk = split_doc_key(k) if k else (0, k)
                cids.append(c)
                plain_l.append(kk)
            shown = {c: self.names.display(c) for c in set(cids)}
            plain = pa.array(plain_l, pa.binary())
            scope = pa.array([shown[c][0] for c in cids], pa.string())
            coll = pa.array([shown[c][1] for c in cids], pa.string())
            cid = pa.array(cids, pa.int64())
        try:
            key = plain.cast(pa.string())
        except pa.ArrowInvalid:
            key = pa.array([k.decode("utf-8", "replace") for k in plain.to_pylist()],
                           pa.string())
        return key, scope, coll, cid

    def flush(self):
        """The collected rows as one RecordBatch (None when empty); starts a new batch."""
        if not self.rows:
            return None
        pa, pc = self.pa, self.pc
        rows = self.rows
        n = len(rows)
        t, seqno, rev, cas, flags, slot, datatype, keys, value, xattrs = self._columns(rows)
        typ = self.types_dict.take(t)
        key, scope, coll, cid = self._collections(keys, rows, n)
        is_mut = pc.equal(t, 3)
        if not pc.all(is_mut).as_py():
            null64 = pa.nulls(n, pa.int64())
            expiry = pc.if_else(is_mut, slot, null64)
            delete_time = pc.if_else(is_mut, null64, slot)
            deleted = pc.invert(is_mut)
        else:
            expiry = slot
            delete_time = pa.nulls(n, pa.int64())
            deleted = pa.repeat(pa.scalar(False), n)
        if not self.values:
            value = pa.nulls(n, pa.binary())
        dead = pa.array(self.dead, pa.bool_()) if self.dead is not None else \
            pa.repeat(pa.scalar(False), n)
        arrays = [
            pa.array(self.backups, pa.string()),
            pa.array(self.vbs, pa.int32()),
            typ, seqno, rev, cas, flags, expiry, datatype, key, value, xattrs, deleted,
            delete_time, dead, scope, coll, cid,
        ]
        self.rows = []
        self.backups = []
        self.vbs = []
        self.dead = None
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)


def resolve_parts(parts: list[tuple[str, Path, dict[str, Any]]], *,
                  validate: bool = False, names: ArchiveNames | CollectionNames | None = None,
                  keep_dropped: bool = False, key: Any = None,
                  upto: int | None = None) -> tuple[list[tuple], list[str]]:
    """Resolve one vbucket over the parts of a chain (oldest first, each (backup id,
    backup dir, manifest entry)): the newest surviving record of each key, and for each
    the id of the backup holding it. Same rule as `dcptool.archive.resolve` (which restore
    uses): records above the lowest rollback seqno of any later part are dead, and the
    documents of a collection a surviving system event dropped are left out (unless
    `keep_dropped`). The system events read are given to `names`. `key`: the archive's
    data key (None for a plain archive). `upto`: only records at or below this seqno."""
    cuts = part_cuts([[r["seqno"] for r in e["rollbacks"]] for _, _, e in parts])
    if upto is not None:
        cuts = [upto if c is None else min(c, upto) for c in cuts]
    state: dict[bytes, tuple] = {}
    tops: list[int] = []
    owners: list[str] = []
    drops = Drops()
    for (bid, bdir, entry), cut in zip(parts, cuts):
        top = -1
        events = _has_events(entry)
        for batch in iter_vbucket_batches(bdir, entry, validate=validate, key=key):
            if events:
                evs = [r for r in batch if r[0] == 8]
                if names is not None:
                    names.add_records(evs)
                for r in evs:
                    if cut is None or r[1] <= cut:
                        drops.add(r)
            if cut is None:
                items = {r[7] if r[0] == 3 else r[4]: r for r in batch if 2 < r[0] < 6}
            else:
                items = {r[7] if r[0] == 3 else r[4]: r for r in batch
                         if 2 < r[0] < 6 and r[1] <= cut}
            if items:
                state.update(items)
                top = max(top, max(r[1] for r in items.values()))
        if top >= 0:
            # surviving seqnos increase along the chain: drop parts this one overtook
            while tops and tops[-1] >= top:
                tops.pop()
                owners.pop()
            tops.append(top)
            owners.append(bid)
    if drops and not keep_dropped:
        state = drop_dropped(state, drops)
    recs = list(state.values())
    if len(owners) == 1:
        return recs, [owners[0]] * len(recs)
    return recs, [owners[bisect_left(tops, r[1])] for r in recs]


def read_partition(part: ScanPartition, on_unit=None) -> Iterator[Any]:
    """pyarrow RecordBatches (schema `arrow_schema()`) of one planned partition;
    `on_unit(i)` is called once the partition's unit i is read (for a progress bar).

    The cyclic garbage collector is paused while it runs: decoding makes millions of small
    tuples and no reference cycles, and collections over them cost a fifth of the time."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        with storage.pack_cache():  # packs on object storage: each read once, whole
            batches = _read_partition(part, on_unit or _nothing)
            if part.bucket is not None:
                batches = _with_bucket(batches, part.bucket)
            yield from batches
    finally:
        if was_enabled:
            gc.enable()


def _nothing(_i: int) -> None:
    pass


def _read_partition(part: ScanPartition, on_unit) -> Iterator[Any]:
    archive = part.archive
    root = archive.path
    names = ArchiveNames(archive)
    out = _Batches(values=part.values, names=names)
    validate = part.validate
    if part.resolved:
        for u, (vb, parts) in enumerate(part.units):
            upto = None
            if part.at is not None:
                parts, upto = _time_cut(root, vb, parts, part.at, archive.key,
                                        part.parts_meta)
            recs, owners = resolve_parts([(bid, backup_path(root, bid), e) for bid, e in parts],
                                         validate=validate, names=names, key=archive.key,
                                         upto=upto)
            for i in range(0, len(recs), BATCH_ROWS):
                out.add(recs[i:i + BATCH_ROWS], owners[i:i + BATCH_ROWS], vb, None,
                        items_only=True)
                if len(out) >= BATCH_ROWS:
                    yield out.flush()
            on_unit(u)
    else:
        for u, (bid, entry, cut) in enumerate(part.units):
            vb = entry["vbucket"]
            events = _has_events(entry)
            for batch in iter_vbucket_batches(backup_path(root, bid), entry, validate=validate,
                                              key=archive.key):
                if events:
                    names.add_records(batch)
                out.add(batch, bid, vb, cut)
                if len(out) >= BATCH_ROWS:
                    yield out.flush()
            on_unit(u)
    last = out.flush()
    if last is not None:
        yield last


def _time_cut(root: Path, vb: int, parts: list, at: int, key: Any,
              parts_meta: tuple[tuple[str, bool, int], ...] = ()) -> tuple[list, int]:
    """(the parts to resolve over, the seqno to resolve to) of vbucket `vb` as of time `at`
    (`parts_meta`: ScanPartition's)."""
    from dcptool.archive.pointintime import vbucket_cut

    meta = {bid: (merged, start) for bid, merged, start in parts_meta}
    cut = vbucket_cut(vb, [iter_vbucket_records(backup_path(root, bid), e, key=key)
                           for bid, e in parts], at,
                      [meta.get(bid, (False, None))[0] for bid, _e in parts],
                      [meta.get(bid, (False, None))[1] for bid, _e in parts])
    return list(parts[:cut.part + 1]), cut.seqno


def read_all(path: str | os.PathLike[str], **kw: Any) -> Iterator[Any]:
    """Every RecordBatch of a read, in this process (no Spark): for tools and tests."""
    for part in plan_scan(path, **kw):
        yield from read_partition(part)


# -- the Spark data source -----------------------------------------------------------------------

try:  # pyspark is a dependency, but keep the planning half importable without it
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
except ImportError:  # pragma: no cover
    DataSource = DataSourceReader = object  # type: ignore[assignment,misc]
    InputPartition = None  # type: ignore[assignment]


def parse_options(options: dict[str, str]) -> dict[str, Any]:
    """The keyword arguments of plan_scan from the data source's string options."""
    from dcptool.client.vbspec import parse_vbuckets

    options = {str(k).lower(): v for k, v in options.items()}  # Spark's keys are case-insensitive
    path = options.get("path")
    if not path:
        raise UsageError("no archive path given: use .load(ARCHIVE)")
    parts = options.get("partitions")
    try:
        n = int(parts) if parts not in (None, "") else None
    except ValueError:
        raise UsageError(f"option partitions: {parts!r} is not a number") from None
    if n is not None and n < 1:
        raise UsageError("option partitions must be at least 1")
    return {
        "path": path,
        "bucket": options.get("bucket") or None,
        "backup": options.get("backup") or None,
        "vbuckets": parse_vbuckets(options.get("vbuckets"), option="option vbuckets"),
        "resolved": _flag(options, "resolved"),
        **_as_of(options),
        "partitions": n,
        "values": _flag(options, "values", True),
        "validate": _flag(options, "validate", False),
    }


def _as_of(options: dict[str, str]) -> dict[str, Any]:
    """{"at", "nearest"} of options asOf and nearest ({} without asOf)."""
    from dcptool.archive.pointintime import parse_time

    text = options.get("asof")
    if text in (None, ""):
        if _flag(options, "nearest"):
            raise UsageError("option nearest goes with option asOf")
        return {}
    return {"at": parse_time(text, option="option asOf"), "nearest": _flag(options, "nearest")}


def split_bucket_option(kw: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """(plan_scan's keyword arguments, option bucket) of parse_options' arguments."""
    kw = dict(kw)
    return kw, kw.pop("bucket", None)


#: the option that carries an encrypted archive's data key to the Python workers
#: (`read_archive` sets it; Spark's default spark.redaction.regex hides options named
#: *secret* in plans and the UI). Without it a worker unlocks the archive with
#: DCPTOOL_ARCHIVE_PASSPHRASE. (crypto.export_key's token; never printed or logged)
SECRET_OPTION = "dcptool.secret"


#: the option that asks the Python workers to count the records they read into progress
#: files (`export` sets it while it draws a bar): JSON {"dir", "interval"} (see
#: pipeline/progress.py)
PROGRESS_OPTION = "dcptool.progress"


def unit_records(part: ScanPartition) -> list[int]:
    """The records each unit of a partition reads (its manifest entries' counts): what
    the progress bar of an export counts."""
    if part.resolved:
        return [entries_records(e for _bid, e in parts) for _vb, parts in part.units]
    return [entries_records((entry,)) for _bid, entry, _cut in part.units]


def _counted(part: ScanPartition, files) -> Iterator[Any]:
    """read_partition(part), counting each unit's records into `files` as they are read."""
    from . import progress

    weights = unit_records(part)
    with progress.counting(files):
        yield from read_partition(part, on_unit=lambda i: progress.add(weights[i]))


class ArchiveReader(DataSourceReader):  # type: ignore[misc]
    def __init__(self, options: dict[str, str]):
        options = dict(options)
        lower = {str(k).lower(): v for k, v in options.items()}
        self._secret = lower.pop(SECRET_OPTION, None)
        self._progress = lower.pop(PROGRESS_OPTION, None)
        self.kw = parse_options({k: v for k, v in options.items()
                                 if str(k).lower() not in (SECRET_OPTION, PROGRESS_OPTION)})

    def __repr__(self) -> str:
        return f"ArchiveReader({self.kw!r})"

    def partitions(self):
        kw, bucket = split_bucket_option(self.kw)
        path = kw.pop("path")
        if is_cluster_path(path):
            parts = plan_cluster_scan(path, buckets=bucket, keys=cluster_keys(self._secret),
                                      **kw)
        else:
            key = crypto.import_key(self._secret) if self._secret else None
            archive = Archive.open(path, key=key)
            check_bucket_option(archive, bucket)
            parts = plan_scan(archive, **kw)
        if not self._secret:
            # no key given with the read: none travels; each worker unlocks the archive
            # with its own DCPTOOL_ARCHIVE_PASSPHRASE (see read)
            parts = [dataclasses.replace(p, archive=p.archive.without_key()) for p in parts]
        # the partitions carry the opened archive (the key given with it) to the workers
        return [InputPartition(part) for part in parts]

    def read(self, partition):
        part = partition.value
        if part.archive.key is None and crypto.is_encrypted(part.archive.meta):
            part = dataclasses.replace(part, archive=Archive.open(part.archive.path))
        if self._progress:
            import json

            from .progress import ProgressFiles

            return _counted(part, ProgressFiles(**json.loads(self._progress)))
        return read_partition(part)


def cluster_keys(secret: str | None) -> dict[str, Any]:
    """{bucket: data key} of SECRET_OPTION for a cluster archive (a JSON object of each
    bucket's exported key; `read_archive` sets it)."""
    import json

    if not secret:
        return {}
    return {name: crypto.import_key(token) for name, token in json.loads(secret).items()}


def check_bucket_option(archive: Archive, bucket: str | None) -> None:
    """Option bucket of a bucket archive's read: its own bucket, or none."""
    from dcptool.archive.clusterread import split_names

    names = split_names(bucket)
    if names and names != [archive.bucket]:
        raise UsageError(f"option bucket {','.join(names)}: archive {archive.path} holds "
                         f"bucket {archive.bucket!r} only")


class ArchiveDataSource(DataSource):  # type: ignore[misc]
    """`spark.read.format("dcptool").load(ARCHIVE)`; see the module docstring."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        path = {str(k).lower(): v for k, v in dict(self.options).items()}.get("path")
        return CLUSTER_SCHEMA_DDL if path and is_cluster_path(path) else SCHEMA_DDL

    def reader(self, schema):
        return ArchiveReader(self.options)
