"""The restore job: write an archive's resolved state (as of a backup) back into a node.

Per vbucket the chain is resolved to the newest surviving version of each key (dead
history branches cut by rollback records are skipped) and written with SET_WITH_META /
DEL_WITH_META, so cas, rev seqno, flags and expiry are kept. The node's conflict
resolution decides: where it holds newer data the write is counted as skipped, unless
`force` is set. One Spark task per group of vbuckets, each with its own connection.

Collections: the archive's keys are doc keys (collection id prefix). Restore connects with
HELLO Collections and writes each document into the TARGET's collection of the same names
(or the names `--map-data` gives): source id -> (scope, collection) through the archive's
manifests and system events (pipeline/collnames.py) -> target id through the target's
manifest (GET_COLLECTIONS_MANIFEST). Missing scopes and collections are created over the
target's REST port first; when that is not possible the restore stops before writing,
naming what is missing. A target without collections takes the default collection only.
When every id maps to itself and nothing is left out, keys are written as read: no
per-item work (`CollectionPlan.per_item`).
"""
from __future__ import annotations

import contextlib
import functools
import gc
import operator
import os
import re
import time
import dataclasses
from dataclasses import dataclass, field
import itertools
from typing import Any

from dcptool.archive import (REC_DELETION, REC_EXPIRATION, REC_MUTATION, Archive, VBucketHistory,
                             storage)
from dcptool.archive.format import entries_records
from dcptool.archive.info import dir_size
from dcptool.archive.pointintime import (VBucketCut, iso, lag_summary, part_meta, plan_time,
                                        vbucket_cut)
from dcptool.archive.resolve import resolve
from dcptool.archive.verify import verify_chain_shared, verify_chain_vbuckets
from dcptool.client.options import ConnOptions
from dcptool.errors import DcptoolError, UsageError
from dcptool.protocol.collections import (
    DEFAULT_COLLECTION,
    DEFAULT_SCOPE,
    Manifest,
    decode_leb128,
    encode_leb128,
    hex_id,
    split_doc_key,
)
from dcptool.protocol.constants import Feature
from dcptool.protocol.errors import ProtocolError
from dcptool.protocol.snappy import SNAPPY, plain

from dcptool.runlog import RunLog

from . import metawriter as mw
from . import progress
from .nodeinfo import active_nodes, vbucket_count
from .collnames import CollectionNames, chain_collections
from .datafilter import DataSelection, selection, show
from .plans import RestoreTask, RestoreTaskResult
from .runtime import (barrier_slots, check_executors_see, context_of, default_parallelism,
                      get_context, plan_groups, run_barrier_tasks, run_tasks)
from .tasks import reporting_failures, task_failure

_FIRST = operator.itemgetter(0)
_KIND = {REC_MUTATION: mw.WRITE_MUTATION, REC_DELETION: mw.WRITE_DELETION,
         REC_EXPIRATION: mw.WRITE_EXPIRATION}


@dataclass(frozen=True)
class CollectionsConnOptions(ConnOptions):
    """Connection options whose connections negotiate HELLO Collections (keys are doc keys
    when the node accepts it)."""

    @property
    def features(self) -> tuple[int, ...]:
        base = ConnOptions.features.fget(self)  # type: ignore[attr-defined]
        return base if Feature.COLLECTIONS in base else base + (int(Feature.COLLECTIONS),)


def with_collections(opts):
    """`opts` (ConnOptions) whose connections negotiate Collections."""
    if opts is None or isinstance(opts, CollectionsConnOptions):
        return opts
    import dataclasses

    return CollectionsConnOptions(**{f.name: getattr(opts, f.name)
                                     for f in dataclasses.fields(opts)})


@dataclass(frozen=True)
class CollectionPlan:
    """How a task turns the archive's doc keys into the keys it sends (picklable).

    `remap` {source collection id: target id} (None: every id as it is); ids in `skip` are
    not restored (left out by --include-data/--exclude-data); an id in neither is unknown
    to the archive's manifests and fails the restore. `strip`: the target has no
    collections, keys go without prefix (everything maps to the default collection).
    `scope_of` {collection id: scope id} lets resolution end collections a scope drop
    ended."""

    remap: dict[int, int] | None = None
    skip: frozenset[int] = frozenset()
    strip: bool = False
    scope_of: dict[int, int] | None = None

    @property
    def per_item(self) -> bool:
        return self.remap is not None or bool(self.skip) or self.strip


_NO_COLLECTIONS = CollectionPlan()


def _logical(key: bytes) -> bytes:
    """A doc key without its collection prefix."""
    return split_doc_key(key)[1]


def _key_mapper(plan: CollectionPlan, vbucket: int):
    """key -> key to send, or None to leave the record out."""
    remap, skip, strip = plan.remap, plan.skip, plan.strip
    prefixes: dict[int, bytes | None] = {}

    def new_prefix(cid: int) -> bytes | None:
        if cid in skip:
            return None
        tgt = cid if remap is None else remap.get(cid)
        if tgt is None:
            raise DcptoolError(f"vbucket {vbucket} holds documents of collection id "
                               f"{hex_id(cid)}, which no manifest or system event of the "
                               "archive names", hint="verify the archive")
        return b"" if strip else encode_leb128(tgt)

    def mapkey(key: bytes) -> bytes | None:
        c = key[0]
        if c < 0x80:
            pos = 1
        else:
            c, pos = decode_leb128(key)
        p = prefixes.get(c, False)
        if p is False:
            p = prefixes[c] = new_prefix(c)
        if p is None:
            return None
        return p + key[pos:]

    return mapkey


