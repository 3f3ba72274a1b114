"""`dcptool tail`: follow a bucket's changes over DCP, like `tail -f`."""
from __future__ import annotations

import base64
import json
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.text import Text

from dcptool.cli.app import app
from dcptool.cli.connopts import ConnArgs, connection_options
from dcptool.cli.manual import manual
from dcptool.cli.output import console, is_verbose
from dcptool.client import (
    DELETION,
    EXPIRATION,
    MUTATION,
    ROLLBACK,
    SEQNO_ADVANCED,
    SNAPSHOT,
    STREAM_END,
    ZERO,
    SessionConfig,
    SessionState,
    get_vbucket_seqnos,
    latest_positions,
    load_state,
    save_state,
)
from dcptool.client.events import (EV_ADVANCED_SEQNO, EV_END_REASON, EV_END_RETRYING, EV_KEY,
                                   EV_KIND, EV_ROLLBACK_INFO, EV_ROLLBACK_SEQNO, EV_SNAP_END,
                                   EV_SNAP_FLAGS, EV_SNAP_START, EV_SYSTEM_EVENT, EV_VBUCKET,
                                   SYSTEM_EVENT)
from dcptool.client.options import ConnOptions
from dcptool.client.privileges import DCP_PRODUCER, WATERMARK_WRITE, check_privileges
from dcptool.client.tracker import PositionTracker
from dcptool.client.vbspec import parse_vbuckets
from dcptool.errors import UsageError
from dcptool.protocol.collections import (
    EVENT_BEGIN_COLLECTION,
    EVENT_CREATE_SCOPE,
    CollectionsError,
    Manifest,
    StreamFilter,
    SystemEvent,
    hex_id,
    split_doc_key,
)
from dcptool.protocol.constants import SnapshotFlag, StreamEndReason


manual(
    "tail",
    exit_codes=(4,),
    exit_note="0 on Ctrl-C or SIGTERM, after --state is saved. 4 with --fail-on-rollback when the "
              "node asks for a rollback. 1 when the user lacks the DcpProducer privilege (or "
              "WatermarkWrite with --watermark), before anything streams, or loses it while "
              "streaming. 2 when --vbuckets names vbuckets the bucket does not have.",
    files=(
        ("STATEFILE", "Positions saved by --state (JSON), read back by --from or --state on the "
                      "next run."),
    ),
    see_also=("failover-log", "node", "watermark"),
)


_KIND = {MUTATION: "mutation", DELETION: "deletion", EXPIRATION: "expiration"}
_SAVE_EVERY = 1.0


def _text_field(out: dict, name: str, raw) -> None:
    raw = bytes(raw)
    try:
        out[name] = raw.decode("utf-8")
    except UnicodeDecodeError:
        out[name] = base64.b64encode(raw).decode("ascii")
        out[f"{name}_encoding"] = "base64"


class Names:
    """Scope and collection names by id: the node's manifest when tail started, then the
    system events of the streams (a collection created later). An id neither names is
    shown as its hex id."""

    def __init__(self, manifest: Manifest | None) -> None:
        self.scopes: dict[int, str] = {0: "_default"}
        self.collections: dict[int, tuple[str, str]] = {0: ("_default", "_default")}
        if manifest is not None:
            for sc in manifest.scopes:
                self.scopes[sc.uid] = sc.name
                for c in sc.collections:
                    self.collections[c.uid] = (sc.name, c.name)

    def scope(self, sid: int) -> str:
        return self.scopes.get(sid) or hex_id(sid)

    def collection(self, cid: int) -> tuple[str, str]:
        return self.collections.get(cid) or ("?", hex_id(cid))

    def see(self, ev: SystemEvent) -> None:
        if ev.event == EVENT_CREATE_SCOPE and ev.name:
            self.scopes[ev.scope_id] = ev.name
        elif ev.event == EVENT_BEGIN_COLLECTION and ev.name and ev.collection_id is not None:
            self.collections[ev.collection_id] = (self.scope(ev.scope_id), ev.name)


def split_key(key, names: Names | None) -> tuple[bytes, str | None, str | None, int | None]:
    """(key without prefix, scope, collection, collection id) of a record's key; a key of a
    session without collections (names None) is shown as it is."""
    key = bytes(key)
    if names is None:
        return key, None, None, None
    try:
        cid, plain = split_doc_key(key)
    except CollectionsError:
        return key, None, None, None
    scope, coll = names.collection(cid)
    return plain, scope, coll, cid


