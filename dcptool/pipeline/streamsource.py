"""A node's DCP changes as a Structured Streaming source: `readStream.format("dcptool-stream")`.

    spark.readStream.format("dcptool-stream")
        .option("cluster", "couchbase://127.0.0.1").option("bucket", "default")
        .option("username", "Administrator").option("password", "...")   # or DCPTOOL_PASSWORD
        .load()

Offsets are per-vbucket DCP positions, kept by Spark in the query's checkpoint:

    {"0": {"uuid": 2817..., "seq": 1200, "ss": 1200, "se": 1200}, "1": {...}, ...}

(string keys, because Spark passes offsets through JSON). `latestOffset` asks the node for
each vbucket's high seqno and newest failover-log uuid; a micro-batch streams, per group of
vbuckets (one Spark task per group, each with its own DCP connection), from the start
position to the end seqno and emits the items at or below it. The node finishes a snapshot
even past the end seqno; those items are left for the next batch, which asks for them from
the end position.

Rollback: when the node answers a stream request with ROLLBACK (its history diverged from
the position in the checkpoint, e.g. after a failover or an unclean restart), the task
emits a row of type `rollback` whose `seqno` is the point the vbucket went back to, then
re-reads from there. Rows of that vbucket emitted earlier with a higher seqno belong to
the abandoned history; a sink drops them when it sees the rollback row.

Collections: the tasks' connections negotiate Collections, so every collection of the bucket
is streamed; `key` is the document key without its collection prefix, `scope` and
`collection` name its collection (through the node's manifest when the task began and the
system events of the stream; an id neither names shows as its hex id with a null scope) and
`collection_id` is its id. Offsets are the vbuckets' high seqnos (all collections).

Positions (`.option("positions", "true")`, what `backup --continuous` runs on): a
micro-batch streams no items; it is the offset range itself, one row per vbucket of the
end offset (`POSITIONS_DDL`: vbucket, uuid, start_seqno, end_seqno, moved), so that a
`foreachBatch` sink can copy exactly that range its own way. In this mode the offsets
come from every vbucket's active node of a cluster (as a backup plans), the query starts
at the `startOffset` option (a JSON offset; missing vbuckets at seqno 0) without asking
the node, and a node that cannot be asked for its positions (restarting, unreachable)
makes `latestOffset` answer the start offset: no batch, the query lives on and the next
trigger asks again. The `connection` option (JSON of the connection options, TLS and
client certificate included, secrets aside) replaces cluster/username there; the
password (and a client key's) go in `password` (and `clientKeyPassword`), options whose
names Spark redacts wherever it shows them.

`trigger(availableNow=True)` freezes the target offsets when the query starts, drains up
to them and stops. `maxRecordsPerBatch` bounds a micro-batch by seqno ranges (an upper
bound of the items in them). `commit()` does nothing: DCP keeps no consumer position on
the node; all progress is in the checkpoint.
"""
from __future__ import annotations

import os
from operator import itemgetter
from typing import Any, Iterator

from dcptool.errors import UsageError

from .datasource import TRUE_WORDS, default_partitions
from .datasource import COLUMNS as ARCHIVE_COLUMNS
from .datasource import arrow_schema as _arrow_schema
from .plans import StreamPartition

NAME = "dcptool-stream"

#: the archive source's columns (`datasource.COLUMNS`, their one home) less those only an
#: archive has: which backup, the xattrs apart, and dead by a later rollback
ARCHIVE_ONLY = ("backup_id", "xattrs", "dead")
COLUMNS = tuple((n, t) for n, t in ARCHIVE_COLUMNS if n not in ARCHIVE_ONLY)
SCHEMA_DDL = ", ".join(f"{n} {t}" for n, t in COLUMNS)

BATCH_ROWS = 16384

#: the rows of a micro-batch in positions mode: the batch's offset range per vbucket
POSITIONS_COLUMNS = (("vbucket", "int"), ("uuid", "bigint"), ("start_seqno", "bigint"),
                     ("end_seqno", "bigint"), ("moved", "boolean"))
POSITIONS_DDL = ", ".join(f"{n} {t}" for n, t in POSITIONS_COLUMNS)


def arrow_schema():
    return _arrow_schema(COLUMNS)


def _entry(uuid: int, seqno: int, ss: int | None = None, se: int | None = None) -> dict[str, int]:
    return {"uuid": int(uuid), "seq": int(seqno), "ss": int(seqno if ss is None else ss),
            "se": int(seqno if se is None else se)}


