"""`dcptool watermark`: register, list and remove high watermarks on a node.

A high watermark tells the node's tombstone purger how far a client has read each vbucket;
the purger never purges a deletion above the lowest live watermark, so a slow client
(a weekly backup, a remote replica) does not miss deletions (see
docs/protocol-extensions.md). `dcptool backup` registers its archive's watermark after
each backup by itself; these commands are for other clients and for looking.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from dcptool.cli.app import app
from dcptool.cli.connopts import ConnArgs, connection_options
from dcptool.cli.manual import manual
from dcptool.cli.options import parse_ttl
from dcptool.cli.output import console, plural, print_json, print_table, rough_duration, table_console
from dcptool.client.privileges import WATERMARK_READ, WATERMARK_WRITE, check_privileges
from dcptool.errors import DcptoolError, UsageError


manual(
    "watermark",
    exit_note="1 when the user lacks the privilege: WatermarkRead to list, WatermarkWrite to "
              "register or remove.",
    see_also=("backup", "tail", "node"),
)


watermark_app = typer.Typer(
    name="watermark",
    help="""Register, list and remove high watermarks: how far a client has read each
    vbucket, so the node's tombstone purger keeps the deletions it has not seen yet.

    Example: dcptool watermark list -c 127.0.0.1:11210
    """,
    no_args_is_help=True,
)
app.add_typer(watermark_app, name="watermark")

JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON.")]
DEFAULT_TTL = "7d"
DEFAULT_INSTANCE = "default"


def read_seqnos(path: str) -> dict[int, int]:
    """{vbucket: seqno} from a file ('-': standard input): a JSON object of seqnos
    ({"0": 120, ...}), the same under "vbuckets", or a `dcptool tail --state` file."""
    try:
        raw = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as exc:
        raise UsageError(f"--seqnos: cannot read {path}: {exc.strerror or exc}") from None
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise UsageError(f"--seqnos: {path} is not JSON: {exc}") from None
    if isinstance(doc, dict) and doc.get("format") == "dcptool-session":
        from dcptool.client.state import SessionState

        return {vb: p.seqno for vb, p in SessionState.from_dict(doc, path).positions.items()}
    if isinstance(doc, dict) and isinstance(doc.get("vbuckets"), dict):
        doc = doc["vbuckets"]
    if not isinstance(doc, dict) or not doc:
        raise UsageError(f"--seqnos: {path} must hold a JSON object {{\"vbucket\": seqno, ...}}")
    out: dict[int, int] = {}
    for k, v in doc.items():
        try:
            vb = int(k)
        except ValueError:
            raise UsageError(f"--seqnos: {path}: {k!r} is not a vbucket number") from None
        if isinstance(v, dict):
            v = v.get("seqno")
        if isinstance(v, bool) or not isinstance(v, int) or v < 0 or vb < 0:
            raise UsageError(f"--seqnos: {path}: vbucket {k} needs a seqno (a whole number >= 0)")
        out[vb] = v
    return out


def _archive_identity(archive: Path) -> tuple[str, str, dict[int, int], dict[str, Any]]:
    from dcptool.pipeline.backup import archive_watermark

    return archive_watermark(archive)


def _is_cluster(archive: Path) -> bool:
    from dcptool.archive.cluster import archive_kind

    return archive_kind(archive) == "cluster"


def _cluster_buckets(archive: Path) -> list[tuple[str, Any]]:
    """[(bucket name, its bucket archive)] of a cluster archive."""
    from dcptool.archive.cluster import ClusterArchive
    from dcptool.cli.passphrase import passphrase_source

    cluster = ClusterArchive.open(archive, passphrase=passphrase_source())
    return [(b, cluster.open_bucket(b)) for b in cluster.bucket_names()]


def _register_cluster(archive: Path, conn_args: ConnArgs, ttl_s: float,
                      meta_doc: dict[str, Any], json_out: bool) -> None:
    """Each bucket archive's watermark, registered with the node's bucket of its name (as
    the backup of a cluster registers them): the node keeps a watermark table per bucket,
    and a connection works on the bucket it selected (SELECT_BUCKET)."""
    from dcptool.client.errors import UnknownBucketError
    from dcptool.client.watermark import register_watermark

    done: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    for bucket, barchive in _cluster_buckets(archive):
        a_name, a_instance, vbs, a_meta = _archive_identity(barchive)
        if not vbs:
            skipped[bucket] = "no backed-up vbucket yet"
            continue
        opts = conn_args.options(bucket=bucket)
        try:
            check_privileges(opts, f"register a high watermark in bucket {bucket} of",
                             WATERMARK_WRITE)
            with opts.connect() as conn:
                done[bucket] = register_watermark(conn, a_name, a_instance, vbs, ttl=ttl_s,
                                                  meta={**a_meta, **meta_doc})
        except UnknownBucketError:
            skipped[bucket] = f"{opts.address} has no bucket {bucket}"
    if not done and not skipped:
        raise UsageError(f"cluster archive {archive} holds no bucket archive yet")
    if json_out:
        print_json({"buckets": done, "skipped": skipped})
        return
    con = console()
    for bucket, answer in done.items():
        con.print(f"bucket {bucket}: {'renewed' if answer.get('replaced') else 'registered'} "
                  f"{answer.get('name')}/{answer.get('instance')}: {answer.get('vbuckets')} "
                  f"vbuckets, expires {_when(answer.get('expires_at'))}", markup=False)
    for bucket, why in skipped.items():
        con.print(f"bucket {bucket}: skipped: {why}", markup=False)


def _remove_cluster(archive: Path, conn_args: ConnArgs, json_out: bool) -> None:
    """Each bucket archive's watermark removed from the node's bucket of its name."""
    from dcptool.client.errors import UnknownBucketError
    from dcptool.client.watermark import WatermarkNotFound, remove_watermark

    removed: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    for bucket, barchive in _cluster_buckets(archive):
        a_name, a_instance, _vbs, _meta = _archive_identity(barchive)
        opts = conn_args.options(bucket=bucket)
        try:
            check_privileges(opts, f"remove a high watermark from bucket {bucket} of",
                             WATERMARK_WRITE)
            with opts.connect() as conn:
                removed.extend({**r, "bucket": bucket}
                               for r in remove_watermark(conn, a_name, a_instance))
        except UnknownBucketError:
            skipped[bucket] = f"{opts.address} has no bucket {bucket}"
        except WatermarkNotFound:
            skipped[bucket] = "no watermark registered"
    if json_out:
        print_json({"removed": removed, "skipped": skipped})
        return
    for r in removed:
        console().print(f"bucket {r['bucket']}: removed {r['name']}/{r['instance']}",
                        markup=False)
    for bucket, why in skipped.items():
        console().print(f"bucket {bucket}: skipped: {why}", markup=False)


def _when(t: float | None) -> str:
    if not t:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(t))


def _from_now(t: float | None, now: float) -> str:
    """`5m ago`, `in 1w`: a time of the node's as a person reads a table at a glance, to the
    nearest unit (a 7-day TTL just renewed expires `in 1w`, not `in 6d`)."""
    if not t:
        return "-"
    s = abs(t - now)
    half_unit = 0 if s < 120 else 30 if s < 7200 else 1800 if s < 2 * 86400 else 43200
    text = rough_duration(s + half_unit)
    return f"in {text}" if t > now else f"{text} ago"


@watermark_app.command("register")
@connection_options(timeout=True)
def register(
    name: Annotated[Optional[str], typer.Option(
        "--name", help="Client name (with --archive: derived from the archive).")] = None,
    instance: Annotated[Optional[str], typer.Option(
        "--instance", metavar="UUID",
        help="Client instance; a new registration of the same name and instance replaces the "
             f"old one (default: {DEFAULT_INSTANCE!r}, with --archive the archive's uuid).")] = None,
    seqnos: Annotated[Optional[str], typer.Option(
        "--seqnos", metavar="FILE",
        help="JSON file of {vbucket: seqno} (or a tail --state file; - for stdin).")] = None,
    archive: Annotated[Optional[Path], typer.Option(
        "--archive", metavar="ARCHIVE",
        help="Register how far this backup archive holds each vbucket.")] = None,
    ttl: Annotated[str, typer.Option(
        "--ttl", metavar="DURATION",
        help="The row expires unless registered again within this time.")] = DEFAULT_TTL,
    meta: Annotated[Optional[str], typer.Option(
        "--meta", metavar="JSON", help="A small JSON object stored with the row.")] = None,
    json_out: JsonOpt = False,
    conn_args: ConnArgs = None,
) -> None:
    """Register (or renew) a high watermark: the purger keeps every deletion above it.

    A cluster archive's --archive registers each bucket archive's watermark with the
    node's bucket of that name (buckets the node lacks are skipped).

    Example: dcptool watermark register -c 127.0.0.1 --archive /backups/default
    Example: dcptool watermark register -c 127.0.0.1 --archive /backups/cluster
    Example: dcptool watermark register -c 127.0.0.1 --name my-app --seqnos seqnos.json --ttl 1d
    """
    from dcptool.client.watermark import register_watermark

    if (seqnos is None) == (archive is None):
        raise UsageError("give exactly one of --seqnos FILE and --archive ARCHIVE")
    ttl_s = parse_ttl(ttl)
    meta_doc: dict[str, Any] = {}
    if meta is not None:
        try:
            meta_doc = json.loads(meta)
        except ValueError as exc:
            raise UsageError(f"--meta is not JSON: {exc}") from None
        if not isinstance(meta_doc, dict):
            raise UsageError("--meta must be a JSON object")
    if archive is not None and _is_cluster(archive):
        if name is not None or instance is not None:
            raise UsageError("--name and --instance come from each bucket's archive of a "
                             "cluster archive", hint="leave them out")
        _register_cluster(archive, conn_args, ttl_s, meta_doc, json_out)
        return
    if archive is not None:
        a_name, a_instance, vbs, a_meta = _archive_identity(archive)
        name = name or a_name
        instance = instance or a_instance
        meta_doc = {**a_meta, **meta_doc}
    else:
        vbs = read_seqnos(seqnos)  # type: ignore[arg-type]
        if not name:
            raise UsageError("--name is required with --seqnos")
    instance = instance or DEFAULT_INSTANCE
    if not vbs:
        raise UsageError(f"archive {archive} holds no backed-up vbucket yet")
    opts = conn_args.options()
    check_privileges(opts, "register a high watermark in", WATERMARK_WRITE)
    with opts.connect() as conn:
        answer = register_watermark(conn, name, instance, vbs, ttl=ttl_s, meta=meta_doc or None)
    if json_out:
        print_json(answer)
        return
    con = console()
    con.print(f"{'renewed' if answer.get('replaced') else 'registered'} {name}/{instance}: "
              f"{answer.get('vbuckets')} vbuckets, seqnos {min(vbs.values())}..{max(vbs.values())}, "
              f"expires {_when(answer.get('expires_at'))}")
    behind = answer.get("behind_purge_seqno") or {}
    if behind:
        err = console(stderr=True)
        vb0 = min(behind, key=int)
        err.print(f"dcptool: warning: the node already purged deletions above this watermark in "
                  f"{plural(len(behind), 'vbucket')} (vbucket {vb0}: watermark {vbs[int(vb0)]}, purge seqno "
                  f"{behind[vb0]}); a client resuming there is rolled back to seqno 0")


@watermark_app.command("list")
@connection_options(timeout=True)
def list_(
    name: Annotated[Optional[str], typer.Option("--name", help="Only this client.")] = None,
    json_out: JsonOpt = False,
    conn_args: ConnArgs = None,
) -> None:
    """List the node's high watermarks: client, instance, vbuckets, lowest and highest
    seqno, when reported and when it expires (how long ago, in how long, with --json the
    times), state (ok, expired or lost) and, per vbucket, how far each holds the purger
    back (old-enough tombstones it keeps, up to which seqno, how long).

    Example: dcptool watermark list -c 127.0.0.1:11210 --json
    """
    from dcptool.client.watermark import list_watermarks

    opts = conn_args.options()
    check_privileges(opts, "list the high watermarks of", WATERMARK_READ)
    with opts.connect() as conn:
        table = list_watermarks(conn, name)
    if json_out:
        print_json(table)
        return
    from dcptool.node.config import format_duration

    con = table_console()
    entries = table.get("entries", [])
    con.print(f"purge age {format_duration(table.get('purge_age'))}, max hold "
              f"{format_duration(table.get('max_hold'))}, compaction every "
              f"{format_duration(table.get('compaction_interval'))}")
    if not entries:
        con.print("no high watermarks registered" + (f" as {name}" if name else ""))
        return
    rows = []
    now = time.time()
    states = {"ok": "ok", "expired": "[yellow]expired[/yellow]", "lost": "[red]lost[/red]"}
    for e in entries:
        holding = e.get("holding") or {}
        if holding:
            n = sum(h["tombstones"] for h in holding.values())
            longest = max(h["seconds"] for h in holding.values())
            held = f"{plural(n, 'tombstone')} in {plural(len(holding), 'vbucket')}, up to {rough_duration(longest)}"
        else:
            held = "-"
        rows.append([e["name"], e["instance"], states.get(e["state"], e["state"]),
                     str(len(e["vbuckets"])), f"{e['lowest_seqno']}..{e['highest_seqno']}",
                     _from_now(e["reported_at"], now), _from_now(e["expires_at"], now), held])
    # names in full: a table where it fits (160 columns: a backup's watermark), a block per
    # watermark where it does not (80 columns)
    print_table(con, ["name", "instance", "state", "vbuckets", "seqnos", "reported",
                      "expires", "holding back"], rows,
                right=("vbuckets", "seqnos", "reported", "expires"), wrap=("holding back",),
                wrap_at=20)
    purge = table.get("purge_seqnos", {})
    details = [(e, vb, h) for e in entries for vb, h in sorted((e.get("holding") or {}).items(),
                                                                key=lambda kv: int(kv[0]))]
    if details:
        drows = []
        shown: dict[tuple[str, str], int] = {}
        for e, vb, h in details:
            k = (e["name"], e["instance"])
            shown[k] = shown.get(k, 0) + 1
            if shown[k] > 20:
                continue
            drows.append([e["name"], e["instance"], vb, str(e["vbuckets"][vb]),
                          str(purge.get(vb, "")), str(h["tombstones"]), str(h["up_to_seqno"]),
                          rough_duration(h["seconds"])])
        print_table(con, ["name", "instance", "vb", "watermark", "purge seqno",
                          "tombstones", "up to seqno", "purgeable for"], drows,
                    title="per vbucket: what each watermark holds back",
                    right=("vb", "watermark", "purge seqno", "tombstones", "up to seqno",
                           "purgeable for"))
        for (n, i), count in shown.items():
            if count > 20:
                con.print(f"{n}/{i}: {count - 20} more vbuckets (--json lists all)")
    for e in entries:
        if e["state"] == "lost":
            con.print(f"[red]{e['name']}/{e['instance']} is lost[/red]: {e.get('lost_reason')}")


@watermark_app.command("remove")
@connection_options(timeout=True)
def remove(
    name: Annotated[Optional[str], typer.Option("--name", help="The client to remove.")] = None,
    instance: Annotated[Optional[str], typer.Option(
        "--instance", metavar="UUID", help="Only this instance (default: all of --name).")] = None,
    archive: Annotated[Optional[Path], typer.Option(
        "--archive", metavar="ARCHIVE", help="Remove the watermark backup registered for "
                                             "this archive.")] = None,
    json_out: JsonOpt = False,
    conn_args: ConnArgs = None,
) -> None:
    """Remove a client's high watermarks, so the purger no longer waits for it.

    A cluster archive's --archive removes each bucket archive's watermark from the
    node's bucket of that name.

    Example: dcptool watermark remove -c 127.0.0.1:11210 --name my-app
    Example: dcptool watermark remove -c 127.0.0.1:11210 --archive /backups/cluster
    """
    from dcptool.client.watermark import WatermarkNotFound, remove_watermark

    if archive is not None and _is_cluster(archive):
        if name is not None or instance is not None:
            raise UsageError("give --name or --archive, not both")
        _remove_cluster(archive, conn_args, json_out)
        return
    if archive is not None:
        if name is not None:
            raise UsageError("give --name or --archive, not both")
        name, a_instance, _vbs, _meta = _archive_identity(archive)
        instance = instance or a_instance
    if not name:
        raise UsageError("--name is required")
    opts = conn_args.options()
    check_privileges(opts, "remove a high watermark from", WATERMARK_WRITE)
    with opts.connect() as conn:
        try:
            removed = remove_watermark(conn, name, instance)
        except WatermarkNotFound as exc:
            raise DcptoolError(str(exc), hint="see 'dcptool watermark list'") from None
    if json_out:
        print_json({"removed": removed})
        return
    for r in removed:
        console().print(f"removed {r['name']}/{r['instance']}")
