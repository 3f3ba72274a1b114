"""`dcptool backup` and `dcptool restore`: the main job, run on Spark."""
from __future__ import annotations

from contextlib import nullcontext
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from dcptool.cli.app import app
from dcptool.cli.connopts import ConnArgs, connection_options
from dcptool.cli.manual import manual
from dcptool.cli.options import MasterOpt, NoProgressOpt, PartitionsOpt, point_in_time
from dcptool.cli.output import (
    backup_id_arg, console, detail, human_bytes, human_rate, live_bar, new_bar, note, plural,
    print_json, show_progress, spark_progress, timing,
)
from dcptool.client.privileges import (
    DCP_PRODUCER, META_WRITE, WATERMARK_WRITE, check_privileges,
)
from dcptool.client.vbspec import parse_vbuckets

if TYPE_CHECKING:
    from dcptool.pipeline.continuous import ContinuousOptions

CONTINUOUS = "Continuous backup"


manual(
    "backup",
    exit_codes=(3,),
    exit_note="A failed run (1) keeps its partial backup; the next run resumes it. A user "
              "without the DcpProducer privilege (or WatermarkWrite, unless --no-watermark) "
              "is refused (1) before Spark starts and before the archive is touched. 2 when "
              "the archive holds another bucket (another bucket uuid, whose vbuckets do not "
              "continue the archive's history: another node's bucket, or one deleted and "
              "created again under the same name), unless --full, or when --vbuckets names "
              "vbuckets the bucket does not have; nothing is written.",
    files=(
        ("ARCHIVE/archive.json", "What the archive is (bucket, vbuckets); written once."),
        ("ARCHIVE/backups/ID/", "One directory per backup; manifest.json is written last, so a "
                                "directory without it is a partial backup."),
        ("ARCHIVE/lock", "Present while a backup or merge writes the archive."),
        ("ARCHIVE/continuous.json", "With --continuous: the run's status (process, last "
                                    "checkpoint, lag), rewritten at every checkpoint; what "
                                    "'dcptool info' shows."),
        ("ARCHIVE/keys/", "The key files of an encrypted archive (--encrypt), one per "
                          "passphrase."),
        ("ARCHIVE/logs/backup-TIME.log", "The log of each run (mode 0600): the plan, one line per "
                                         "vbucket, rollbacks, retries and timings. The newest 20 "
                                         "are kept (DCPTOOL_LOG_KEEP)."),
    ),
    env=("DCPTOOL_LOG_KEEP", "DCPTOOL_ARCHIVE_PASSPHRASE", "DCPTOOL_MANIFEST_CACHE"),
    see_also=("restore", "info", "verify", "merge", "examine", "key"),
)

manual(
    "restore",
    exit_note="1 when any document could not be written (the counts and the run log name "
              "them), or when the user lacks the MetaWrite privilege: refused before anything "
              "is written, or, when the privilege is lost during the run, stopped at the first "
              "refused write, with one line; 1 when a backup read fails the checks verify "
              "makes (one line naming the file, nothing written). 2 when --vbuckets names "
              "vbuckets the archive does not have, and for a --to-time without a zone, in "
              "the future, before the archive's window, or in a gap of it (no backup "
              "running) without --nearest: one line, nothing written. --dry-run exits as the restore would for "
              "every check it makes.",
    files=(
        ("ARCHIVE/backups/ID/", "The backups read (never changed)."),
        ("ARCHIVE/logs/restore-TIME.log", "The log of each run (mode 0600): per vbucket what was "
                                          "sent, per task what was restored, skipped and failed. "
                                          "The newest 20 are kept (DCPTOOL_LOG_KEEP)."),
    ),
    env=("DCPTOOL_LOG_KEEP", "DCPTOOL_PROGRESS_INTERVAL", "DCPTOOL_GAP_TOLERANCE"),
    see_also=("backup", "info", "verify", "examine"),
)