def resolved_records(archive: Archive | str, vbucket: int, backup: str | None,
                     key_filter: str | None = None, *, chain=None,
                     collections: CollectionPlan | None = None,
                     upto_seqno: int | None = None, checked: bool = False,
                     kept: dict[tuple[str, int], list] | None = None):
    """(kind, key, value, flags, expiry, rev_seqno, cas, datatype) for each resolved key of the
    vbucket, in seqno order. `chain` (from Archive.chain) saves re-reading the manifests when
    many vbuckets are resolved in a row. Keys are doc keys, turned into the target's by
    `collections`; documents of collections dropped as of the point restored are left out.
    `key_filter` (a regex) is matched against the key without its collection prefix.
    `checked`: the vbucket's records were checked as verify checks them (a restore's check
    of the chain), so the reader does not check each record's layout again. `kept`: record
    batches the check kept ({(backup id, vbucket): batches}, `verify_chain_vbuckets`),
    taken out of it and resolved instead of reading the files again."""
    if chain is None:
        chain = Archive.opened(archive).chain(backup)
    plan = collections or _NO_COLLECTIONS
    pattern = re.compile(key_filter.encode()) if key_filter else None
    parts = [_KeptPart(kept.pop((b.id, vbucket))) if kept and (b.id, vbucket) in kept
             else VBucketHistory(b, vbucket, validate=not checked)
             for b in chain if b.entry(vbucket) is not None]
    recs = sorted(resolve(parts, upto_seqno=upto_seqno, scope_of=plan.scope_of).values(),
                  key=_SEQNO)
    mapkey = _key_mapper(plan, vbucket) if plan.per_item else None
    if pattern is None and mapkey is None and _plain_mutations(recs):
        # the common case: every record a mutation with neither a separate xattr section
        # nor a compressed value, written as read: the tuples made in C-level passes
        yield from zip(itertools.repeat(mw.WRITE_MUTATION), *(map(g, recs) for g in _WRITTEN))
        return
    for r in recs:
        t = r[0]
        if t == REC_MUTATION:
            _t, _s, rev, cas, flags, expiry, datatype, key, value, xattrs = r
            if xattrs:
                # a record that keeps the xattr section apart: the wire value is both
                value = bytes(xattrs) + bytes(value)
            if datatype & SNAPPY:
                value, datatype = _plain(value, datatype, vbucket, key)
            out = (mw.WRITE_MUTATION, key, value, flags, expiry, rev, cas, datatype)
        else:
            _t, _s, rev, cas, key, delete_time, datatype, value = r
            if datatype & SNAPPY:
                value, datatype = _plain(value, datatype, vbucket, key)
            out = (_KIND[t], key, value or b"", 0, delete_time, rev, cas, datatype)
        if pattern is not None and not pattern.search(_logical(key)):
            continue
        if mapkey is not None:
            k = mapkey(key)
            if k is None:
                continue
            out = (out[0], k, *out[2:])
        yield out


class _KeptPart:
    """A part for resolve: record batches read once already."""

    def __init__(self, batches: list[list[tuple]]):
        self._batches = batches

    def batches(self) -> list[list[tuple]]:
        return self._batches

    def __iter__(self):
        return itertools.chain.from_iterable(self._batches)


_SEQNO = operator.itemgetter(1)
#: a mutation record's fields as the writer takes them after the kind: key, value, flags,
#: expiry, rev seqno, cas, datatype
_WRITTEN = tuple(operator.itemgetter(i) for i in (7, 8, 4, 5, 2, 3, 6))
_XATTRS = operator.itemgetter(9)
_DATATYPE = operator.itemgetter(6)
_NONE_ONLY = {None}


def _plain_mutations(recs: list[tuple]) -> bool:
    """Whether every record is a mutation without a separate xattr section whose value is
    not snappy-compressed."""
    return bool(recs) and bytes(map(_FIRST, recs)).count(REC_MUTATION) == len(recs) \
        and set(map(_XATTRS, recs)) == _NONE_ONLY \
        and not functools.reduce(operator.or_, map(_DATATYPE, recs), 0) & SNAPPY


def _plain(value: bytes, datatype: int, vbucket: int, key: bytes) -> tuple[bytes, int]:
    """A snappy-compressed value decompressed, the bit cleared: dcptool's archives hold
    values decompressed and restore writes them so (an archive written by other means
    may not), so the node gets no compressed value from a connection that may not have
    negotiated Snappy."""
    try:
        return plain(value, datatype)
    except ProtocolError as exc:
        raise DcptoolError(f"vbucket {vbucket} key {key.decode('utf-8', 'replace')!r}: the "
                           f"archive holds a snappy-compressed value that does not "
                           f"decompress ({exc.reason})") from None


def _without_key(error: str) -> str:
    """A write error ("KIND KEY: STATUS") with the document key left out."""
    kind, _, rest = error.partition(" ")
    return f"{kind} (key not logged: encrypted archive): {rest.rpartition(': ')[2]}"


#: a restore into a target checks the files and records of its vbuckets in its own Spark
#: tasks, one barrier stage: each task checks its vbuckets, and none writes before every
#: task's check passed; when the stage does not fit in the slots of a local master (or the
#: master is not local, or collections are to be created first), the check is done before
#: the tasks start, as below
CHECK_IN_TASKS = True
#: a restore whose chain holds at least this many records of the vbuckets restored checks
#: them in Spark tasks, one group of vbuckets each, in parallel (below it, in the driver: a
#: Spark job costs more than the check) ...
PARALLEL_CHECK_RECORDS = 50_000
#: ... when Spark has at least this many slots: on 2 the halved check saved no time against
#: the second job and each task's reading of the manifests (docs/performance.md, "Restore
#: against ingest"), and took more CPU from the node the restore then writes to
PARALLEL_CHECK_SLOTS = 4


def check_chain_files(archive: Archive, chain, vbuckets, *,
                      spark: Any = None, groups: int = 1) -> tuple[int, int, int, float]:
    """Check what `dcptool verify` checks (archive/verify.py's `verify_chain`) for the
    backups a restore of `vbuckets` along `chain` reads, before anything is written: each
    manifest, each data file's size and SHA-256, the done files against the manifest, every
    record, and that each vbucket starts where the chain before it ended. A damaged,
    swapped or changed file fails the whole restore up front instead of leaving a partial
    one. With `spark` and `groups` > 1 the vbuckets are checked in that many Spark tasks
    (`check_task`), in parallel, all before anything is written. Returns (files, bytes,
    records, seconds); raises CorruptFileError naming the first file with a problem."""
    from dcptool.archive.errors import CorruptFileError
    from dcptool.archive.verify import verify_chain

    t0 = time.monotonic()
    if spark is not None and groups > 1 and len(vbuckets) > 1:
        parts = [(archive, chain[-1].id, tuple(g)) for g in plan_groups(list(vbuckets), groups)]
        try:
            reports = run_tasks(spark, reporting_failures(check_task), parts)
        except Exception as exc:
            raise task_failure(exc, "restore check task",
                               "nothing was written; the restore can be rerun") from None
        order = {b.id: i for i, b in enumerate(chain)}
        problems, seen = [], set()
        # the problems in the order one check would give them: by backup, then vbucket
        for p in sorted((p for r in reports for p in r[3]),
                        key=lambda p: (order.get(p[2], len(order)),
                                       -1 if p[3] is None else p[3])):
            if (p[0], p[1]) not in seen:
                seen.add((p[0], p[1]))
                problems.append(p)
        files, nbytes, nrecords = (sum(r[i] for r in reports) for i in range(3))
    else:
        report = verify_chain(archive, chain, vbuckets)
        problems = [(p.path, p.message) for p in report.problems]
        files, nbytes, nrecords = (report.files_checked, report.bytes_checked,
                                   report.records_checked)
    if problems:
        raise chain_refused(problems)
    return files, nbytes, nrecords, time.monotonic() - t0