def parse_options(options: dict[str, str]) -> dict[str, Any]:
    """Connection options and settings from the source's string options."""
    from dcptool.client.options import ConnOptions
    from dcptool.client.vbspec import parse_vbuckets

    options = {str(k).lower(): v for k, v in options.items()}  # Spark's keys are case-insensitive
    if options.get("connection"):
        opts = connection_from_json(options["connection"], options.get("password"),
                                    options.get("clientkeypassword"))
    else:
        cluster = options.get("cluster")
        if not cluster:
            raise UsageError("dcptool-stream: option 'cluster' is required (e.g. "
                             "couchbase://HOST)")
        password = options.get("password") or os.environ.get("DCPTOOL_PASSWORD")
        opts = ConnOptions.from_cli(cluster, options.get("username"), password,
                                    options.get("bucket") or "default", prompt=False)
    start = (options.get("start") or "beginning").lower()
    if start not in ("beginning", "now"):
        raise UsageError(f"dcptool-stream: option start must be 'beginning' or 'now', not {start!r}")
    try:
        partitions = int(options.get("partitions") or default_partitions())
        max_records = int(options["maxrecordsperbatch"]) if options.get("maxrecordsperbatch") \
            else None
    except ValueError as exc:
        raise UsageError(f"dcptool-stream: {exc}") from None
    return {
        "opts": opts,
        "vbuckets": parse_vbuckets(options.get("vbuckets"), option="option vbuckets"),
        "start": start,
        "partitions": max(1, partitions),
        "values": str(options.get("values", "true")).lower() in TRUE_WORDS,
        "max_records": max_records,
        "positions": str(options.get("positions", "false")).lower() in TRUE_WORDS,
        "start_offset": _start_offset(options.get("startoffset")),
    }


def connection_options(opts) -> dict[str, str]:
    """The source's options for connection options `opts` (ConnOptions): `connection`, the
    JSON of everything but the secrets, and the secrets in options of their own,
    `password` and `clientKeyPassword`, whose names Spark's redaction
    (`spark.redaction.regex`) hides wherever it shows a plan's or a query's options."""
    import dataclasses
    import json

    d = dataclasses.asdict(opts)
    password = d.pop("password")
    key_password = d.pop("client_key_password")
    out = {"connection": json.dumps(d), "password": password}
    if key_password is not None:
        out["clientKeyPassword"] = key_password.decode("latin-1")
    return out


def connection_from_json(text: str, password: str | None = None,
                         key_password: str | None = None):
    import json

    from dcptool.client.options import ConnOptions

    try:
        d = json.loads(text)
        d["password"] = password if password is not None else (
            os.environ.get("DCPTOOL_PASSWORD") or "")
        d["client_key_password"] = (None if key_password is None
                                    else key_password.encode("latin-1"))
        return ConnOptions(**d)
    except (ValueError, TypeError, AttributeError) as exc:
        raise UsageError(f"dcptool-stream: option connection: {exc}") from None


def offset_of(positions: dict[int, Any]) -> dict[str, dict[str, int]]:
    """An offset from {vb: position} (anything with uuid, seqno, snap_start, snap_end,
    such as the archive's end positions)."""
    return {str(vb): _entry(p.uuid, p.seqno, p.snap_start, p.snap_end)
            for vb, p in sorted(positions.items())}


def _start_offset(text: str | None) -> dict[str, dict[str, int]] | None:
    if not text:
        return None
    import json

    try:
        doc = json.loads(text)
        return {str(int(k)): _entry(v["uuid"], v["seq"], v.get("ss"), v.get("se"))
                for k, v in doc.items()}
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise UsageError(f"dcptool-stream: option startOffset: {exc}") from None


def node_positions(opts, vbuckets: list[int] | None) -> dict[int, dict[str, int]]:
    """{vb: offset entry at the node's current high seqno} for the active vbuckets."""
    from dcptool.client.ops import latest_positions

    # a collections connection: each vbucket's high seqno (a legacy one gets the default
    # collection's)
    with opts.connect(collections=True) as conn:
        positions = latest_positions(conn, vbuckets)
    return {vb: _entry(p.uuid, p.seqno) for vb, p in positions.items()}