@app.command()
@connection_options(snappy=True, bucket_default=None)
def backup(
    archive: Annotated[str, typer.Argument(
        metavar="ARCHIVE", help="Archive directory (created when missing), or s3://BUCKET/PREFIX.",
        show_default=False)],
    conn_args: ConnArgs = None,
    full: Annotated[bool, typer.Option("--full", help="Take a full backup even if the archive "
                                                       "has backups.")] = False,
    vbuckets: Annotated[Optional[str], typer.Option("--vbuckets", metavar="LIST",
                                                    help="Only these vbuckets, e.g. 0-15,512.")] = None,
    level: Annotated[int, typer.Option("--level", min=1, max=22,
                                       help="zstd compression level.")] = 3,
    purge_partial: Annotated[bool, typer.Option(
        "--purge-partial", help="Discard a partial backup left by a killed run instead of "
                                "resuming it.")] = False,
    master: MasterOpt = None,
    partitions: PartitionsOpt = None,
    no_progress: NoProgressOpt = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
    no_watermark: Annotated[bool, typer.Option(
        "--no-watermark", help="Do not register the archive's high watermark with the node.")] = False,
    watermark_ttl: Annotated[str, typer.Option(
        "--watermark-ttl", metavar="DURATION",
        help="How long the registered watermark holds the node's tombstone purger back "
             "unless the next backup renews it.")] = "7d",
    include_data: Annotated[Optional[list[str]], typer.Option(
        "--include-data", metavar="NAMES", envvar="DCPTOOL_INCLUDE_DATA",
        help="Only these collections: bucket.scope.collection or bucket.scope, "
             "comma-separated, repeatable. Incremental backups keep the selection.")] = None,
    exclude_data: Annotated[Optional[list[str]], typer.Option(
        "--exclude-data", metavar="NAMES", envvar="DCPTOOL_EXCLUDE_DATA",
        help="Leave these collections out: bucket.scope.collection or bucket.scope, "
             "comma-separated, repeatable.")] = None,
    encrypt: Annotated[bool, typer.Option(
        "--encrypt", help="Create the new archive encrypted (AES-256-GCM) under a passphrase "
                          "(DCPTOOL_ARCHIVE_PASSPHRASE, --passphrase-file or a prompt, asked "
                          "twice). An encrypted archive needs no --encrypt afterwards.")] = False,
    all_buckets: Annotated[bool, typer.Option(
        "--all-buckets", help="Back up every bucket the user may back up into a cluster "
                              "archive (a bucket archive per bucket in ARCHIVE/buckets/, and "
                              "per run the buckets' settings, scopes and collections, users "
                              "and groups): what a backup without -b into a new ARCHIVE "
                              "does. A cluster archive is always backed up so; -b then "
                              "backs up that one bucket of it.")] = False,
    disable_bucket_config: Annotated[bool, typer.Option(
        "--disable-bucket-config", help="Cluster archives: leave the buckets' settings, "
                                        "scopes and collections out of the run.")] = False,
    disable_users: Annotated[bool, typer.Option(
        "--disable-users", help="Cluster archives: leave users and groups out of the run "
                                "(reading them needs an administrator).")] = False,
    continuous: Annotated[bool, typer.Option(
        "--continuous", rich_help_panel=CONTINUOUS,
        help="Keep backing up: commit what is new at every checkpoint until Ctrl-C (which "
             "commits a last one and exits 0). One bucket (-b), or every bucket of a "
             "cluster archive.")] = False,
    checkpoint: Annotated[str, typer.Option(
        "--checkpoint", metavar="DURATION", rich_help_panel=CONTINUOUS,
        help="--continuous: how often what the node sent is committed.")] = "10s",
    rotate: Annotated[str, typer.Option(
        "--rotate", metavar="DURATION", rich_help_panel=CONTINUOUS,
        help="--continuous: fold the checkpoints into one backup (every version kept) "
             "once they are this old.")] = "1h",
    rotate_size: Annotated[str, typer.Option(
        "--rotate-size", metavar="SIZE", rich_help_panel=CONTINUOUS,
        help="--continuous: ... or once they take this much.")] = "1GiB",
    stop_after: Annotated[Optional[str], typer.Option(
        "--stop-after", metavar="DURATION", rich_help_panel=CONTINUOUS,
        help="--continuous: commit a last checkpoint and exit after this long (default: "
             "run until Ctrl-C or SIGTERM).")] = None,
) -> None:
    """Back up every bucket of a cluster into a cluster archive, or one bucket (-b) into a
    bucket archive: full the first time, incremental afterwards.

    Without -b (or DCPTOOL_BUCKET) a new ARCHIVE becomes a cluster archive of every bucket
    the user may back up (see below); an existing archive of one bucket goes on with its
    bucket, and a cluster archive with all of them.

    Each vbucket streams from where the archive's last backup ended to the node's high
    seqno at the start of the run, ending on a snapshot boundary; a vbucket with nothing
    new since then is not streamed and costs no file. A run that was killed is resumed by
    the next one. Each run writes a log to ARCHIVE/logs/.

    A bucket archive holds one bucket: an incremental backup of another bucket (another
    bucket uuid, e.g. another node's, or one deleted and created again with the same name)
    is refused in one line naming both; --full starts a new full backup of it in the same
    archive on purpose.

    After each backup the archive's end positions are registered with the node as a high
    watermark (see 'dcptool watermark'), so the node keeps the deletions the next
    incremental backup needs; back up more often than --watermark-ttl.

    Every scope and collection is backed up (with the creations and drops between
    backups) unless --include-data/--exclude-data select some: then the node streams only
    those. Names must exist when the selection is given; a different selection needs
    --full.

    ARCHIVE is a directory or s3://BUCKET/PREFIX (S3 or any S3-compatible store; endpoint
    and credentials from AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or
    AWS_PROFILE, and DCPTOOL_S3_*). Spark tasks write the archive's files themselves: with
    a --master other than local, a directory must be on a filesystem shared by this
    machine and every Spark executor, at the same path (NFS, a cluster filesystem), and
    an S3 archive must be reachable from every executor; the run checks that before it
    streams.

    Example: DCPTOOL_PASSWORD=... dcptool backup -c couchbase://127.0.0.1 /backups/cluster

    Example: dcptool backup -c couchbase://127.0.0.1 -b default /backups/default

    Example: dcptool backup -c 127.0.0.1 -b travel /backups/travel --include-data travel.inventory

    With --encrypt a new archive is encrypted: every data file, backup.json, done file
    and manifest is sealed under a random data key, which key files in ARCHIVE/keys/ hold
    wrapped under passphrases ('dcptool key' adds, removes and lists them). Every command
    that reads or writes an encrypted archive asks for its passphrase first.

    Example: DCPTOOL_ARCHIVE_PASSPHRASE_FILE=~/.dcptool-pass dcptool backup -c 127.0.0.1 /backups/secret --encrypt

    With --continuous the backup keeps going: every --checkpoint (10s) it commits what
    the node sent since the last checkpoint as a small incremental backup (nothing when
    nothing changed), each a micro-batch of one Spark Structured Streaming query, until Ctrl-C or SIGTERM, which commit a last
    checkpoint and exit 0. A change the node acknowledged is in the archive within about
    one interval; a run killed outright loses nothing committed, and the next run resumes
    where the archive ends. Every --rotate (1h) or --rotate-size (1GiB) the checkpoints
    are merged into one ordinary backup that keeps every version they held, so restore
    --to-time, examine --at and export --at still reach any checkpoint. A lost node, a dropped connection or a slow
    store is one line and a retry with backoff; `dcptool info` shows the run and its lag.

    Example: dcptool backup -c 127.0.0.1 -b default /backups/default --continuous --checkpoint 5s

    Into a cluster archive (without -b) --continuous checkpoints every bucket of the
    cluster in one loop, each into its bucket archive as above; a bucket that fails is
    retried on its own, a bucket created meanwhile is picked up, and the cluster's record
    (settings, scopes and collections, users and groups) follows the checkpoints: its
    newest run is the last checkpoint of every bucket.

    Example: dcptool backup -c 127.0.0.1 /backups/cluster --continuous

    Into a cluster archive (a new ARCHIVE without -b, or --all-buckets) every bucket the
    user may back up is backed up, each into its own bucket archive under ARCHIVE/buckets/NAME (its chain
    incremental on its own; a new bucket starts full, one dropped and created again
    starts a new full backup), one after the other on one Spark start-up. The run then
    records, in ARCHIVE/runs/, each bucket's backup, settings, scopes and collections, and
    the cluster's users and groups with their password hashes as the cluster exports them
    for backup (never a plain password); buckets the node no longer has are kept and
    reported.

    Example: dcptool backup -c 127.0.0.1 /backups/cluster --exclude-data logs
    """
    from dcptool.cli.options import parse_ttl

    ttl = parse_ttl(watermark_ttl, "--watermark-ttl")
    cluster = _into_cluster_archive(archive, conn_args.bucket, all_buckets)
    if not continuous:
        _refuse_continuous_only(checkpoint, rotate, rotate_size, stop_after)
    _refuse_other_kind_options(cluster, vbuckets, disable_bucket_config or disable_users)
    stream = {"partitions": partitions, "level": level, "watermark": not no_watermark,
              "watermark_ttl": ttl, "include_data": include_data, "exclude_data": exclude_data}
    if continuous:
        _continuous_backup(archive, conn_args, encrypt=encrypt, json_out=json_out,
                           no_progress=no_progress, full=full, purge_partial=purge_partial,
                           checkpoint=checkpoint, rotate=rotate, rotate_size=rotate_size,
                           stop_after=stop_after, master=master, cluster=cluster,
                           bucket_config=not disable_bucket_config, users=not disable_users,
                           backup={**stream,
                                   "vbuckets": parse_vbuckets(vbuckets) if vbuckets else None})
        return
    if cluster:
        _cluster_backup(archive, conn_args, encrypt=encrypt,
                        bucket_config=not disable_bucket_config, users=not disable_users,
                        json_out=json_out, no_progress=no_progress, full=full, master=master,
                        purge_partial=purge_partial, **stream)
        return
    _bucket_backup(archive, conn_args, encrypt=encrypt, json_out=json_out,
                   no_progress=no_progress, vbuckets=vbuckets, full=full, master=master,
                   purge_partial=purge_partial, **stream)