def record_json(ev, keys_only: bool, names: Names | None = None) -> dict:
    """One record as --json prints it; with `names` (a collections session) the key is
    shown without its collection prefix, with `scope`, `collection` and `collection_id`."""
    kind, vb, seqno, rev, cas, flags, expiry, datatype, key, value = ev
    out = {"type": _KIND[kind], "vbucket": vb, "seqno": seqno, "rev_seqno": rev, "cas": cas,
           "flags": flags, "expiry": expiry if kind == MUTATION else 0, "datatype": datatype}
    if kind != MUTATION:
        out["delete_time"] = expiry
    key, scope, coll, cid = split_key(key, names)
    if scope is not None:
        out["scope"] = scope
        out["collection"] = coll
        out["collection_id"] = hex_id(cid)
    _text_field(out, "key", key)
    if not keys_only:
        _text_field(out, "value", value)
    return out


def system_event_json(vb: int, sev: SystemEvent, names: Names | None) -> dict:
    """A system event as --json prints it: "event" says which (create-collection,
    drop-collection, create-scope, drop-scope, modify-collection), with the names."""
    out = {"type": "system_event", "vbucket": vb, **sev.to_json()}
    if names is not None:
        out["scope"] = names.scope(sev.scope_id)
        if sev.collection_id is not None:
            out["collection"] = sev.name or names.collection(sev.collection_id)[1]
    return out


def event_json(ev, names: Names | None = None) -> dict | None:
    kind = ev[EV_KIND]
    if kind == SYSTEM_EVENT:
        return system_event_json(ev[EV_VBUCKET], ev[EV_SYSTEM_EVENT], names)
    if kind == SNAPSHOT:
        return {"type": "snapshot", "vbucket": ev[EV_VBUCKET], "start": ev[EV_SNAP_START],
                "end": ev[EV_SNAP_END], "flags": ev[EV_SNAP_FLAGS],
                "disk": bool(ev[EV_SNAP_FLAGS] & SnapshotFlag.DISK)}
    if kind == ROLLBACK:
        info = ev[EV_ROLLBACK_INFO]
        return {"type": "rollback", "vbucket": ev[EV_VBUCKET],
                "rollback_seqno": ev[EV_ROLLBACK_SEQNO],
                "from_seqno": info.before.seqno, "from_uuid": info.before.uuid,
                "to_seqno": info.after.seqno, "to_uuid": info.after.uuid}
    if kind == STREAM_END:
        return {"type": "stream_end", "vbucket": ev[EV_VBUCKET],
                "reason": _reason(ev[EV_END_REASON]), "retrying": ev[EV_END_RETRYING]}
    if kind == SEQNO_ADVANCED:
        return {"type": "seqno_advanced", "vbucket": ev[EV_VBUCKET],
                "seqno": ev[EV_ADVANCED_SEQNO]}
    return None


def _reason(code: int) -> str:
    try:
        return StreamEndReason(code).name.lower()
    except ValueError:
        return str(code)