class _Refused(Exception):
    """The tasks of a restore that check its chain themselves found `problems`."""

    def __init__(self, problems: list[tuple[str, str]]):
        super().__init__(problems)
        self.problems = problems


def chain_refused(problems: list[tuple]) -> Exception:
    """The error of a restore whose chain `verify` would refuse: the first of `problems`
    ((path, message), in verify's order) and how many more."""
    from dcptool.archive.errors import CorruptFileError

    path, message = problems[0][:2]
    more = len(problems) - 1
    return CorruptFileError(path, message + (f" (and {more} more problem"
                                             f"{'s' if more != 1 else ''})" if more else ""),
                            hint="run 'dcptool verify' on the archive; nothing was written")


def check_task(part: tuple) -> tuple[int, int, int, list[tuple]]:
    """One Spark task of `check_chain_files`: (archive, backup id, vbuckets) ->
    (files, bytes, records, problems as (path, message, backup, vbucket))."""
    from dcptool.archive.verify import verify_chain

    archive, backup, vbuckets = part
    report = verify_chain(archive, archive.chain(backup), vbuckets)
    return (report.files_checked, report.bytes_checked, report.records_checked,
            [(p.path, p.message, p.backup, p.vbucket) for p in report.problems])


#: records a restore task writes between two counts for the progress bar
_COUNT_STEP = 256


def chain_records(chain, vbucket: int) -> int:
    """The records the backups of `chain` hold of `vbucket` (their manifest entries'
    counts): what the progress bar of a restore counts."""
    return entries_records(e for e in (b.entry(vbucket) for b in chain) if e is not None)


def restore_task(task: RestoreTask | tuple, chain: list[Any] | None = None,
                 kept: dict | None = None) -> RestoreTaskResult:
    """One task: `task` is a RestoreTask, or (RestoreTask, CollectionPlan). `chain`: the
    task's chain when it has it already; `kept`: record batches its check kept (see
    `resolved_records`)."""
    colls = None
    if isinstance(task, tuple):
        task, colls = task
    colls = colls or _NO_COLLECTIONS
    prefixed = not colls.strip
    if prefixed:  # doc keys: every connection must negotiate Collections
        task = dataclasses.replace(task, opts=with_collections(task.opts))
    with storage.pack_cache(), _gc_paused():  # each pack the task reads from is fetched once
        return _restore_task(task, colls, chain, kept)


#: a restore task that checks its vbuckets keeps up to this much of the records it decoded
#: (estimated, `verify_chain_vbuckets`) for its writing, which then need not decode them
#: again; the rest it reads again as it writes
KEEP_CHECKED_BYTES = 64 << 20
#: what a restore task of a barrier stage tells the others of its check (`sync`)
_CHECK_PASSED, _CHECK_FAILED = "passed", "failed"


def checked_restore_task(part: tuple, sync: Any) -> tuple:
    """One task of a restore whose tasks check the chain themselves (a barrier stage, see
    `run_barrier_tasks`): the part of `verify_chain` that concerns the task's own vbuckets
    (`verify_chain_vbuckets`: their files' sizes and SHA-256, every record), then `sync`
    with the other tasks; it writes (`restore_task`) only when every task's check passed.
    Returns ("written", check, RestoreTaskResult) or ("refused", check, problems): check
    is (files, bytes, records, seconds checking, seconds waiting for the others, CPU seconds
    checking); problems, this task's, as (place in verify_chain's
    order, path, message). A check that raised fails the task once the others know."""
    with _gc_paused():
        return _checked_restore_task(part, sync)