def cluster_positions(opts, vbuckets: list[int] | None) -> dict[int, dict[str, int]]:
    """node_positions over a whole cluster when the node is a member of one: each
    vbucket's from its active node (as a backup plans them)."""
    from dcptool.client.position import Position

    from .nodeinfo import cluster_state

    _count, seqnos, logs, _members = cluster_state(opts, vbuckets)
    out = {}
    for vb, high in seqnos.items():
        p = Position.latest(logs.get(vb, ()), high)
        out[vb] = _entry(p.uuid, p.seqno)
    return out


def position_rows(part: StreamPartition) -> Iterator[tuple]:
    """The rows of a positions micro-batch's partition: (vbucket, uuid, start seqno, end
    seqno, moved) per vbucket of its end offset."""
    for vb, (s, e) in sorted(part.vbuckets.items()):
        yield (int(vb), int(e["uuid"]), int(s["seq"]), int(e["seq"]), s != e)


def _moved(cur: dict[str, int], new: dict[str, int]) -> bool:
    """Whether the node's position differs from the checkpoint's: more data, less data
    (it lost some), or a new history (a failover-log entry the checkpoint has not seen,
    which the next stream request checks: it either continues or answers ROLLBACK)."""
    return new["seq"] != cur["seq"] or (cur["seq"] > 0 and new["uuid"] != cur["uuid"])


def plan_end(start: dict[str, dict], latest: dict[int, dict[str, int]],
             max_records: int | None = None) -> dict[str, dict]:
    """The end offset of the next micro-batch: each vbucket's latest position where the
    node moved on (or back), the start entry where it did not; with `max_records` the
    seqno ranges add up to at most that many. Keys keep the start offset's order, so an
    offset without new data is identical to the start (Spark then runs no batch)."""
    out: dict[str, dict] = {}
    budget = max_records
    for key in sorted(set(start) | {str(vb) for vb in latest}, key=int):
        cur = start.get(key)
        new = latest.get(int(key))
        if new is None:
            out[key] = cur
            continue
        if cur is None:
            cur = _entry(0, 0)
        if not _moved(cur, new):
            out[key] = cur  # nothing new: keep the entry as it is
            continue
        if budget is not None and new["seq"] > cur["seq"]:
            if budget <= 0:
                out[key] = cur
                continue
            step = min(new["seq"] - cur["seq"], budget)
            budget -= step
            if step < new["seq"] - cur["seq"]:
                new = _entry(new["uuid"], cur["seq"] + step)
        out[key] = new
    return out


def stream_task(part: StreamPartition) -> Iterator[Any]:
    """Arrow batches of one micro-batch partition: stream each vbucket from its start
    position to its end seqno (see the module docstring)."""
    from dcptool.client.ops import get_collections_manifest, get_failover_logs
    from dcptool.client.session import SessionConfig

    opts = part.opts
    plan = {int(vb): (s, e) for vb, (s, e) in part.vbuckets.items()}
    with opts.connect(collections=True) as conn:
        logs = get_failover_logs(conn, sorted(plan))
        manifest = get_collections_manifest(conn, missing_ok=True) if conn.collections else None
    scopes, colls = _collection_names(manifest)
    ends = {vb: e["seq"] for vb, (s, e) in plan.items()}
    config = SessionConfig(name=part.name, no_value=not part.values,
                           consistent=True, max_rollbacks=16, collections=True)
    consumer = opts.consumer(config, on_rollback=_resume_at_rollback)
    rows: list[tuple] = []
    schema = arrow_schema()
    try:
        consumer.add_streams(_start_positions(plan, logs))
        yield from _event_batches(consumer, ends, part.values, scopes, colls, rows, schema)
    finally:
        consumer.close()
    if rows:
        yield _to_batch(rows, colls, schema)


def _collection_names(manifest) -> tuple[dict[int, str], dict[int, tuple[str | None, str]]]:
    """The names a task starts with, from the node's manifest (None: a node without
    collections): scopes {sid: name} and collections {cid: (scope, collection)}."""
    scopes: dict[int, str] = {0: "_default"}
    colls: dict[int, tuple[str | None, str]] = {0: ("_default", "_default")}
    if manifest is not None:
        for sc in manifest.scopes:
            scopes[sc.uid] = sc.name
            for c in sc.collections:
                colls[c.uid] = (sc.name, c.name)
    return scopes, colls


def _resume_at_rollback(info):
    """Resume from the node's rollback seqno itself, on the history the node shares with
    the checkpoint (the newest failover entry at or below it)."""
    return info.before.moved_to(info.rollback_seqno)