class _Printer:
    def __init__(self, as_json: bool, keys_only: bool, names: Names | None = None) -> None:
        self.as_json = as_json
        self.keys_only = keys_only
        self.names = names
        self.out = sys.stdout
        self.con = None if as_json else console()

    def record(self, ev) -> None:
        if self.as_json:
            self.out.write(json.dumps(record_json(ev, self.keys_only, self.names)) + "\n")
            return
        kind, vb, seqno, rev, cas, flags, expiry, datatype, key, value = ev
        name = _KIND[kind]
        style = {"mutation": "green", "deletion": "red", "expiration": "yellow"}[name]
        key, scope, coll, _cid = split_key(key, self.names)
        where = "" if scope is None else f"{scope}.{coll} "
        line = Text.assemble((f"vb {vb:<4} ", "dim"), (f"#{seqno:<8} ", "cyan"),
                             (f"{name:<10} ", style), (where, "blue"),
                             (key.decode("utf-8", "replace"), "bold"))
        details = f"  rev {rev} cas {cas}"
        if kind == MUTATION:
            details += f" flags 0x{flags:x}" + (f" expiry {expiry}" if expiry else "")
        elif expiry:
            details += f" deleted at {expiry}"
        line.append(details, "dim")
        if kind == MUTATION and not self.keys_only:
            raw = bytes(value)
            try:
                text = raw.decode("utf-8")
                preview = text if len(text) <= 80 else text[:77] + "..."
                line.append("  " + preview.replace("\n", " "))
            except UnicodeDecodeError:
                line.append(f"  <{len(raw)} bytes binary>", "magenta")
        self.con.print(line, soft_wrap=True)

    def event(self, ev) -> None:
        if ev[EV_KIND] == SYSTEM_EVENT and self.names is not None:
            self.names.see(ev[EV_SYSTEM_EVENT])
        doc = event_json(ev, self.names)
        if doc is None:
            return
        if self.as_json:
            self.out.write(json.dumps(doc) + "\n")
            return
        kind, vb = ev[EV_KIND], ev[EV_VBUCKET]
        if kind == SNAPSHOT:
            text = Text.assemble((f"vb {vb:<4} ", "dim"),
                                 (f"snapshot {doc['start']}-{doc['end']}"
                                  + (" (disk)" if doc["disk"] else ""), "dim"))
        elif kind == ROLLBACK:
            text = Text(f"vb {vb:<4} rollback: the node asked to roll back to seqno "
                        f"{doc['rollback_seqno']}; "
                        f"continuing from seqno {doc['to_seqno']} (was {doc['from_seqno']})",
                        "bold red")
        elif kind == STREAM_END:
            again = ", asking again" if doc["retrying"] else ""
            text = Text(f"vb {vb:<4} stream ended: {doc['reason']}{again}", "yellow")
        elif kind == SYSTEM_EVENT:
            sev = ev[EV_SYSTEM_EVENT]
            what = doc["scope"] if "collection" not in doc else f"{doc['scope']}.{doc['collection']}"
            ident = (f"scope {doc['scope_id']}" if sev.collection_id is None
                     else f"collection {doc['collection_id']}")
            text = Text.assemble((f"vb {vb:<4} ", "dim"), (f"#{sev.seqno:<8} ", "cyan"),
                                 (f"{sev.kind} ", "magenta"), (what, "bold"),
                                 (f"  ({ident}, manifest uid {doc['manifest_uid']})", "dim"))
        else:
            text = Text(json.dumps(doc), "dim")
        self.con.print(text, soft_wrap=True)

    def flush(self) -> None:
        try:
            self.out.flush()
        except BrokenPipeError:
            raise


def collection_filter(names: list[str], manifest: Manifest | None,
                      bucket: str) -> StreamFilter | None:
    """The stream filter of `--collection scope.collection` options (None: all). Unknown
    names are a UsageError; a node without collections has only _default._default."""
    if not names:
        return None
    known = manifest or Manifest()
    ids = set()
    for text in names:
        for name in (p.strip() for p in text.split(",") if p.strip()):
            scope, dot, coll = name.partition(".")
            if not dot or not scope or not coll or "." in coll:
                raise UsageError(f"--collection: {name!r} is not scope.collection")
            c = known.collection(scope, coll)
            if c is None:
                raise UsageError(f"--collection: collection {scope}.{coll} does not exist in "
                                 f"bucket {bucket}"
                                 + (" (the node has no collections)" if manifest is None else ""))
            ids.add(c.uid)
    return StreamFilter(collections=frozenset(ids))