def _into_cluster_archive(archive: str, bucket: str | None, all_buckets: bool) -> bool:
    """Whether the backup goes into a cluster archive: with --all-buckets, into a cluster
    archive, or with no -b (nor DCPTOOL_BUCKET) into a new archive, which then holds the
    whole cluster; an archive of one bucket goes on with its bucket."""
    from dcptool.archive.cluster import archive_kind

    kind = archive_kind(archive)
    return all_buckets or kind == "cluster" or (kind is None and bucket is None)


def _refuse_continuous_only(checkpoint: str, rotate: str, rotate_size: str,
                            stop_after: str | None) -> None:
    """Without --continuous: its options given other than as their defaults are refused."""
    from dcptool.errors import UsageError

    if stop_after is not None or checkpoint != "10s" or rotate != "1h" or rotate_size != "1GiB":
        raise UsageError("--checkpoint, --rotate, --rotate-size and --stop-after are options "
                         "of --continuous", hint="add --continuous")


def _refuse_other_kind_options(cluster: bool, vbuckets: str | None, cluster_only: bool) -> None:
    """--vbuckets is refused into a cluster archive, and `cluster_only` options
    (--disable-bucket-config, --disable-users) into an archive of one bucket."""
    from dcptool.errors import UsageError

    if cluster and vbuckets:
        raise UsageError("--vbuckets selects vbuckets of one bucket", hint="leave it out, "
                         "or back up one bucket with -b into a bucket archive")
    if not cluster and cluster_only:
        raise UsageError("--disable-bucket-config and --disable-users are for cluster "
                         "archives", hint="add --all-buckets")


def _bucket_backup(archive: str, conn_args: ConnArgs, *, encrypt: bool, json_out: bool,
                   no_progress: bool, vbuckets: str | None, full: bool, master: str | None,
                   purge_partial: bool, partitions: int | None, level: int, watermark: bool,
                   watermark_ttl: float, include_data: list[str] | None,
                   exclude_data: list[str] | None) -> None:
    """`backup -b`, or into an archive of one bucket."""
    from dcptool.archive.cluster import bucket_of_archive
    from dcptool.pipeline.backup import run_backup

    # a wrong passphrase stops here, before work
    target, new_passphrase = _open_or_plan_encrypted(archive, encrypt)
    opts = conn_args.options(bucket=conn_args.bucket or bucket_of_archive(archive) or "default")
    vbs = parse_vbuckets(vbuckets) if vbuckets else None
    # before Spark starts and before the archive is touched: a user who may not stream
    # (or register the watermark) is told so in one line and nothing is left behind
    check_privileges(opts, "back up", DCP_PRODUCER, *([WATERMARK_WRITE] if watermark else []))
    bar, progress_cb, on_plan = _backup_progress(show_progress(no_progress or json_out))
    with live_bar(bar) if bar is not None else nullcontext():
        result = run_backup(opts, target, passphrase=new_passphrase, full=full,
                            partitions=partitions, master=master, level=level,
                            purge_partial=purge_partial, vbuckets=vbs, progress=progress_cb,
                            on_plan=on_plan, watermark=watermark, watermark_ttl=watermark_ttl,
                            notice=note, include_data=include_data, exclude_data=exclude_data)
    _report_backup(result.as_dict(), json_out)


def _cluster_backup(archive: str, conn_args: Any, *, encrypt: bool, bucket_config: bool,
                    users: bool, json_out: bool, no_progress: bool, **backup: Any) -> None:
    """`backup --all-buckets`, or into a cluster archive."""
    from dcptool.archive import crypto
    from dcptool.archive.cluster import ClusterArchive, archive_kind
    from dcptool.cli.passphrase import passphrase_source
    from dcptool.errors import UsageError
    from dcptool.pipeline.clusterbackup import run_cluster_backup

    new_passphrase = None
    passphrase: Any = passphrase_source()
    kind = archive_kind(archive)
    if kind == "cluster":
        # a wrong passphrase stops here, before any work
        cluster = ClusterArchive.open(archive, passphrase=passphrase)
        if encrypt and not cluster.encrypted:
            raise UsageError(f"--encrypt: archive {archive} exists and is not encrypted",
                             hint="back up into a new archive to encrypt")
        passphrase = cluster.passphrase
    elif kind is None and encrypt:
        new_passphrase = crypto.get_passphrase(f"new archive {archive}", confirm=True,
                                               source=passphrase)
    opts = conn_args.options(bucket=conn_args.bucket or "default")
    bar, progress_cb, on_plan = _backup_progress(show_progress(no_progress or json_out))
    task = bar.tasks[0].id if bar is not None else None
    which = {"bucket": ""}

    def on_bucket(name: str, i: int, n: int) -> None:
        which["bucket"] = f"{name} ({i + 1}/{n})"
        if bar is not None:
            bar.reset(task, total=None, description=f"{which['bucket']}: planning")

    def bucket_progress(p: dict) -> None:
        progress_cb(p)
        phase = "backup" if p["phase"] == "streaming" else p["phase"]
        bar.update(task, description=f"{which['bucket']}: {phase}")

    with live_bar(bar) if bar is not None else nullcontext():
        result = run_cluster_backup(
            opts, archive, passphrase=passphrase, new_passphrase=new_passphrase,
            buckets=[conn_args.bucket] if conn_args.bucket else None,
            bucket_config=bucket_config, users=users, notice=note, on_bucket=on_bucket,
            progress=bucket_progress if bar is not None else None, on_plan=on_plan, **backup)
    d = result.as_dict()
    if json_out:
        print_json(d)
        return
    from rich.table import Table

    t = Table(title=f"cluster backup run {d['run_id']}")
    for col in ("bucket", "backup", "type", "items", "size on disk"):
        t.add_column(col, justify="right" if col in ("items", "size on disk") else "left")
    for name, b in d["buckets"].items():
        s = b["backup"]
        t.add_row(name, s["backup_id"], b["status"],
                  f"{s['mutations'] + s['deletions'] + s['expirations']:,}",
                  human_bytes(s["size_on_disk"]))
    for name in d["dropped"]:
        t.add_row(name, "-", "dropped (kept)", "-", "-")
    console().print(t)
    if d["users"] is not None:
        console().print(f"users: {d['users']}  groups: {d['groups']}")