def _start_positions(plan: dict[int, tuple[dict, dict]],
                     logs: dict[int, Any]) -> dict[int, tuple[Any, int]]:
    """{vb: (start Position, end seqno)} from the offsets' entries and the failover logs."""
    from dcptool.client.position import Position

    streams = {}
    for vb, (s, e) in plan.items():
        log = tuple((int(u), int(q)) for u, q in logs.get(vb, ()))
        ss, se = min(s["ss"], s["seq"]), max(s["se"], s["seq"])
        streams[vb] = (Position(s["uuid"], s["seq"], ss, se, log), e["seq"])
    return streams


def _event_batches(consumer, ends: dict[int, int], values: bool, scopes: dict[int, str],
                   colls: dict[int, tuple[str | None, str]], rows: list[tuple],
                   schema) -> Iterator[Any]:
    """Arrow batches of the consumer's events: one row per item at or below its vbucket's
    end seqno and per rollback, gathered in `rows` (what is left there at the end is the
    caller's last batch); system events name the collections created meanwhile."""
    from dcptool.client.events import (
        DELETION, EV_CAS, EV_DATATYPE, EV_EXPIRY, EV_FLAGS, EV_KEY, EV_KIND, EV_REV_SEQNO,
        EV_ROLLBACK_INFO, EV_SEQNO, EV_SYSTEM_EVENT, EV_VALUE, EV_VBUCKET, EXPIRATION, MUTATION,
        ROLLBACK, SYSTEM_EVENT)
    from dcptool.protocol.collections import EVENT_BEGIN_COLLECTION, EVENT_CREATE_SCOPE

    names = {MUTATION: "mutation", DELETION: "deletion", EXPIRATION: "expiration"}
    for events in consumer.batches(tick=1.0):
        for ev in events:
            kind = ev[EV_KIND]
            if kind == MUTATION or kind == DELETION or kind == EXPIRATION:
                vb = ev[EV_VBUCKET]
                if ev[EV_SEQNO] > ends[vb]:
                    continue  # past this batch's end: the next batch reads it
                if kind == MUTATION:
                    rows.append((vb, "mutation", ev[EV_SEQNO], ev[EV_REV_SEQNO], ev[EV_CAS],
                                 ev[EV_FLAGS], ev[EV_EXPIRY], ev[EV_DATATYPE],
                                 bytes(ev[EV_KEY]), bytes(ev[EV_VALUE]) if values else None,
                                 False, None))
                else:  # EV_EXPIRY holds the delete time
                    rows.append((vb, names[kind], ev[EV_SEQNO], ev[EV_REV_SEQNO], ev[EV_CAS],
                                 None, None, ev[EV_DATATYPE], bytes(ev[EV_KEY]),
                                 bytes(ev[EV_VALUE]) if values else None, True,
                                 ev[EV_EXPIRY]))
            elif kind == SYSTEM_EVENT:  # a collection created later: its name
                sev = ev[EV_SYSTEM_EVENT]
                if sev.event == EVENT_CREATE_SCOPE and sev.name:
                    scopes[sev.scope_id] = sev.name
                elif sev.event == EVENT_BEGIN_COLLECTION and sev.collection_id is not None:
                    colls[sev.collection_id] = (scopes.get(sev.scope_id), sev.name)
            elif kind == ROLLBACK:
                info = ev[EV_ROLLBACK_INFO]
                rows.append((ev[EV_VBUCKET], "rollback", info.after.seqno, None, None, None, None,
                             None, None, None, None, None))
        if len(rows) >= BATCH_ROWS:
            batch = _to_batch(rows, colls, schema)
            rows.clear()
            yield batch


def _to_batch(rows: list[tuple], colls: dict[int, tuple[str | None, str]], schema) -> Any:
    """One Arrow RecordBatch of `COLUMNS` from event rows (the twelve columns up to
    delete_time); the key is split into its collection's columns here, once per row, not
    in the event loop."""
    import pyarrow as pa
    from dcptool.protocol.collections import split_doc_key

    n = len(rows)
    cols = [list(map(itemgetter(i), rows)) for i in range(12)]
    kcols = []
    for k in cols[8]:
        if k is None:
            kcols.append((None, None, None, None))
            continue
        cid, plain = split_doc_key(k) if k[:1] != b"\x00" else (0, k[1:])
        sc, co = colls.get(cid) or (None, format(cid, "x"))
        kcols.append((plain, sc, co, cid))
    cols[8] = [c[0] for c in kcols]
    out = pa.RecordBatch.from_arrays([
        pa.array(cols[0], pa.int32()), pa.array(cols[1], pa.string()),
        pa.array(cols[2], pa.int64()), pa.array(cols[3], pa.int64()),
        pa.array([c if c is None or c < 1 << 63 else c - (1 << 64) for c in cols[4]],
                 pa.int64()),
        pa.array(cols[5], pa.int64()), pa.array(cols[6], pa.int64()),
        pa.array(cols[7], pa.int32()),
        pa.array([k if k is None else k.decode("utf-8", "replace") for k in cols[8]],
                 pa.string()),
        pa.array(cols[9], pa.binary()), pa.array(cols[10], pa.bool_()),
        pa.array(cols[11], pa.int64()),
        pa.array([c[1] for c in kcols], pa.string()),
        pa.array([c[2] for c in kcols], pa.string()),
        pa.array([c[3] for c in kcols], pa.int64()),
    ], schema=schema)
    assert out.num_rows == n
    return out