def _watermark_reporter(opts: ConnOptions, state: Path, name: Optional[str], interval: float,
                        ttl: Optional[float]):
    """The reporter of `tail --watermark`: one row per state file (instance: a digest of
    the host and the state file's absolute path, stable across runs)."""
    import hashlib
    import socket

    from dcptool.cli.output import note
    from dcptool.client.watermark import WatermarkReporter

    where = f"{socket.gethostname()}:{state.absolute()}"
    instance = hashlib.sha256(where.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    name = name or ("dcptool-tail:" + state.name)[:200]
    return WatermarkReporter(opts.connect, name, instance, ttl=ttl, interval=interval,
                             meta={"state": str(state.absolute()),
                                   "host": socket.gethostname()},
                             notice=lambda m: note(f"dcptool tail: {m}"))


@app.command("tail")
@connection_options(timeout=True, snappy=True)
def tail(
    from_: Annotated[Optional[str], typer.Option(
        "--from", metavar="beginning|now|STATEFILE", help="Where to start: 'beginning', "
                                                          "'now' (default), or a state file "
                                                          "saved by --state. With --state FILE "
                                                          "and no --from, resumes from FILE "
                                                          "when it exists.")] = None,
    vbuckets: Annotated[Optional[str], typer.Option(
        "--vbuckets", metavar="LIST", help="vbuckets to follow, e.g. 0-15,512 (default: "
                                           "all active).")] = None,
    keys_only: Annotated[bool, typer.Option(
        "--keys-only", help="Do not fetch document values.")] = False,
    filter_: Annotated[Optional[str], typer.Option(
        "--filter", metavar="REGEX", help="Only show documents whose key matches REGEX.")] = None,
    state: Annotated[Optional[Path], typer.Option(
        "--state", metavar="FILE", help="Save positions to FILE as it goes and on exit.")] = None,
    until_idle: Annotated[Optional[float], typer.Option(
        "--until-idle", metavar="SECONDS", help="Stop after SECONDS without any change.")] = None,
    count: Annotated[Optional[int], typer.Option(
        "--count", metavar="N", help="Stop after printing N documents.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per event.")] = False,
    noop_interval: Annotated[float, typer.Option(
        "--noop-interval", metavar="SECONDS", help="Ask the node for a NOOP this often "
                                                   "when idle.")] = 60.0,
    fail_on_rollback: Annotated[bool, typer.Option(
        "--fail-on-rollback", help="Stop with an error instead of rolling back.")] = False,
    collection: Annotated[Optional[list[str]], typer.Option(
        "--collection", metavar="SCOPE.COLLECTION", help="Only this collection (repeatable; "
                                                         "the node streams only those).")] = None,
    watermark: Annotated[bool, typer.Option(
        "--watermark", help="Register the positions saved in --state as a high "
                            "watermark with the node, at most once per --watermark-interval, so "
                            "its purger keeps the deletions not read yet (see 'dcptool "
                            "watermark').")] = False,
    watermark_name: Annotated[Optional[str], typer.Option(
        "--watermark-name", metavar="NAME", help="Client name of the watermark (default "
                                                 "dcptool-tail:STATE-FILE-NAME).")] = None,
    watermark_interval: Annotated[float, typer.Option(
        "--watermark-interval", metavar="SECONDS", help="Register at most this often.")] = 60.0,
    watermark_ttl: Annotated[str, typer.Option(
        "--watermark-ttl", metavar="DURATION", help="The watermark expires unless "
                                                    "registered again within this time.")] = "7d",
    verbose: Annotated[bool, typer.Option(
        "-v", "--verbose", help="Print a summary on stderr at the end (as does dcptool "
                                "--verbose tail).")] = False,
    conn_args: ConnArgs = None,
) -> None:
    """Follow changes as they happen; Ctrl-C saves --state and exits 0.

    Prints one line (or, with --json, one JSON object) per mutation, deletion and
    expiration, plus snapshot markers, rollbacks, stream ends and the creation and drop
    of scopes and collections. Each document is shown with its scope and collection
    (--json: "scope", "collection", "collection_id"); --filter matches the key alone.
    Values are shown decompressed (a value the node sent snappy-compressed, e.g. with
    --snappy, too).

    Example: dcptool tail -c couchbase://127.0.0.1 --from beginning --until-idle 2 --json
    Example: dcptool tail --state tail.state --keys-only

    Example: dcptool tail -b travel --collection inventory.hotels --from beginning
    """
    vbs = parse_vbuckets(vbuckets)
    key_re = _key_filter(filter_)
    _check_options(until_idle, count, noop_interval, watermark, state, watermark_interval)
    wm_ttl = None
    if watermark:
        from dcptool.cli.options import parse_ttl

        wm_ttl = parse_ttl(watermark_ttl, "--watermark-ttl")
    start, saved = _start_point(from_, state)
    opts = conn_args.options()
    if saved is not None and saved.bucket and saved.bucket != opts.bucket:
        raise UsageError(f"state file {start} holds positions of bucket '{saved.bucket}', "
                         f"not '{opts.bucket}'")
    check_privileges(opts, "stream from", DCP_PRODUCER,
                     *([WATERMARK_WRITE] if watermark else []))
    consumer, positions, manifest = _open_streams(
        opts, start, saved, vbs, collection or [], keys_only=keys_only,
        noop_interval=noop_interval, fail_on_rollback=fail_on_rollback)

    reporter = None
    if watermark:
        reporter = _watermark_reporter(opts, state, watermark_name, watermark_interval, wm_ttl)
    run = _Follower(consumer, positions, _Printer(as_json, keys_only, Names(manifest)),
                    opts, state, reporter)
    tick = 0.5 if until_idle is None else max(0.05, min(0.5, until_idle / 4))
    run.follow(positions, tick, key_re, count, until_idle)
    if verbose or is_verbose():
        run.summary()


def _key_filter(filter_: Optional[str]) -> re.Pattern | None:
    """--filter compiled (it matches the key's bytes)."""
    try:
        return re.compile(filter_.encode("utf-8")) if filter_ else None
    except re.error as exc:
        raise UsageError(f"--filter: bad regular expression: {exc}") from None


def _check_options(until_idle: Optional[float], count: Optional[int], noop_interval: float,
                   watermark: bool, state: Optional[Path], watermark_interval: float) -> None:
    """UsageError for an option value `tail` cannot follow with."""
    if until_idle is not None and until_idle <= 0:
        raise UsageError("--until-idle must be positive")
    if count is not None and count <= 0:
        raise UsageError("--count must be positive")
    if noop_interval <= 0:
        raise UsageError("--noop-interval must be positive")
    if watermark and state is None:
        raise UsageError("--watermark needs --state FILE (the watermark is what the state "
                         "file holds)")
    if watermark_interval <= 0:
        raise UsageError("--watermark-interval must be positive")


def _start_point(from_: Optional[str], state: Optional[Path]) -> tuple[str, SessionState | None]:
    """Where to start ('beginning', 'now' or a state file's name) and, for a state file,
    the positions it holds. Without --from: the --state file when it exists, else now."""
    start = from_
    if start is None:
        start = str(state) if state is not None and state.exists() else "now"
    saved = None
    if start not in ("beginning", "now"):
        saved = load_state(start)
    return start, saved


def _open_streams(opts: ConnOptions, start: str, saved: SessionState | None,
                  vbs: list[int] | None, collections: list[str], *, keys_only: bool,
                  noop_interval: float, fail_on_rollback: bool):
    """(consumer, {vb: start position}, the bucket's manifest or None): connect, check
    --collection and --vbuckets against the bucket, and set up a consumer that follows
    each vbucket from its active node. Nothing streams yet."""
    conn = opts.connect(collections=True)
    try:
        manifest = None
        if conn.collections:
            from dcptool.client.ops import get_collections_manifest

            manifest = get_collections_manifest(conn, missing_ok=True)
        sfilter = collection_filter(collections, manifest, opts.bucket)
        if vbs is not None:  # vbuckets the bucket does not have would follow nothing
            from dcptool.client.vbspec import check_vbuckets
            from dcptool.pipeline.nodeinfo import vbucket_count

            check_vbuckets(vbs, vbucket_count(conn))
        positions = _start_positions(conn, start, saved, vbs)
        config = SessionConfig(name=f"dcptool-tail:{os.getpid()}:{int(time.time())}",
                               no_value=keys_only, consistent=False, noop_interval=noop_interval,
                               fail_on_rollback=fail_on_rollback, collections=True,
                               stream_filter=sfilter)
        from dcptool.client.topology import cluster_consumer

        # a member of a cluster: each vbucket from its active node, following the map
        consumer = cluster_consumer(opts, conn, config)
    except BaseException:
        conn.close()
        raise
    return consumer, positions, manifest


def _start_positions(conn, start: str, saved: SessionState | None, vbs: list[int] | None) -> dict:
    """{vb: position to stream from}: zero for every (chosen) vbucket from the beginning,
    the node's current positions now, or the state file's."""
    if start == "beginning":
        from dcptool.client.topology import all_vbuckets

        wanted = vbs if vbs is not None else (all_vbuckets(conn)
                                             or sorted(get_vbucket_seqnos(conn, state=1)))
        positions = {vb: ZERO for vb in wanted}
    elif start == "now":
        positions = latest_positions(conn, vbs)
    else:
        wanted = vbs if vbs is not None else sorted(saved.positions)
        positions = {vb: saved.positions.get(vb, ZERO) for vb in wanted}
    if not positions:
        raise UsageError("no vbuckets to follow")
    return positions


class _Follower:
    """One `tail` run once its streams are set up: print the events as they come, track
    each vbucket's position, save the positions to --state (and renew the watermark) at
    most once a second and at the end, stop on Ctrl-C/SIGTERM between two events."""

    def __init__(self, consumer, positions: dict, printer: _Printer, opts: ConnOptions,
                 state: Optional[Path], reporter) -> None:
        self.consumer = consumer
        self.printer = printer
        self.opts = opts
        self.state = state
        self.reporter = reporter
        self.tracker = PositionTracker(positions)
        self.printed = 0
        self.records = 0
        self.last_save = 0.0
        self.dirty = False
        self.interrupted: list[int] = []
        self.last_change = time.monotonic()

    def save(self) -> None:
        if self.state is not None:
            saved_positions = self.tracker.positions(self.consumer)
            save_state(self.state, SessionState(saved_positions, self.opts.bucket,
                                                {"node": self.opts.address}))
            if self.reporter is not None and self.reporter.due():
                # only what the state file holds: a resume starts there
                self.reporter.report({vb: p.seqno for vb, p in saved_positions.items()})
        self.dirty = False
        self.last_save = time.monotonic()

    def follow(self, positions: dict, tick: float, key_re: re.Pattern | None,
               count: Optional[int], until_idle: Optional[float]) -> None:
        """Stream until --count, --until-idle, Ctrl-C or SIGTERM; save and close at the end
        (on an error too)."""
        consumer = self.consumer

        def on_signal(signum, frame):
            # Ctrl-C (or SIGTERM) stops between two events, so what was printed and what
            # the state file says always agree; the read in progress returns within one tick
            self.interrupted.append(signum)

        old_handlers = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            consumer.start()
            consumer.add_streams(positions)
            self.save()
            self._print_events(tick, key_re, count, until_idle)
        except KeyboardInterrupt:
            pass
        except BrokenPipeError:
            self.save()
            consumer.close()
            raise
        except BaseException:
            try:
                self.save()
            finally:
                consumer.close()
            raise
        finally:
            for sig, handler in old_handlers.items():
                signal.signal(sig, handler)
        try:
            self.save()
        finally:
            consumer.close()
            if self.reporter is not None:
                self.reporter.close()

    def _print_events(self, tick: float, key_re: re.Pattern | None, count: Optional[int],
                      until_idle: Optional[float]) -> None:
        """The event loop: one pass per batch of events the consumer returns."""
        printer, tracker, interrupted = self.printer, self.tracker, self.interrupted
        last_change = self.last_change
        stop = False
        for events in self.consumer.batches(tick):
            now = time.monotonic()
            for ev in events:
                kind = ev[EV_KIND]
                if kind in _KIND:
                    self.records += 1
                    last_change = now
                    # --filter matches the key without its collection prefix
                    if key_re is None or key_re.search(split_key(ev[EV_KEY], printer.names)[0]):
                        printer.record(ev)
                        self.printed += 1
                    tracker.see(ev)
                    self.dirty = True
                    if count is not None and self.printed >= count:
                        stop = True
                        break
                else:
                    printer.event(ev)
                    tracker.see(ev)
                    self.dirty = True
                if interrupted:
                    break
            printer.flush()
            if stop or interrupted:
                break
            if until_idle is not None and now - last_change >= until_idle:
                break
            if self.dirty and now - self.last_save >= _SAVE_EVERY:
                self.save()
            elif self.reporter is not None and self.reporter.due():
                self.save()  # renew the watermark while idle too

    def summary(self) -> None:
        """The --verbose line on stderr."""
        session = self.consumer.session
        inflated = getattr(session, "values_decompressed", 0)
        print(f"dcptool tail: {self.printed} documents shown ({self.records} changes received), "
              f"{session.noops_answered} noops answered"
              + (f", {inflated} values arrived snappy-compressed" if inflated else "")
              + (f", state saved to {self.state}" if self.state is not None else ""),
              file=sys.stderr)