def _continuous_backup(archive: str, conn_args: Any, *, encrypt: bool, json_out: bool,
                       no_progress: bool, full: bool, purge_partial: bool, checkpoint: str,
                       rotate: str, rotate_size: str, stop_after: str | None,
                       master: str | None, backup: dict[str, Any], cluster: bool = False,
                       bucket_config: bool = True, users: bool = True) -> None:
    """`backup --continuous`: a checkpoint every --checkpoint until Ctrl-C or SIGTERM; of
    one bucket into a bucket archive, or (`cluster`) of every bucket into a cluster
    archive."""
    import signal
    import sys
    import time

    from dcptool.archive.cluster import bucket_of_archive
    from dcptool.pipeline import runtime
    from dcptool.pipeline.continuous import check_alone, run_continuous

    o = _continuous_options(full=full, purge_partial=purge_partial, checkpoint=checkpoint,
                            rotate=rotate, rotate_size=rotate_size, stop_after=stop_after)
    check_alone(archive)  # before Spark starts
    if cluster:
        from dcptool.client.rest import rest_client_for
        from dcptool.pipeline.clusterbackup import node_buckets

        passphrase, new_passphrase = _cluster_passphrase(archive, encrypt)
        opts = conn_args.options(bucket=conn_args.bucket or "default")
        node_buckets(rest_client_for(opts, None))  # a node that does not answer: one line
        o.backup = dict(backup)
    else:
        target, new_passphrase = _open_or_plan_encrypted(archive, encrypt)
        opts = conn_args.options(bucket=conn_args.bucket or bucket_of_archive(archive)
                                 or "default")
        check_privileges(opts, "back up", DCP_PRODUCER,
                         *([WATERMARK_WRITE] if backup["watermark"] else []))
        o.backup = {**backup, "passphrase": new_passphrase}
    show = show_progress(no_progress or json_out)
    bar = new_bar(endless=True) if show else None
    lines = _ContinuousLines(bar, [] if cluster else [opts.bucket])

    def on_checkpoint(rec: dict[str, Any]) -> None:
        if json_out:
            print_json({"event": "checkpoint", **rec})
            sys.stdout.flush()
        lines.checkpoint(rec)

    def on_retry(rec: dict[str, Any]) -> None:
        if json_out:
            print_json({"event": "retry", **rec})
            sys.stdout.flush()
        lines.retry(rec)

    o.on_checkpoint = on_checkpoint
    o.on_retry = on_retry
    told = {"n": 0}

    def on_signal(signum, frame):  # noqa: ARG001 - a signal handler's signature
        told["n"] += 1
        if told["n"] > 1:
            runtime.interrupt_now(signum, frame)
        o.stop.set()
        note("stopping: committing a last checkpoint (Ctrl-C again abandons it; the next "
             "run resumes it)")

    t0 = time.monotonic()
    previous: dict = {}
    try:
        with live_bar(bar) if bar is not None else nullcontext():
            # Spark first (its Ctrl-C handler), then ours over it: the first Ctrl-C (or
            # SIGTERM) asks for a last checkpoint, a second one abandons it as any backup
            # is interrupted
            spark = runtime.get_context(master)
            lines.started()
            previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
            if cluster:
                from dcptool.pipeline.clustercontinuous import run_cluster_continuous

                summary = run_cluster_continuous(
                    opts, archive, o, passphrase=passphrase, new_passphrase=new_passphrase,
                    buckets=[conn_args.bucket] if conn_args.bucket else None,
                    bucket_config=bucket_config, users=users, spark=spark, master=master,
                    on_buckets=lines.buckets)
            else:
                summary = run_continuous(opts, target, o, spark=spark, master=master)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    if json_out:
        print_json({"event": "stopped", **summary})
        return
    _print_continuous_stopped(summary, cluster=cluster, bucket=opts.bucket, started=t0)


def _continuous_options(*, full: bool, purge_partial: bool, checkpoint: str, rotate: str,
                        rotate_size: str, stop_after: str | None) -> ContinuousOptions:
    """--checkpoint, --rotate, --rotate-size and --stop-after checked and parsed (--full
    and --purge-partial refused: a continuous backup continues the archive)."""
    from dcptool.cli.options import parse_ttl
    from dcptool.errors import UsageError
    from dcptool.node.config import parse_size
    from dcptool.pipeline.continuous import ContinuousOptions

    if full or purge_partial:
        raise UsageError("--continuous continues the archive: no --full or --purge-partial",
                         hint="run one 'dcptool backup --full' (or --purge-partial) first")
    every = parse_ttl(checkpoint, "--checkpoint")
    if every < 0.2:
        raise UsageError("--checkpoint must be at least 200ms")
    size = parse_size(rotate_size, what="--rotate-size")
    if size <= 0:
        raise UsageError("--rotate-size must be positive")
    return ContinuousOptions(checkpoint=every, rotate=parse_ttl(rotate, "--rotate"),
                             rotate_size=size, notice=note,
                             stop_after=None if stop_after is None else
                             parse_ttl(stop_after, "--stop-after"))


def _print_continuous_stopped(summary: dict[str, Any], *, cluster: bool, bucket: str,
                              started: float) -> None:
    """The line a continuous backup ends with: of `bucket`, or (`cluster`) of the cluster
    archive's buckets; how long since `started` (time.monotonic()), what it did and its
    last checkpoint."""
    import time

    t = summary["totals"]
    what = (f"{plural(len(summary['buckets']), 'bucket')} ({', '.join(summary['buckets'])})"
            if cluster else bucket)
    last = (max((b["last_checkpoint"] or "" for b in summary["buckets"].values()),
                default="") or None) if cluster else summary["last_checkpoint"]
    console().print(
        f"continuous backup of {what} stopped after {time.monotonic() - started:.0f} s: "
        f"{plural(t['checkpoints'], 'checkpoint')} ({t['backups']} wrote a backup), "
        f"{t['items']:,} items, {plural(t['rotations'], 'rotation')}, "
        f"{plural(t['files'], 'file')}; last checkpoint {last}", markup=False)