try:
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
    from pyspark.sql.streaming.datasource import ReadMaxRows, SupportsTriggerAvailableNow
except ImportError:  # pragma: no cover
    DataSource = DataSourceStreamReader = SupportsTriggerAvailableNow = object  # type: ignore
    InputPartition = ReadMaxRows = None  # type: ignore


class DcpStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc]
    def __init__(self, options: dict[str, str]):
        self.cfg = parse_options(dict(options))
        self.target: dict[int, dict[str, int]] | None = None
        self.batch_no = 0

    def _latest(self) -> dict[int, dict[str, int]]:
        if self.cfg["positions"]:
            return cluster_positions(self.cfg["opts"], self.cfg["vbuckets"])
        return node_positions(self.cfg["opts"], self.cfg["vbuckets"])

    def initialOffset(self) -> dict:
        if self.cfg["start_offset"] is not None:
            return dict(sorted(self.cfg["start_offset"].items(), key=lambda kv: int(kv[0])))
        latest = self._latest()
        if self.cfg["start"] == "now":
            return {str(vb): latest[vb] for vb in sorted(latest)}
        return {str(vb): _entry(0, 0) for vb in sorted(latest)}

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self._latest()

    def getDefaultReadLimit(self):
        if self.cfg["max_records"] and ReadMaxRows is not None:
            return ReadMaxRows(self.cfg["max_records"])
        return super().getDefaultReadLimit()

    def latestOffset(self, start: dict, limit=None) -> dict:
        if self.cfg["positions"] and self.target is None:
            try:
                latest = self._latest()
            except Exception:  # noqa: BLE001 - the node restarts, the network drops: no
                return start  # batch now; the next trigger asks again (the query lives)
        else:
            latest = self.target if self.target is not None else self._latest()
        cap = None
        if ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
            cap = limit.max_rows
        if self.target is not None:
            # up to the frozen target; a vbucket already there stays where it is
            latest = {vb: e for vb, e in latest.items()
                      if str(vb) not in start or _moved(start[str(vb)], e)}
        return plan_end(start, latest, cap)

    def partitions(self, start: dict, end: dict):
        from .runtime import plan_groups

        todo = [k for k in end if start.get(k) != end[k]]
        if not todo:
            return []
        self.batch_no += 1
        if self.cfg["positions"]:  # the whole range in one small task: no items
            return [InputPartition(StreamPartition(
                self.cfg["opts"], f"dcptool-stream:{os.getpid()}:{self.batch_no}",
                {int(k): (start.get(k) or _entry(0, 0), end[k]) for k in end}, False))]
        out = []
        for i, group in enumerate(plan_groups([int(k) for k in todo], self.cfg["partitions"])):
            out.append(InputPartition(StreamPartition(
                self.cfg["opts"], f"dcptool-stream:{os.getpid()}:{self.batch_no}:{i}",
                {vb: (start.get(str(vb)) or _entry(0, 0), end[str(vb)]) for vb in group},
                self.cfg["values"])))
        return out

    def read(self, partition):
        if self.cfg["positions"]:
            return position_rows(partition.value)
        return stream_task(partition.value)

    def commit(self, end: dict) -> None:
        pass


class DcpStreamDataSource(DataSource):  # type: ignore[misc]
    """`spark.readStream.format("dcptool-stream")`; see the module docstring."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        positions = str({str(k).lower(): v for k, v in self.options.items()}
                        .get("positions", "false")).lower() in TRUE_WORDS
        return POSITIONS_DDL if positions else SCHEMA_DDL

    def streamReader(self, schema):
        return DcpStreamReader(self.options)