@contextlib.contextmanager
def _gc_paused():
    """The cyclic garbage collector off for a block: a restore task makes millions of
    tuples (records) and keeps many of them at once, which the collector would walk again
    and again for no cycle; it runs once the block ends."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _checked_restore_task(part: tuple, sync: Any) -> tuple:
    task = part[0] if isinstance(part, tuple) else part
    t0, c0 = time.monotonic(), time.process_time()
    failure: BaseException | None = None
    chain = None
    problems: list[tuple] = []
    files = nbytes = nrecords = 0
    kept: dict[tuple[str, int], list] = {}
    try:
        chain = task.archive.chain(task.backup)
        # what the check decodes is kept for the writing, within a bound (a to-time
        # restore's cut reads its own way)
        report, places = verify_chain_vbuckets(
            task.archive, chain, task.vbuckets, keep=None if task.at is not None else kept,
            keep_bytes=KEEP_CHECKED_BYTES)
        problems = [(place, p.path, p.message) for place, p in zip(places, report.problems)]
        files, nbytes, nrecords = (report.files_checked, report.bytes_checked,
                                   report.records_checked)
    except Exception as exc:  # noqa: BLE001 - raised once the other tasks know
        failure = exc
    passed = failure is None and not problems
    t1, c1 = time.monotonic(), time.process_time()
    verdicts = sync(_CHECK_PASSED if passed else _CHECK_FAILED)
    check = (files, nbytes, nrecords, round(t1 - t0, 3), round(time.monotonic() - t1, 3),
             round(c1 - c0, 3))
    if failure is not None:
        raise failure
    if any(v != _CHECK_PASSED for v in verdicts):
        return ("refused", check, problems)
    return ("written", check, restore_task(part, chain, kept))


def _task_problems(refused: list[list[tuple]]) -> list[tuple[str, str]]:
    """The problems the tasks of a barrier stage found, in the order one `verify_chain`
    of all their vbuckets names them."""
    return [(path, message) for _place, path, message in
            sorted((p for ps in refused for p in ps), key=lambda p: tuple(p[0]))]


def _restore_task(task: RestoreTask, colls: Any, chain: list[Any] | None = None,
                  kept: dict | None = None) -> RestoreTaskResult:
    prefixed = not colls.strip
    t0 = time.monotonic()
    began = time.time()
    counts = mw.WriteCounts()
    if chain is None:
        chain = task.archive.chain(task.backup)
    # records resolved per vbucket (what was sent), for the run log
    per_vb: dict[int, dict[str, int]] = {}

    cuts: dict[int, dict[str, Any]] = {}

    def records_of(vb):
        part_chain, upto = chain, None
        if task.at is not None:
            part_chain, upto, cuts[vb] = time_cut(chain, vb, task.at)
        # (every restore checks the chain as verify does before any task writes)
        recs = list(resolved_records(task.archive, vb, task.backup, task.key_filter,
                                     chain=part_chain, collections=colls, upto_seqno=upto,
                                     checked=True, kept=kept if upto is None else None))
        kinds = list(map(_FIRST, recs))
        per_vb[vb] = {k: kinds.count(k) for k in mw.WRITE_KINDS}
        return recs

    def counted_records_of(vb):
        # the bar counts the archive's records of the vbucket (what the driver totals):
        # as its resolved records are written, and the rest once they all are
        recs = records_of(vb)
        weight = chain_records(chain, vb)
        sent = 0
        for i in range(0, len(recs), _COUNT_STEP):
            yield from recs[i:i + _COUNT_STEP]
            n = min(_COUNT_STEP, len(recs) - i, weight - sent)
            progress.add(n)
            sent += n
        progress.add(weight - sent)

    def records():
        if not progress.counted():
            return itertools.chain.from_iterable(map(records_of, task.vbuckets))
        return itertools.chain.from_iterable(map(counted_records_of, task.vbuckets))

    if task.dry_run:
        for rec in records():
            counts.restored[rec[0]] += 1
        out = counts.as_dict()
    elif task.routes:  # a cluster: each vbucket to its active node
        def resolved(vb):
            recs = records_of(vb)
            progress.add(chain_records(chain, vb))  # handed to the writers: counted read
            return recs

        per_vbucket = ((vb, resolved(vb)) for vb in task.vbuckets)
        if task.archive_vbuckets and task.archive_vbuckets != task.node_vbuckets:
            per_vbucket = _by_target_vbucket(per_vbucket, task.node_vbuckets, prefixed)
        out = mw.write_to_actives(task.opts, task.routes, task.node_vbuckets, per_vbucket,
                                  force=task.force, prefixed=prefixed).as_dict()
    else:
        with task.opts.connect() as conn:
            _check_target_collections(conn, colls)
            writer = mw.MetaWriter(conn, task.node_vbuckets, force=task.force,
                                   prefixed=prefixed)
            writer.write(records())
        out = writer.counts.as_dict()
    return RestoreTaskResult(out, {"vbuckets": per_vb, "seconds": round(time.monotonic() - t0, 3),
                                   "pid": os.getpid(), "cuts": cuts,
                                   # wall clock: the run log places each task in the job
                                   "began": began, "ended": time.time()})


def time_cut(chain, vbucket: int, at: int) -> tuple[list[Any], int, dict[str, Any]]:
    """(the backups of `chain` to resolve `vbucket` over, the seqno to resolve to, the cut
    as the result reports it) for a restore to time `at`: the vbucket's last snapshot
    boundary at or before `at` (archive/pointintime.py)."""
    held = [b for b in chain if b.entry(vbucket) is not None]
    meta = [part_meta(b.manifest) for b in held]
    cut = vbucket_cut(vbucket, [VBucketHistory(b, vbucket) for b in held], at,
                      [m[0] for m in meta], [m[1] for m in meta])
    return held[:cut.part + 1], cut.seqno, {**cut.as_dict([b.id for b in held]),
                                            "lag_ns": cut.lag}


def _by_target_vbucket(per_vbucket, vbuckets: int, prefixed: bool):
    """(archive vbucket, records) pairs regrouped as (target vbucket, records) by the
    target's count `vbuckets`: an archive of another vbucket count is written by the
    target's own map, key by key."""
    from dcptool.protocol import wire

    for _vb, recs in per_vbucket:
        if not recs:
            continue
        groups: dict[int, list[tuple]] = {}
        keys = mw.logical_keys(recs) if prefixed else [r[1] for r in recs]
        for rec, tvb in zip(recs, wire.vbuckets_of(keys, vbuckets)):
            groups.setdefault(tvb, []).append(rec)
        yield from sorted(groups.items())


def _check_target_collections(conn, plan: CollectionPlan) -> None:
    """A task's connection must speak the key form the driver planned for."""
    if conn.collections == plan.strip:
        raise DcptoolError(f"{conn.address} {'now' if conn.collections else 'no longer'} "
                           "accepts collections; the restore was planned otherwise",
                           hint="run the restore again")


# -- collections on the driver ------------------------------------------------------------------

GET_COLLECTIONS_MANIFEST = 0xBA


def target_manifest(conn) -> Manifest:
    """The node's manifest (GET_COLLECTIONS_MANIFEST) over a collections connection."""
    from dcptool.client.connection import raise_for_status
    from dcptool.protocol.messages import GenericRequest

    rsp = conn.request(GenericRequest(op=GET_COLLECTIONS_MANIFEST))
    raise_for_status(rsp, "GET_COLLECTIONS_MANIFEST", address=conn.address)
    try:
        return Manifest.from_json(bytes(rsp.value))
    except ValueError as exc:
        raise DcptoolError(f"{conn.address} answered GET_COLLECTIONS_MANIFEST with a "
                           f"malformed manifest: {exc}") from None


def _listing(names: list[str], limit: int = 8) -> str:
    if len(names) <= limit:
        return ", ".join(names)
    return ", ".join(names[:limit]) + f" and {len(names) - limit} more"


@dataclass
class CollectionsSetup:
    """What the driver decided about collections (also in the result's JSON)."""

    plan: CollectionPlan
    #: {source "scope.collection": target "scope.collection"} of what is restored
    restored: dict[str, str] = field(default_factory=dict)
    excluded: list[str] = field(default_factory=list)
    created: list[str] = field(default_factory=list)
    #: a dry run: what the restore would create on the target
    would_create: list[str] = field(default_factory=list)
    target_collections: bool = True

    def as_json(self) -> dict[str, Any]:
        return {"restored": self.restored, "excluded": self.excluded, "created": self.created,
                "would_create": self.would_create,
                "target_collections": self.target_collections}