def _cluster_passphrase(archive: str, encrypt: bool) -> tuple[Any, str | None]:
    """(what opens the cluster archive, the new archive's passphrase or None): an existing
    one is unlocked now (a wrong passphrase stops here, before any work)."""
    from dcptool.archive import crypto
    from dcptool.archive.cluster import ClusterArchive, archive_kind
    from dcptool.cli.passphrase import passphrase_source
    from dcptool.errors import UsageError

    passphrase: Any = passphrase_source()
    kind = archive_kind(archive)
    if kind == "bucket":
        raise UsageError(f"{archive} is an archive of one bucket, not of a cluster",
                         hint="back up that bucket with -b, or the cluster into a new archive")
    if kind == "cluster":
        cluster = ClusterArchive.open(archive, passphrase=passphrase)
        if encrypt and not cluster.encrypted:
            raise UsageError(f"--encrypt: archive {archive} exists and is not encrypted",
                             hint="back up into a new archive to encrypt")
        return cluster.passphrase, None
    if encrypt:
        return passphrase, crypto.get_passphrase(f"new archive {archive}", confirm=True,
                                                 source=passphrase)
    return passphrase, None


class _ContinuousLines:
    """The live lines of a continuous backup: one per bucket, its lag (seconds and items),
    its last checkpoint's time and items/s, within 80 columns."""

    #: a bucket's name is cut to this many columns (the line's other fields need the rest)
    NAME = 16

    def __init__(self, bar: Any, buckets: list[str]) -> None:
        self.bar = bar
        self.tasks: dict[str, Any] = {}
        self.at: dict[str, str] = {}
        self.rate: dict[str, Any] = {}
        self.waiting = None
        if bar is None:
            return
        if buckets:
            self.buckets(buckets, detail="starting Spark")
        else:
            self.waiting = bar.add_task("buckets", total=None, detail="starting Spark")

    def _label(self, name: str) -> str:
        return name if len(name) <= self.NAME else name[:self.NAME - 1] + "~"

    def started(self) -> None:
        if self.bar is None:
            return
        for t in [*self.tasks.values(), *([self.waiting] if self.waiting is not None else [])]:
            self.bar.update(t, detail="first checkpoint")

    def buckets(self, names: list[str], detail: str = "first checkpoint") -> None:
        """The buckets the run checkpoints now (new ones get a line, dropped ones say so)."""
        if self.bar is None:
            return
        if self.waiting is not None:
            self.bar.remove_task(self.waiting)
            self.waiting = None
        for name in self.tasks:
            if name not in names:
                self.bar.update(self.tasks[name], detail="dropped: no more checkpoints")
        for name in names:
            if name not in self.tasks:
                self.tasks[name] = self.bar.add_task(self._label(name), total=None,
                                                     detail=detail)
        width = max((len(self._label(n)) for n in self.tasks), default=0)
        for name, t in self.tasks.items():
            self.bar.update(t, description=self._label(name).ljust(width))

    def checkpoint(self, rec: dict[str, Any]) -> None:
        if self.bar is None:
            return
        per = rec.get("buckets")
        one = per is None  # one bucket's record: its line has the room of the terminal
        if one:
            per = {rec["bucket"]: rec}
        for name, r in per.items():
            self.at[name] = rec["time"][11:19]
            self.rate[name] = r.get("items_per_second")
        for name, lag in rec["lag"].items():
            if name not in self.tasks or name not in self.at:
                continue
            rate = self.rate.get(name)
            failing = (rec.get("failing") or {}).get(name)
            items = lag["items"] if lag["items"] is not None else "?"
            secs = f"{lag['seconds']:.1f}" if lag["seconds"] is not None else "?"
            speed = f"{human_rate(rate) if rate is not None else '-'} items/s"
            if one:
                detail = (f"lag {secs} s, {items} items behind, checkpoint {self.at[name]}, "
                          f"{speed}")
            else:  # a line per bucket within 80 columns, beside a name of 16 at most
                detail = (f"lag {secs} s/{items} items, at {self.at[name]}, "
                          + ("failing" if failing else speed))
            self.bar.update(self.tasks[name], detail=detail)

    def retry(self, rec: dict[str, Any]) -> None:
        if self.bar is None or rec["bucket"] not in self.tasks:
            return
        self.bar.update(self.tasks[rec["bucket"]],
                        detail=f"lag {rec['lag'][rec['bucket']]['seconds']:.1f} s, "
                               f"retrying in {rec['retry_in']:.0f} s")


def _report_backup(d: dict, json_out: bool) -> None:
    if d["log"]:
        detail(f"log: {d['log']}")
    if json_out:
        print_json(d)
        return
    _print_backup(d)


def _backup_progress(show: bool) -> tuple[Any, Any, Any]:
    """(the progress bar or None, the backup's progress callback or None, its on_plan
    callback): phases "starting Spark", then the bar advances with each item streamed
    (over the vbuckets' seqnos, so it ends full), then "committing"."""
    progress_cb = None
    bar = None
    task = None
    if show:
        bar = new_bar()
        task = bar.add_task("planning", total=None, detail="0 items  0 vbuckets")

        def progress_cb(p: dict) -> None:
            streaming = p["phase"] in ("streaming", "committing", "done")
            bar.update(task, description="backup" if p["phase"] == "streaming" else p["phase"],
                       total=(p["work_total"] or 1) if streaming else None,
                       completed=(p["work"] if p["work_total"] else 1) if streaming else 0,
                       detail=f"{p['items']:,} items  {p['vbuckets_done']}/{p['vbuckets']} "
                              "vbuckets")

    def on_plan(plan: dict) -> None:
        if plan["resumed"]:
            # above the bar (see output.live_bar), on a line of its own
            note(f"resuming partial backup {plan['backup_id']}: "
                 f"{plural(plan['kept'], 'vbucket')} kept, {plan['to_stream']} to stream")
        if bar is not None:
            bar.update(task, detail=f"0 items  {plan['kept']}/{plan['vbuckets']} vbuckets")

    return bar, progress_cb, on_plan


def _print_backup(d: dict) -> None:
    """A committed backup's summary as a table."""
    from rich.table import Table

    t = Table(title=f"backup {d['backup_id']}", show_header=False)
    for k in ("type", "resumed", "vbuckets", "mutations", "deletions", "expirations", "rollbacks"):
        v = d[k]
        t.add_row(k, ("yes" if v else "no") if isinstance(v, bool) else str(v))
    if d["unchanged_vbuckets"]:
        t.add_row("unchanged vbuckets", f"{d['unchanged_vbuckets']} (nothing new: no files)")
    if d["resumed"]:
        t.add_row("kept vbuckets", str(d["kept_vbuckets"]))
        t.add_row("items streamed", f"{d['items_streamed']:,}")
    if d["collections"] is not None:
        t.add_row("collections", str(d["collections"]))
        t.add_row("system events", str(d["system_events"]))
    if d["data"] is not None:
        t.add_row("data", "; ".join([f"include {n}" for n in d["data"]["include"]]
                                    + [f"exclude {n}" for n in d["data"]["exclude"]]))
    # the same figure and name as `dcptool info`: the backup directory's files
    t.add_row("size on disk", human_bytes(d["size_on_disk"]))
    t.add_row("seconds", timing(d["seconds"], d["spark_startup_seconds"]))
    # of what this run streamed (a resumed run: not the items it kept), Spark's start-up
    # left out
    t.add_row("items/s", human_rate(d["items_per_second"]))
    wm = d.get("watermark")
    if wm is not None:
        t.add_row("watermark", f"{wm['name']} ({plural(wm['vbuckets'], 'vbucket')})" if wm["registered"]
                  else "not registered")
    console().print(t)


def _restore_checks(d: dict) -> list[str]:
    """What a restore checked, as lines (a dry run's report)."""
    out = []
    c = d.get("checked")
    if c:
        # the backups' size as `info` and `verify` give it (the bytes of their files)
        out.append(f"archive: {plural(c['backups'], 'backup')} "
                   f"({human_bytes(c['size_on_disk'])}), {plural(c['files'], 'file')}, "
                   f"{c['records']:,} records checked as verify does")
    t = d.get("target")
    if t:
        how = (f"keys routed by its own map (the archive has {t['archive_vbuckets']})"
               if t["rerouted"] else "as the archive")
        nodes = f", {t['nodes']} nodes" if t["nodes"] > 1 else ""
        out.append(f"target: bucket {t['bucket']} on {t['address']}{nodes}: logged in, "
                   f"privileges held, {t['vbuckets']} vbuckets, {how}")
    return out


def _open_or_plan_encrypted(archive: str, encrypt: bool) -> tuple[Any, str | None]:
    """(the archive opened, or where it is to be created; the new archive's passphrase or
    None): an existing archive is opened (an encrypted one unlocked) now; with --encrypt
    and no archive yet, the new passphrase is taken now (the archive is created once the
    node's vbuckets are known)."""
    from dcptool.archive import crypto, storage
    from dcptool.cli.passphrase import open_archive, passphrase_source
    from dcptool.errors import UsageError

    where = storage.location(archive)
    if (where / "archive.json").exists():
        a = open_archive(archive)
        if encrypt and not a.encrypted:
            raise UsageError(f"--encrypt: archive {archive} exists and is not encrypted",
                             hint="back up into a new archive to encrypt")
        return a, None
    if encrypt:
        return archive, crypto.get_passphrase(f"new archive {archive}", confirm=True,
                                              source=passphrase_source())
    return archive, None