def plan_collections(chain, held: list[int], sel: DataSelection, *, conn=None, opts=None,
                     rest_port: int | None = None, notice=None,
                     create: bool = True) -> CollectionsSetup:
    """Name the archive's collections, apply the selection and the mapping, and (with a
    target connection) find or create the target's collections. Raises DcptoolError, one
    line naming what is missing, before anything is written. `create=False` (a dry run):
    what is missing is listed in `would_create`, and the REST port and the user's right to
    create them are checked without creating anything."""
    names, live = chain_collections(chain, vbuckets=held)
    for option, n in sel.names():
        known = (any(sc == n[0] for sc in names.scopes.values()) if n[1] is None
                 else bool(names.ids_named(n[0], n[1])))
        if not known:
            raise UsageError(f"{option}: {show(n)} is not in the archive (it holds "
                             f"{_listing(_live_names(names, live)) or 'no collection'})")
    selected: dict[int, tuple[str, str]] = {}
    skip: set[int] = set()
    for cid in names.collections:
        nm = names.names(cid)
        if cid in live and nm is not None and sel.selects(*nm):
            selected[cid] = nm
        else:
            skip.add(cid)
    targets = {cid: sel.target(*nm) for cid, nm in selected.items()}
    setup = CollectionsSetup(CollectionPlan(), restored={
        f"{nm[0]}.{nm[1]}": f"{targets[c][0]}.{targets[c][1]}" for c, nm in sorted(selected.items())},
        excluded=sorted(f"{nm[0]}.{nm[1]}" for c in skip if c in live
                        and (nm := names.names(c)) is not None))
    scope_of = names.scope_of() if len(names.collections) > 1 else None
    # left out by the selection (documents of dropped collections never survive resolution)
    excluded = frozenset(c for c in skip if c in live)

    def make_plan(remap: dict[int, int] | None, strip: bool) -> CollectionPlan:
        if remap is not None and all(a == b for a, b in remap.items()) and not strip:
            remap = None
        if remap is None and not excluded and not strip:
            return CollectionPlan(None, frozenset(), False, scope_of)
        return CollectionPlan(remap, frozenset(skip), strip, scope_of)

    if conn is None:  # a dry run: keys as they are, the excluded left out
        setup.plan = make_plan(None, False)
        return setup
    default = (DEFAULT_SCOPE, DEFAULT_COLLECTION)
    if not conn.collections:
        setup.target_collections = False
        outside = sorted({f"{t[0]}.{t[1]}" for t in targets.values() if t != default})
        if outside:
            raise DcptoolError(
                f"the target {conn.address} has no collections: only the default collection "
                f"can be restored there, and the selection holds {_listing(outside)}",
                hint="leave them out with --exclude-data or map them to _default._default "
                     "with --map-data")
        setup.plan = make_plan({cid: 0 for cid in selected}, True)
        return setup
    tm = target_manifest(conn)
    missing_scopes = sorted({t[0] for t in targets.values() if tm.scope(t[0]) is None})
    missing = sorted({t for t in targets.values() if tm.collection(*t) is None})
    if missing and not create:
        _check_may_create(conn, opts, missing_scopes, missing, rest_port)
        setup.would_create = ([f"{s} (scope)" for s in missing_scopes]
                              + [f"{s}.{c}" for s, c in missing])
        # the documents are counted as stored: the new collections' ids are not known yet
        setup.plan = make_plan(None, False)
        return setup
    if missing:
        ttl: dict[tuple[str, str], int] = {}
        for cid, t in targets.items():
            ttl[t] = max(ttl.get(t, 0), names.max_ttl(cid))
        tm = _create_collections(conn, opts, tm, missing_scopes, missing, ttl, rest_port)
        setup.created = [f"{s} (scope)" for s in missing_scopes] + [f"{s}.{c}" for s, c in missing]
        if notice is not None:
            notice(f"created on the target: {_listing(setup.created, 20)}")
    remap = {}
    for cid, t in targets.items():
        c = tm.collection(*t)
        if c is None:
            raise DcptoolError(f"the target {conn.address} still has no collection "
                               f"{t[0]}.{t[1]} after creating it")
        remap[cid] = c.uid
    setup.plan = make_plan(remap, False)
    return setup


def _live_names(names: CollectionNames, live: set[int]) -> list[str]:
    return sorted(f"{n[0]}.{n[1]}" for c in live if (n := names.names(c)) is not None)


def _rest_client(conn, opts, what: str, rest_port: int | None):
    """A REST client for the target's port (`rest_port`, or its cluster config's)."""
    from dcptool.client.rest import RestClient, rest_port_of
    from dcptool.client.topology import cluster_config

    port = rest_port
    if port is None:
        try:
            port = rest_port_of(cluster_config(conn), tls=bool(getattr(opts, "tls", False)))
        except DcptoolError:
            port = None
    if port is None:
        raise DcptoolError(f"the target {conn.address} lacks {what}, and its REST port is "
                           "unknown to create them", hint="pass --rest-port, or create them "
                                                          "on the target first")
    return RestClient.for_options(opts, port)


def _forbidden(opts, conn, what: str) -> DcptoolError:
    return DcptoolError(f"user {opts.username!r} may not create scopes and collections "
                        f"on the target {conn.address}, which lacks {what}; nothing "
                        "was written", hint="create them on the target first, or "
                                            "restore as a user who may")


def _check_may_create(conn, opts, scopes: list[str], colls: list[tuple[str, str]],
                      rest_port: int | None) -> None:
    """A dry run's check of what `_create_collections` needs, creating nothing: the REST
    port answers and the user may create collections. The probe is a collection creation
    without a name, which a server refuses with 403 to a user without the privilege and
    as invalid (400) to one with it."""
    from dcptool.client.rest import RestError

    what = _listing([f"scope {s}" for s in scopes] + [f"{s}.{c}" for s, c in colls])
    rest = _rest_client(conn, opts, what, rest_port)
    try:
        rest.request("POST", rest._path("scopes", DEFAULT_SCOPE, "collections"), {})
    except RestError as exc:
        if exc.forbidden:
            raise _forbidden(opts, conn, what) from None
        if exc.unreachable or exc.status == 401:
            raise DcptoolError(f"could not create {what} on the target {conn.address}: "
                               f"{exc}; nothing was written") from None


def _create_collections(conn, opts, tm: Manifest, scopes: list[str],
                        colls: list[tuple[str, str]], ttl: dict, rest_port: int | None
                        ) -> Manifest:
    from dcptool.client.rest import RestError

    what = _listing([f"scope {s}" for s in scopes] + [f"{s}.{c}" for s, c in colls])
    rest = _rest_client(conn, opts, what, rest_port)
    try:
        for s in scopes:
            try:
                rest.create_scope(s)
            except RestError as exc:
                if exc.status != 400 or "exist" not in str(exc):
                    raise
        for s, c in colls:
            try:
                rest.create_collection(s, c, ttl.get((s, c), 0))
            except RestError as exc:
                if exc.status != 400 or "exist" not in str(exc):
                    raise
    except RestError as exc:
        if exc.forbidden:
            raise _forbidden(opts, conn, what) from None
        raise DcptoolError(f"could not create {what} on the target {conn.address}: "
                           f"{exc}; nothing was written") from None
    return target_manifest(conn)