@app.command()
@connection_options(bucket_default=None)
def restore(
    archive: Annotated[str, typer.Argument(
        metavar="ARCHIVE", help="Archive directory, or s3://BUCKET/PREFIX.",
        show_default=False)],
    conn_args: ConnArgs = None,
    backup_id: Annotated[Optional[str], typer.Option("--backup", metavar="ID",
                                                     help="Restore the state as of this backup "
                                                          "(its id or an unambiguous beginning "
                                                          "of it; default: the newest).")] = None,
    to_time: Annotated[Optional[str], typer.Option(
        "--to-time", metavar="TIME",
        help="Restore the state as of this time: ISO 8601 with a zone "
             "(2026-11-28T14:03:00Z, +01:00) or relative (-15m, -2h, -1d). Each vbucket "
             "goes to its last snapshot boundary at or before TIME (CAS time).")] = None,
    nearest: Annotated[bool, typer.Option(
        "--nearest", help="With --to-time in a gap of the archive (no backup was running): "
                          "restore to the nearest snapshot boundary before TIME instead "
                          "of refusing.")] = False,
    vbuckets: Annotated[Optional[str], typer.Option("--vbuckets", metavar="LIST",
                                                    help="Only these vbuckets, e.g. 0-15,512.")] = None,
    filter_keys: Annotated[Optional[str], typer.Option("--filter-keys", metavar="REGEX",
                                                       help="Only keys matching this regex.")] = None,
    force_updates: Annotated[bool, typer.Option(
        "--force-updates", help="Overwrite newer versions on the node (skip conflict "
                                "resolution).")] = False,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Check everything the restore checks (the archive's files as "
                          "verify does; the target's connection, login, bucket, privileges, "
                          "vbucket map, scopes and collections) and report what would be "
                          "written and created; write and create nothing.")] = False,
    include_data: Annotated[Optional[list[str]], typer.Option(
        "--include-data", metavar="NAMES", envvar="DCPTOOL_INCLUDE_DATA",
        help="Only these collections: bucket.scope.collection or bucket.scope, "
             "comma-separated, repeatable.")] = None,
    exclude_data: Annotated[Optional[list[str]], typer.Option(
        "--exclude-data", metavar="NAMES", envvar="DCPTOOL_EXCLUDE_DATA",
        help="Leave these collections out: bucket.scope.collection or bucket.scope, "
             "comma-separated, repeatable.")] = None,
    map_data: Annotated[Optional[list[str]], typer.Option(
        "--map-data", metavar="SRC=DST", envvar="DCPTOOL_MAP_DATA",
        help="Restore a collection or scope under other names: scope.collection="
             "scope.collection or scope=scope, comma-separated, repeatable.")] = None,
    rest_port: Annotated[Optional[int], typer.Option(
        "--rest-port", metavar="PORT", envvar="DCPTOOL_REST_PORT", min=1, max=65535,
        help="The target's REST port, for creating missing scopes and collections "
             "(default: the port its cluster config lists).")] = None,
    master: MasterOpt = None,
    partitions: PartitionsOpt = None,
    no_progress: NoProgressOpt = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the counts as JSON.")] = False,
    run_id: Annotated[Optional[str], typer.Option(
        "--run", metavar="RUN-ID", help="Cluster archives: restore this run (default: the "
                                        "newest).")] = None,
    auto_create_buckets: Annotated[bool, typer.Option(
        "--auto-create-buckets", help="Cluster archives: create the buckets the target lacks, "
                                      "with their recorded settings.")] = False,
    bucket_ram_quota: Annotated[Optional[int], typer.Option(
        "--bucket-ram-quota", metavar="MIB", min=1,
        help="Cluster archives: the RAM quota of the buckets --auto-create-buckets creates "
             "(default: each one's recorded quota).")] = None,
    enable_bucket_config: Annotated[bool, typer.Option(
        "--enable-bucket-config", help="Cluster archives: give the target's existing buckets "
                                       "their recorded settings (those a bucket may change).")] = False,
    enable_users: Annotated[bool, typer.Option(
        "--enable-users", help="Cluster archives: restore the run's users and groups "
                               "(existing ones are left alone).")] = False,
    force_users: Annotated[bool, typer.Option(
        "--force-users", help="With --enable-users: overwrite the target's users and groups "
                              "of the same names.")] = False,
) -> None:
    """Restore an archive (or the state as of one backup) into a node, keeping metadata.

    Documents are written with their cas, rev seqno, flags and expiry; where the node
    holds a newer version it wins and the write is counted as skipped. Exit status 1 if
    any write failed. Each run writes a log to ARCHIVE/logs/.

    Before anything is written, the backups read are checked as 'dcptool verify' checks
    them (manifests, files, done files, records, continuity); a problem stops the restore
    in one line naming the file.

    The target may have another vbucket count than the archive (1024, 128, 64): every
    key goes to the target's vbucket for it by the target's own map. The documents and
    their metadata (cas, rev seqno, flags, expiry) are kept; seqnos and failover history
    are the target's own.

    --dry-run connects, logs in, selects the bucket and checks the privileges, the vbucket
    map and the collections as the restore does, and fails where and as the restore would
    (the same one line and exit status); it writes and creates nothing.

    Each document goes into the target's collection of the same scope and collection
    names (or those --map-data gives); missing scopes and collections are created
    through the target's REST port first, with their max TTL. When they cannot be
    created (the user may not, or no REST port is known), or the target has no
    collections and the selection holds more than the default collection, the restore
    stops before writing anything. Documents of a collection dropped as of the backup
    restored are not written.

    Example: dcptool restore /backups/default -c 127.0.0.1:11210 --backup 20261122T101502.123456Z

    Example: dcptool restore /backups/travel -c 127.0.0.1:11210 --include-data travel.inventory --map-data inventory=inventory2

    --to-time TIME restores each vbucket to its last snapshot boundary at or before TIME,
    a boundary's time being the newest CAS time (a hybrid logical clock: nanoseconds since
    the epoch) of the vbucket's history up to it; a deduplicated snapshot holding changes
    from both sides of TIME is restored to its start. The summary gives how far before
    TIME the cuts fell (the worst and the median; each vbucket's with --json) and
    how many are exact (the vbucket's next change is known to be after TIME). A time
    before the archive, without a zone or in the future is refused (exit status 2); so is
    a time in a gap, when no backup was running (between two backups the later of which
    did not start within 10 s, plus a continuous backup's checkpoint interval, of the
    earlier one's end; after the newest one ended), unless --nearest. Batch backups give
    the granularity of their snapshot boundaries: an archive of hourly backups has a gap
    between every two of them, and 'dcptool info' draws the archive's window and gaps.

    Example: dcptool restore /backups/default -c 127.0.0.1:11210 --to-time 2026-11-28T14:03:00Z

    A cluster archive ('dcptool backup --all-buckets') restores every bucket of its newest
    run (--run: another), each into the target's bucket of its name; --include-data and
    --exclude-data take bare bucket names too, and --map-data OLD=NEW, where OLD is a
    bucket of the run, restores it into bucket NEW. A bucket the target lacks stops the
    restore before anything is written, unless --auto-create-buckets creates it with its
    recorded settings; --enable-bucket-config gives existing buckets their recorded
    settings, --enable-users restores users and groups. --dry-run reports the buckets it
    would create, the settings it would change and the users it would add. A run restores
    the same after prune, remove or merge (through the merged backups that end where its
    backups ended); a run whose backup of a bucket is gone (removed with --bucket, or left
    by a prune that was killed) is refused before anything is written.

    Example: dcptool restore /backups/all -c 127.0.0.1 --auto-create-buckets

    Of a cluster archive, --to-time TIME (not with --run) restores the buckets of the newest
    run, each to TIME by its own archive; every bucket's window is checked before anything
    is created or written.
    """
    from dcptool.archive.cluster import archive_kind

    at = _restore_time(to_time, nearest, backup_id=backup_id, run_id=run_id)
    if archive_kind(archive) == "cluster":
        _refuse_bucket_archive_options(backup_id=backup_id, vbuckets=vbuckets,
                                       bucket=conn_args.bucket)
        _cluster_restore(archive, conn_args, run_id=run_id, auto_create=auto_create_buckets,
                         ram_quota=bucket_ram_quota, bucket_config=enable_bucket_config,
                         users=enable_users, force_users=force_users, dry_run=dry_run,
                         rest_port=rest_port, json_out=json_out, no_progress=no_progress,
                         key_filter=filter_keys, force=force_updates, partitions=partitions,
                         master=master, include_data=include_data, exclude_data=exclude_data,
                         map_data=map_data, **({"to_time": at, "nearest": nearest}
                                               if at is not None else {}))
        return
    _refuse_cluster_only({"--run": run_id, "--auto-create-buckets": auto_create_buckets,
                          "--bucket-ram-quota": bucket_ram_quota,
                          "--enable-bucket-config": enable_bucket_config,
                          "--enable-users": enable_users, "--force-users": force_users})
    _bucket_restore(archive, conn_args, backup_id=backup_id, vbuckets=vbuckets,
                    filter_keys=filter_keys, force_updates=force_updates, dry_run=dry_run,
                    partitions=partitions, master=master, include_data=include_data,
                    exclude_data=exclude_data, map_data=map_data, rest_port=rest_port,
                    json_out=json_out, no_progress=no_progress, to_time=at, nearest=nearest)


def _restore_time(to_time: str | None, nearest: bool, *, backup_id: str | None,
                  run_id: str | None) -> int | None:
    """--to-time in CAS nanoseconds (None without it), refused with --backup or --run."""
    from dcptool.errors import UsageError

    at = point_in_time(to_time, nearest, "--to-time")
    if at is not None:
        if backup_id or run_id:
            raise UsageError(f"--to-time and {'--backup' if backup_id else '--run'} "
                             "exclude each other")
    return at


def _refuse_bucket_archive_options(*, backup_id: str | None, vbuckets: str | None,
                                   bucket: str | None) -> None:
    """A cluster archive's restore refuses --backup, --vbuckets and -b/--bucket."""
    from dcptool.errors import UsageError

    for name, value in (("--backup", backup_id), ("--vbuckets", vbuckets),
                        ("-b/--bucket", bucket)):
        if value:
            raise UsageError(f"{name} is for an archive of one bucket",
                             hint="a cluster archive restores runs: --run, and "
                                  "--include-data BUCKET selects buckets")


def _refuse_cluster_only(cluster_only: dict[str, Any]) -> None:
    """A bucket archive's restore refuses the first of the options of cluster archives
    given ({option: its value})."""
    from dcptool.errors import UsageError

    given = [name for name, value in cluster_only.items() if value]
    if given:
        raise UsageError(f"{given[0]} is for cluster archives",
                         hint="back up with --all-buckets to make one")