@dataclass
class RestoreResult:
    backup_id: str
    vbuckets: int
    dry_run: bool
    counts: mw.WriteCounts = field(default_factory=mw.WriteCounts)
    seconds: float = 0.0
    log: str | None = None
    collections: dict[str, Any] | None = None
    #: of `seconds`, starting Spark (or attaching to an engine)
    spark_seconds: float = 0.0
    #: the target as checked: address, bucket, its vbucket count and the archive's,
    #: whether keys are routed by another count, nodes written to (None: no target)
    target: dict[str, Any] | None = None
    #: what was checked of the archive before writing: backups, files, bytes, records
    checked: dict[str, int] | None = None
    #: a restore to a time (--to-time): the time, each vbucket's cut, their lags
    point_in_time: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        d = self.counts.as_dict()
        total = sum(d["restored"].values())
        work = self.seconds - self.spark_seconds  # the rate leaves Spark's start-up out
        return {"backup_id": self.backup_id, "vbuckets": self.vbuckets, "dry_run": self.dry_run,
                **d, "seconds": round(self.seconds, 3),
                "spark_startup_seconds": round(self.spark_seconds, 3),
                "items_per_second": round(total / work, 1) if work > 0 else None,
                "collections": self.collections, "target": self.target,
                "checked": self.checked, "point_in_time": self.point_in_time,
                "log": self.log}


@dataclass(frozen=True)
class RestoreOptions:
    """What a restore does (the CLI's options): which backup and vbuckets, which keys
    (`key_filter`, a regex) and data (include/exclude/map lists of names, see
    pipeline/datafilter.py), `force` (overwrite newer data), `dry_run`, Spark (`partitions`,
    `master`, `spark`), the target's REST port for creating collections (default from its
    cluster config) and `notice` (a callable for one-line notes)."""

    backup: str | None = None
    vbuckets: list[int] | None = None
    key_filter: str | None = None
    force: bool = False
    dry_run: bool = False
    partitions: int | None = None
    master: str | None = None
    spark: Any = None
    include_data: list[str] | None = None
    exclude_data: list[str] | None = None
    map_data: list[str] | None = None
    rest_port: int | None = None
    notice: Any = None
    #: restore to this time (ns since the epoch, archive/pointintime.py) instead of a backup
    to_time: int | None = None
    #: with to_time inside a gap: the nearest snapshot boundary before it instead of refusing
    nearest: bool = False


def run_restore(archive: Archive | str, opts: ConnOptions | None = None, *,
                backup: str | None = None, vbuckets: list[int] | None = None,
                key_filter: str | None = None, force: bool = False, dry_run: bool = False,
                partitions: int | None = None, master: str | None = None, spark: Any = None,
                include_data: list[str] | None = None, exclude_data: list[str] | None = None,
                map_data: list[str] | None = None, rest_port: int | None = None,
                notice: Any = None, to_time: int | None = None,
                nearest: bool = False) -> RestoreResult:
    """Restore `archive` (opened, or the one at that path) into the node `opts` (None
    with dry_run); see RestoreOptions. The run is logged to `ARCHIVE/logs/restore-*.log`.
    """
    options = RestoreOptions(backup, vbuckets, key_filter, force, dry_run, partitions, master,
                             spark, include_data, exclude_data, map_data, rest_port, notice,
                             to_time, nearest)
    with RunLog("restore") as rl:
        # tasks may run elsewhere: the archive they get is rooted at its absolute location
        opened = Archive.opened(archive)
        label = str(archive) if not isinstance(archive, Archive) else str(archive.path)
        result = _run_restore(rl, opened.at(opened.path.absolute()), opts, options, label)
    result.log = str(rl.path) if rl.path else None
    return result


def _kinds(c: dict[str, int]) -> str:
    return (f"{c.get(mw.WRITE_MUTATION, 0)} mutations, {c.get(mw.WRITE_DELETION, 0)} deletions, "
            f"{c.get(mw.WRITE_EXPIRATION, 0)} expirations")