def _bucket_restore(archive: str, conn_args: ConnArgs, *, backup_id: str | None,
                    vbuckets: str | None, filter_keys: str | None, force_updates: bool,
                    dry_run: bool, partitions: int | None, master: str | None,
                    include_data: list[str] | None, exclude_data: list[str] | None,
                    map_data: list[str] | None, rest_port: int | None, json_out: bool,
                    no_progress: bool, to_time: int | None, nearest: bool) -> None:
    """`restore` of an archive of one bucket."""
    from dcptool.cli.passphrase import open_archive
    from dcptool.pipeline.restore import run_restore

    # a clear error for a missing or foreign directory (or backup id) before connecting
    opened = open_archive(archive)
    backup_id = backup_id_arg(opened, backup_id)
    held = opened.vbucket_count
    # a dry run checks the target as the restore does
    opts = conn_args.options(bucket=conn_args.bucket or "default")
    check_privileges(opts, "restore into", META_WRITE)  # before anything is written
    vbs = parse_vbuckets(vbuckets, limit=held, whose="the archive") if vbuckets else None
    with spark_progress("dry run" if dry_run else "restore", disabled=no_progress or json_out):
        result = run_restore(opened, opts, backup=backup_id, vbuckets=vbs,
                             key_filter=filter_keys, force=force_updates, dry_run=dry_run,
                             partitions=partitions, master=master, include_data=include_data,
                             exclude_data=exclude_data, map_data=map_data, rest_port=rest_port,
                             notice=note, to_time=to_time, nearest=nearest)
    _report_restore(result.as_dict(), json_out, dry_run)


def _cluster_restore(archive: str, conn_args: Any, *, json_out: bool, no_progress: bool,
                     dry_run: bool, **restore: Any) -> None:
    """`restore` of a cluster archive."""
    from dcptool.archive.cluster import ClusterArchive
    from dcptool.cli.passphrase import passphrase_source
    from dcptool.pipeline.clusterrestore import run_cluster_restore

    # a wrong passphrase stops here, before any work
    cluster = ClusterArchive.open(archive, passphrase=passphrase_source())
    opts = conn_args.options(bucket="default")
    which = {"bucket": ""}

    def on_bucket(name: str, i: int, n: int) -> None:
        which["bucket"] = f"{name} ({i + 1}/{n})"

    with spark_progress("dry run" if dry_run else "restore", disabled=no_progress or json_out):
        result = run_cluster_restore(opts, cluster, dry_run=dry_run, notice=note,
                                     on_bucket=on_bucket, **restore)
    d = result.as_dict()
    failed = sum(sum(b["restore"]["failed"].values()) for b in d["buckets"].values()
                 if b["restore"] is not None)
    if json_out:
        print_json(d)
    else:
        from rich.table import Table

        t = Table(title=f"restore of run {d['run_id']}" + (" (dry run)" if dry_run else ""))
        for col in ("bucket", "into", "backup", "restored", "skipped", "failed"):
            t.add_column(col, justify="right" if col in ("restored", "skipped", "failed")
                         else "left")
        for name, b in d["buckets"].items():
            r = b["restore"]
            counts = (["(bucket created first)"] * 3 if r is None
                      else [f"{sum(r[k].values()):,}" for k in ("restored", "skipped", "failed")])
            t.add_row(name, b["target"], b["backup"], *counts)
        console().print(t)
        verb = "would create" if dry_run else "created"
        if d["created_buckets"]:
            console().print(f"{verb} buckets: {', '.join(d['created_buckets'])}", markup=False)
        for name, b in d["buckets"].items():
            for line in _point_in_time_lines((b["restore"] or {}).get("point_in_time")):
                console().print(f"{name}: {line}", markup=False, soft_wrap=True)
        for name, change in d["configured_buckets"].items():
            console().print(f"{'would change' if dry_run else 'changed'} bucket {name}: "
                            + ", ".join(f"{k}={v}" for k, v in change.items()), markup=False)
        if d["users"] is not None:
            u = d["users"]
            console().print(f"{'would add' if dry_run else 'added'} users: "
                            f"{', '.join(u['users']) or 'none'}; groups: "
                            f"{', '.join(u['groups']) or 'none'}"
                            + (f"; kept: {', '.join(u['kept_users'])}" if u["kept_users"] else ""),
                            markup=False)
    if failed:
        raise typer.Exit(1)


def _point_in_time_lines(pit: dict | None) -> list[str]:
    """What a restore to a time says of its cuts: the time, the worst and median lag."""
    if not pit:
        return []
    lag = pit["lag"]
    out = [f"state as of {pit['to_time']}: each of {plural(len(pit['vbuckets']), 'vbucket')} "
           "at its last snapshot boundary at or before it"]
    if lag["vbuckets"]:
        out.append(f"cuts fell {lag['worst_seconds']:.3f} s before it at worst, "
                   f"{lag['median_seconds']:.3f} s at the median ({lag['vbuckets']} vbuckets"
                   " with data before it)")
    out.append(f"{lag['exact_vbuckets']} of {len(pit['vbuckets'])} exact: no change the "
               "archive holds between their cut and the time")
    if pit.get("gap"):
        out.append(f"the time fell in a gap ({pit['gap']['from']} to {pit['gap']['to']}, no "
                   "backup running): restored to the nearest boundaries before it")
    return out


def _report_restore(d: dict, json_out: bool, dry_run: bool) -> None:
    """The restore's result (exit status 1 when a write failed)."""
    if d["log"]:
        detail(f"log: {d['log']}")
    if json_out:
        print_json(d)
    else:
        _print_restore(d, dry_run)
    if sum(d["failed"].values()):
        raise typer.Exit(1)


def _print_restore(d: dict, dry_run: bool) -> None:
    """A restore's counts as a table, what it checked, and its collections and errors."""
    from rich.table import Table

    t = Table(title=f"restore of backup {d['backup_id']}" + (" (dry run)" if dry_run else ""))
    t.add_column("")
    for kind in ("mutation", "deletion", "expiration"):
        t.add_column(kind + "s", justify="right")
    for row in ("restored", "skipped", "failed"):
        t.add_row("would write" if (dry_run and row == "restored") else row,
                  *(f"{d[row][k]:,}" for k in ("mutation", "deletion", "expiration")))
    console().print(t)
    written = sum(d["restored"].values())
    console().print(f"{'read' if dry_run else 'restored'} {plural(written, 'item')} in "
                    f"{timing(d['seconds'], d['spark_startup_seconds'])}, "
                    f"{human_rate(d['items_per_second'])} items/s", markup=False)
    for line in _restore_checks(d):
        console().print(line, markup=False, soft_wrap=True)
    for line in _point_in_time_lines(d.get("point_in_time")):
        console().print(line, markup=False, soft_wrap=True)
    colls = d.get("collections") or {}
    moved = [f"{a} -> {b}" for a, b in (colls.get("restored") or {}).items() if a != b]
    # the collections created were announced when they were made (a note): not again
    for label, names in (("would create on the target", colls.get("would_create")),
                         ("restored under other names", moved),
                         ("left out", colls.get("excluded"))):
        if names:
            console().print(f"{label}: {', '.join(names)}", markup=False)
    for e in d["errors"]:
        console(stderr=True).print(f"failed: {e}")