def _run_restore(rl: RunLog, archive: Archive, opts: ConnOptions | None,
                 o: RestoreOptions, label: str) -> RestoreResult:
    t0 = time.monotonic()
    sel = selection(o.include_data, o.exclude_data, o.map_data, bucket=archive.bucket,
                    target_bucket=opts.bucket if opts is not None else None)
    rl.attach(archive.path)
    rl.info("restore%s of %s into %s (pid %d)", " dry run" if o.dry_run else "", archive.path,
            "nothing" if opts is None else f"bucket {opts.bucket} on {opts.address}", os.getpid())
    chain, held, when = _restore_scope(archive, o, label)
    if when is not None:
        rl.info("restore to time %s%s: chain of backup %s", iso(when.at),
                f" (in the gap {iso(when.gap[0])} to {iso(when.gap[1])}: --nearest)"
                if when.gap else "", chain[-1].id)
    # what verify checks, for the backups and vbuckets read: nothing is written otherwise
    spark, spark_seconds, target, in_tasks = None, 0.0, None, False
    if held and not o.dry_run and opts is not None and CHECK_IN_TASKS:
        # the restore's own tasks check their vbuckets, all before any of them writes: the
        # rest of the check (manifests, listings, continuity) and the target's here first
        ts = time.monotonic()
        shared = verify_chain_shared(archive, chain, held)
        shared_seconds = time.monotonic() - ts
        if not shared.problems:  # (else verify_chain below names the first problem)
            target = _check_target(archive, opts, chain, held, sel, o, create=False)
            if not target.setup.would_create:  # (else created once the chain is checked)
                ts = time.monotonic()
                spark = o.spark or get_context(o.master)
                o = dataclasses.replace(o, spark=spark)
                spark_seconds = time.monotonic() - ts
                slots = barrier_slots(spark)
                in_tasks = slots is not None and len(_task_groups(archive, held, target, o,
                                                                  spark)) <= slots
    if in_tasks:
        files = nbytes = nrecords = 0
        rl.info("checked the manifests, listings and continuity of %d backups in %.2f s; "
                "the files and records in the restore tasks, before any writes",
                len(chain), shared_seconds)
    else:
        groups = 1
        if held and sum(chain_records(chain, vb) for vb in held) >= PARALLEL_CHECK_RECORDS:
            # a large restore: checked in Spark tasks in parallel (Spark is started now)
            ts = time.monotonic()
            if spark is None:
                spark = o.spark or get_context(o.master)
                o = dataclasses.replace(o, spark=spark)
                spark_seconds = time.monotonic() - ts
            groups = default_parallelism(spark)
            if groups < PARALLEL_CHECK_SLOTS:
                groups = 1
            else:
                rl.info("checking the chain as verify does in %d Spark tasks", groups)
        files, nbytes, nrecords, secs = check_chain_files(
            archive, chain, held, spark=spark if groups > 1 else None, groups=groups)
        rl.info("checked %d files (%d bytes, %d records) as verify does in %.2f s%s", files,
                nbytes, nrecords, secs, f" ({groups} Spark tasks)" if groups > 1 else "")
        if target is not None and target.setup.would_create:
            target = None  # checked again, creating what it lacks now that the chain passed
    if target is None:
        target = _RestoreTarget(archive.vbucket_count)
        if opts is not None:
            target = _check_target(archive, opts, chain, held, sel, o)
        else:  # the library's offline count (no target)
            target.setup = plan_collections(chain, held, sel)
    if o.dry_run:
        target.opts, target.routes = None, None  # the tasks count; they connect to nothing
    colls = target.setup.plan
    rl.info("collections: %s%s%s",
            ", ".join(f"{a} -> {b}" for a, b in target.setup.restored.items()),
            "; keys as stored" if not colls.per_item else "; keys remapped per item",
            f"; left out {', '.join(target.setup.excluded)}" if target.setup.excluded else "")
    result = RestoreResult(chain[-1].id, len(held), o.dry_run,
                           collections=target.setup.as_json(), target=target.info,
                           checked={"backups": len(chain), "files": files, "bytes": nbytes,
                                    "records": nrecords,
                                    # the backups' size as `info` and `verify` give it
                                    "size_on_disk": sum(dir_size(archive.backup_dir(b.id))
                                                        for b in chain)})
    if when is not None:
        result.point_in_time = {"to_time": iso(when.at), "nearest": o.nearest,
                                "gap": None if when.gap is None else
                                {"from": iso(when.gap[0]), "to": iso(when.gap[1])},
                                "lag": lag_summary([]), "vbuckets": []}
    _log_restore_plan(rl, archive, chain, held, target, o)
    if held:
        _run_restore_tasks(rl, archive, chain, held, target, o, result, check=in_tasks)
        if spark is not None:  # started for the check: its start-up is the restore's
            result.spark_seconds += spark_seconds
    result.seconds = time.monotonic() - t0
    d = result.counts.as_dict()
    rl.info("%s backup %s in %.2f s: %s %s; skipped %s; failed %s; %d retries",
            "dry run of" if o.dry_run else "restored", chain[-1].id, result.seconds,
            "would write" if o.dry_run else "restored",
            _kinds(d["restored"]), _kinds(d["skipped"]), _kinds(d["failed"]), d["retries"])
    return result


@dataclass
class _RestoreTarget:
    """The target as the driver checked it: its vbucket count, the options the tasks
    connect with, the routes on a cluster ({vbucket: its active node}), the collections
    set up, and what the result reports of it (None: no target)."""

    vbuckets: int
    opts: ConnOptions | None = None
    routes: dict[int, str] | None = None
    setup: Any = None
    info: dict[str, Any] | None = None


def _restore_scope(archive: Archive, o: RestoreOptions,
                   label: str) -> tuple[list[Any], list[int], Any]:
    """(the chain restored, the vbuckets restored, the TimePlan of --to-time or None); a
    usage error for a bad key filter, or a time outside the archive's coverage.
    `label`: the archive as the caller named it."""
    when = None
    if o.to_time is not None:
        if o.backup is not None:
            raise UsageError("--to-time and --backup exclude each other")
        if not archive.committed_ids():
            raise DcptoolError(f"archive {label} has no committed backup to restore")
        when = plan_time(archive, o.to_time, nearest=o.nearest)
        if not when.chain:
            raise UsageError(f"--to-time {iso(o.to_time)}: no chain of the archive began "
                             "by then")
        chain = archive.chain(when.chain[-1])
    else:
        chain = archive.chain(o.backup)
    if not chain:
        raise DcptoolError(f"archive {label} has no committed backup to restore")
    held = sorted({vb for b in chain for vb in b.vbuckets})
    if o.vbuckets is not None:
        held = [vb for vb in held if vb in set(o.vbuckets)]
    if o.key_filter:
        try:
            re.compile(o.key_filter)
        except re.error as exc:
            raise UsageError(f"--filter-keys: bad regular expression: {exc}") from None
    return chain, held, when


def _check_target(archive: Archive, opts: ConnOptions, chain: list[Any], held: list[int],
                  sel: DataSelection, o: RestoreOptions,
                  create: bool | None = None) -> _RestoreTarget:
    """The target as the restore needs it (connection, login, bucket, vbucket map,
    collections); the collections it lacks are created unless `create` is False (default:
    unless a dry run, which creates and writes nothing)."""
    if create is None:
        create = not o.dry_run
    copts = with_collections(opts)
    with copts.connect() as conn:
        node_vbuckets = vbucket_count(conn)
        found = active_nodes(copts, conn)
        setup = plan_collections(chain, held, sel, conn=conn, opts=opts,
                                 rest_port=o.rest_port, notice=o.notice, create=create)
    # the tasks speak the key form planned: doc keys, or plain keys for a target
    # without collections
    opts = opts if setup.plan.strip else copts
    routes = None
    if found is not None:
        routes = {vb: node for node, vbs in found[1].items() for vb in vbs}
    info = {"address": opts.address, "bucket": opts.bucket,
            "vbuckets": node_vbuckets, "archive_vbuckets": archive.vbucket_count,
            "rerouted": node_vbuckets != archive.vbucket_count,
            "nodes": len(found[1]) if found is not None else 1}
    return _RestoreTarget(node_vbuckets, opts, routes, setup, info)


def _log_restore_plan(rl: RunLog, archive: Archive, chain: list[Any], held: list[int],
                      target: _RestoreTarget, o: RestoreOptions) -> None:
    node_vbuckets = target.vbuckets
    rl.info("state as of backup %s (chain %s), %d vbuckets%s%s%s", chain[-1].id,
            " <- ".join(b.id for b in reversed(chain)), len(held),
            f", keys matching {o.key_filter!r}" if o.key_filter else "",
            ", --force-updates" if o.force else "", f"; the node has {node_vbuckets} vbuckets"
            f"{' (keys routed by its map; the archive has ' + str(archive.vbucket_count) + ')' if node_vbuckets != archive.vbucket_count else ''}"
            if target.info else "")


def member_groups(held: list[int], n: int, routes: dict[int, str] | None) -> list[list[int]]:
    """The vbuckets `held` in `n` groups, one task each. On a cluster (`routes`: {vbucket:
    its active member}) with at least as many tasks as members, each task writes to one
    member: the tasks are shared among the members by their vbuckets, so every member is
    written by tasks of its own, in parallel. With fewer tasks than members (or no routes)
    round-robin: each task's vbuckets lie on every member, and its writer keeps windows in
    flight to all of them at once (`metawriter.write_to_actives`)."""
    if not routes:
        return plan_groups(held, n)
    by_member: dict[str, list[int]] = {}
    for vb in held:
        by_member.setdefault(routes.get(vb, ""), []).append(vb)
    if n < len(by_member):
        return plan_groups(held, n)
    members = sorted(by_member, key=lambda m: (-len(by_member[m]), m))
    share = {m: 1 for m in members}
    for _ in range(n - len(members)):  # the rest to the members with most vbuckets a task
        m = max(members, key=lambda m: len(by_member[m]) / share[m])
        share[m] += 1
    return [g for m in members for g in plan_groups(by_member[m], share[m])]


def _task_groups(archive: Archive, held: list[int], target: _RestoreTarget,
                 o: RestoreOptions, spark: Any) -> list[list[int]]:
    """The vbuckets of each restore task: one task per slot, so every task writes at once,
    each over its own connection (a second wave would wait for the first, while the node
    has room for more writers)."""
    n = o.partitions or default_parallelism(spark)
    return member_groups(held, n, target.routes
                         if archive.vbucket_count == target.vbuckets else None)


def _run_restore_tasks(rl: RunLog, archive: Archive, chain: list[Any], held: list[int],
                       target: _RestoreTarget, o: RestoreOptions,
                       result: RestoreResult, check: bool = False) -> None:
    """Write (or, dry, count) the vbuckets `held` as Spark tasks; their counts go into
    `result` and the run log. `check`: the tasks check their vbuckets' files and records
    first, and write only when every task's check passed (one barrier stage)."""
    backup_id = chain[-1].id
    ts = time.monotonic()
    spark = o.spark or get_context(o.master)  # RDD jobs: no session needed
    result.spark_seconds = time.monotonic() - ts
    check_executors_see(spark, archive.path, name="archive.json",
                        key_travels=archive.key is not None)
    tasks = [(RestoreTask(target.opts, archive, backup_id, tuple(g), target.vbuckets,
                          key_filter=o.key_filter, force=o.force, dry_run=o.dry_run,
                          routes=target.routes, archive_vbuckets=archive.vbucket_count,
                          at=o.to_time),
              target.setup.plan)
             for g in _task_groups(archive, held, target, o, spark)]
    rl.info("spark %s: %d tasks%s (started in %.1f s)", context_of(spark).master, len(tasks),
            ", each checking its vbuckets as verify does, all before any writes"
            if check else "", time.monotonic() - ts)
    job_began = time.time()
    try:
        # (the archive is only read: no progress files in it for a master that is not
        # local, whose tasks the bar counts instead)
        if check:
            def checked(outcomes: list) -> None:
                # before the bar is made whole: a refused restore wrote nothing
                sums = [sum(c[1][i] for c in outcomes) for i in range(3)]
                rl.info("checked %d files (%d bytes, %d records) as verify does in the %d "
                        "restore tasks, before any wrote (%s s, of CPU %s s; then waiting "
                        "for the others %s s)", *sums, len(outcomes),
                        ", ".join(f"{c[1][3]:.3f}" for c in outcomes),
                        ", ".join(f"{c[1][5]:.3f}" for c in outcomes),
                        ", ".join(f"{c[1][4]:.3f}" for c in outcomes))
                if result.checked is not None:
                    result.checked.update(files=sums[0], bytes=sums[1], records=sums[2])
                if any(c[0] == "refused" for c in outcomes):
                    raise _Refused(_task_problems(
                        [c[2] for c in outcomes if c[0] == "refused"]))

            outcomes = run_barrier_tasks(spark, reporting_failures(checked_restore_task),
                                         tasks, total=sum(chain_records(chain, vb)
                                                          for vb in held), then=checked)
            results = [c[2] for c in outcomes]
        else:
            results = run_tasks(spark, reporting_failures(restore_task), tasks,
                                total=sum(chain_records(chain, vb) for vb in held))
    except _Refused as refused:
        raise chain_refused(refused.problems) from None
    except Exception as exc:
        raise task_failure(exc, "restore task",
                           "the restore can be rerun: it is idempotent") from None
    for i, res in enumerate(results):
        r, run = res.counts, res.run
        for vb, c in sorted(run.get("vbuckets", {}).items()):
            rl.info("vbucket %s: %s %s", vb, "would write" if o.dry_run else "sent", _kinds(c))
        rl.info("task %d (%d vbuckets): %s %s; skipped (newer on the node) %s; failed "
                "%s; %d retries; %.3f s (from %.3f to %.3f s into the job)", i,
                len(run.get("vbuckets", {})), "would write" if o.dry_run else "restored",
                _kinds(r["restored"]), _kinds(r["skipped"]), _kinds(r["failed"]),
                r["retries"], run.get("seconds", 0.0), run.get("began", job_began) - job_began,
                run.get("ended", job_began) - job_began)
        for e in r["errors"]:
            # the run log stays in the clear beside an encrypted archive: no keys in it
            rl.error("task %d: %s", i, _without_key(e) if archive.encrypted else e)
        part = mw.WriteCounts(restored=r["restored"], skipped=r["skipped"], failed=r["failed"],
                              retries=r["retries"], errors=r["errors"])
        result.counts.add(part)
        for vb, cut in sorted(run.get("cuts", {}).items()):
            rl.info("vbucket %s: cut at seqno %s (backup %s), %s", vb, cut["seqno"],
                    cut["backup"], "no record before it" if cut["time"] is None else
                    f"time {cut['time']}, {cut['lag_seconds']} s before the time asked")
            if result.point_in_time is not None:
                result.point_in_time["vbuckets"].append(cut)
    if result.point_in_time is not None:
        pit = result.point_in_time
        pit["vbuckets"].sort(key=lambda c: c["vbucket"])
        cuts = [VBucketCut(c["vbucket"], 0, c["seqno"], None, c.pop("lag_ns"), c["exact"])
                for c in pit["vbuckets"]]
        pit["lag"] = lag_summary(cuts)
        rl.info("cuts of %d vbuckets: worst lag %s s, median %s s", len(cuts),
                pit["lag"]["worst_seconds"], pit["lag"]["median_seconds"])
