"""`dcptool node`: run the reference node and ask about it."""
from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from dcptool.cli.app import app
from dcptool.cli.manual import manual
from dcptool.errors import DcptoolError, UsageError


manual(
    "node",
    exit_codes=(3,),
    exit_note="node start: 0 after a clean stop on SIGTERM or SIGINT; 1 when it cannot listen on "
              "the address; 3 when another running node holds the data directory.",
    files=(
        ("DIR/data.sqlite3", "The node's documents, tombstones, seqnos and failover logs."),
        ("DIR/users.json", "Users and their SCRAM secrets (mode 0600; no clear passwords)."),
        ("DIR/node.json", "Address and pid of the running node (read by node status)."),
        ("DIR/logs/node.log", "The node's log (mode 0600), rotated at 16 MiB; node.log.1 to "
                              "node.log.5 are the older ones."),
    ),
    see_also=("doc", "failover-log", "tail", "quickstart", "cluster"),
)


node_app = typer.Typer(
    name="node",
    help="""Run dcptool's reference node: a memcached-protocol server that speaks DCP.

    The node keeps its database, users and logs in one directory (--data) and logs to
    DIR/logs/node.log as well as to stderr.

    Example: DCPTOOL_PASSWORD=secret dcptool node start --data /var/lib/dcptool/node
    """,
    no_args_is_help=True,
)
app.add_typer(node_app, name="node")


# the options of `node start` (one type each, so that its signature reads as a list)
_DataOpt = Annotated[Path, typer.Option(
    "--data", metavar="DIR", help="Directory for the node's database, users, node.json and "
                                  "logs.")]
_HostOpt = Annotated[str, typer.Option("--host", help="Address to listen on.")]
_PortOpt = Annotated[int, typer.Option("--port", help="TCP port (0 picks a free one).")]
_VbucketsOpt = Annotated[int, typer.Option(
    "--vbuckets", help="Number of vbuckets (fixed once created).")]
_BucketOpt = Annotated[str, typer.Option("--bucket", help="Bucket name.")]
_UsernameOpt = Annotated[str, typer.Option(
    "--username", help="User to create or update.")]
_PasswordOpt = Annotated[Optional[str], typer.Option(
    "--password", help="Password for --username (default: $DCPTOOL_PASSWORD).")]
_PasswordFileOpt = Annotated[Optional[Path], typer.Option(
    "--password-file", metavar="FILE", envvar="DCPTOOL_PASSWORD_FILE",
    help="Read the password for --username from FILE's first line.")]
_CheckpointMemoryOpt = Annotated[str, typer.Option(
    "--checkpoint-memory", metavar="SIZE", help="Memory budget of DCP "
                                                "checkpoints; slow cursors are dropped "
                                                "above it.")]
_CheckpointMaxItemsOpt = Annotated[int, typer.Option(
    "--checkpoint-max-items", help="Items per checkpoint before a new one opens.")]
_FlushIntervalOpt = Annotated[float, typer.Option(
    "--flush-interval", metavar="SECONDS", help="Seconds between flusher batches "
                                                "(disk snapshots).")]
_ExpiryPagerIntervalOpt = Annotated[float, typer.Option(
    "--expiry-pager-interval", metavar="SECONDS", help="Seconds between expiry "
                                                       "pager runs.")]
_MaxBackfillsOpt = Annotated[int, typer.Option(
    "--max-backfills", help="Concurrent disk backfills.")]
_PurgeAgeOpt = Annotated[str, typer.Option(
    "--purge-age", metavar="DURATION", help="Tombstones younger than this are never "
                                            "purged (metadata purge age; 0 for tests). "
                                            "Older ones are purged only up to the lowest "
                                            "live high watermark.")]
_CompactionIntervalOpt = Annotated[str, typer.Option(
    "--compaction-interval", metavar="DURATION|off",
    help="Compact every vbucket (purge tombstones) this often; off: only on "
         "COMPACT_DB.")]
_HwtMaxHoldOpt = Annotated[str, typer.Option(
    "--hwt-max-hold", metavar="DURATION|off", help="A high watermark that keeps a "
                                                   "purgeable tombstone longer than this is "
                                                   "marked lost and stops holding the "
                                                   "purger back.")]
_NoHwtOpt = Annotated[bool, typer.Option(
    "--no-hwt", hidden=True, help="Answer the HWT opcodes UNKNOWN_COMMAND, like a "
                                  "Couchbase Server (for tests).")]
_NoCollectionsOpt = Annotated[bool, typer.Option(
    "--no-collections", hidden=True, help="Answer like a data node without collections "
                                          "(Couchbase Server 6.x): only the default "
                                          "collection is reachable (for tests).")]
_TlsCertOpt = Annotated[Optional[Path], typer.Option(
    "--tls-cert", metavar="FILE", help="PEM certificate chain: also serve TLS (1.2 "
                                       "or later) on --tls-port.")]
_TlsKeyOpt = Annotated[Optional[Path], typer.Option(
    "--tls-key", metavar="FILE", help="PEM private key of --tls-cert.")]
_TlsPortOpt = Annotated[int, typer.Option(
    "--tls-port", help="TLS port with --tls-cert (0 picks a free one).")]
_ClientCaOpt = Annotated[Optional[Path], typer.Option(
    "--client-ca", metavar="FILE", help="PEM CA certificate(s): the TLS listeners "
                                        "(KV and REST) accept client certificates it "
                                        "signed, logging the client in as the user the "
                                        "certificate names (--client-auth; default its "
                                        "subject CN), without a password.")]
_ClientAuthOpt = Annotated[Optional[Path], typer.Option(
    "--client-auth", metavar="FILE", help="JSON rules naming a client certificate's "
                                          "user, Couchbase Server's format: {\"state\": "
                                          "\"enable\"|\"mandatory\", \"prefixes\": "
                                          "[{\"path\": \"subject.cn\"|\"san.uri\"|"
                                          "\"san.dnsname\"|\"san.email\", \"prefix\": "
                                          "\"\", \"delimiter\": \"\"}]} "
                                          "(docs/compatibility.md).")]
_RestPortOpt = Annotated[Optional[int], typer.Option(
    "--rest-port", metavar="PORT", help="Management REST port (HTTP; 0 picks a free "
                                        "one). Default: 8091 when --port is 11210, a free "
                                        "port otherwise (docs/rest.md).")]
_RestTlsPortOpt = Annotated[Optional[int], typer.Option(
    "--rest-tls-port", metavar="PORT", help="HTTPS REST port with --tls-cert (0 "
                                            "picks a free one). Default: 18091 when --port "
                                            "is 11210, a free port otherwise.")]
_MaxConnectionsOpt = Annotated[int, typer.Option(
    "--max-connections", help="Client connections at once; a connection above it is "
                              "closed as soon as it is accepted (counted in STAT "
                              "rejected_conns).")]
_MaxBodyOpt = Annotated[str, typer.Option(
    "--max-body", metavar="SIZE", help="Largest request body; a larger one is "
                                       "answered E2BIG and dropped unread.")]
_MaxPendingOutputOpt = Annotated[str, typer.Option(
    "--max-pending-output", metavar="SIZE", help="Unsent replies one connection "
                                                 "may pile up; above it the node stops "
                                                 "reading that connection's requests until "
                                                 "they drain (DCP streams pause at half).")]
_StuckTimeoutOpt = Annotated[str, typer.Option(
    "--stuck-timeout", metavar="DURATION|off", help="Close a connection held back "
                                                    "by --max-pending-output whose replies "
                                                    "do not drain at all for this long.")]
_AuthTimeoutOpt = Annotated[str, typer.Option(
    "--auth-timeout", metavar="DURATION|off", help="Close a connection that has "
                                                   "not authenticated this long after "
                                                   "connecting.")]
_MaxInputMemoryOpt = Annotated[Optional[str], typer.Option(
    "--max-input-memory", metavar="SIZE",
    help="Memory all connections may hold at once for large requests (64 KiB or "
         "more) still arriving; a connection whose request does not fit stops "
         "reading until others complete. Default: 256MiB, or 4 x --max-body when "
         "that is larger.")]
_MaxUnauthConnectionsOpt = Annotated[Optional[int], typer.Option(
    "--max-unauth-connections", metavar="N",
    help="Connections not logged in yet at once; above it the oldest of them is "
         "closed (STAT conns_closed_unauth_limit). Default: 1024, at most half of "
         "--max-connections.")]
_MaxUnauthPerAddressOpt = Annotated[Optional[int], typer.Option(
    "--max-unauth-per-address", metavar="N",
    help="Connections not logged in yet from one client address; above it that "
         "address's oldest is closed. Default: 256, at most "
         "--max-unauth-connections.")]
_AuthFailureDelayOpt = Annotated[str, typer.Option(
    "--auth-failure-delay", metavar="DURATION|off",
    help="After 3 failed logins in a row of a user or from an address (KV and "
         "REST), its next attempt waits 250ms, doubling per failure up to this; "
         "off: no delay.")]
_EvictionOpt = Annotated[str, typer.Option(
    "--eviction", metavar="value|full", help="value: every document stays in "
                                             "memory. full: only documents not yet on disk "
                                             "and as many others as fit in --memory-quota; "
                                             "the rest are read from disk when asked for "
                                             "(docs/eviction.md).")]
_MemoryQuotaOpt = Annotated[str, typer.Option(
    "--memory-quota", metavar="SIZE", help="Resident documents (keys, values and "
                                           "metadata) with --eviction full; ignored with "
                                           "value eviction.")]
_LogLevelOpt = Annotated[str, typer.Option(
    "--log-level", metavar="debug|info|warning|error",
    help="Least severity logged on stderr (DIR/logs/node.log also gets info).")]


@node_app.command("start")
def start(
    data: _DataOpt,
    host: _HostOpt = "127.0.0.1",
    port: _PortOpt = 11210,
    vbuckets: _VbucketsOpt = 1024,
    bucket: _BucketOpt = "default",
    username: _UsernameOpt = "Administrator",
    password: _PasswordOpt = None,
    password_file: _PasswordFileOpt = None,
    checkpoint_memory: _CheckpointMemoryOpt = "256MiB",
    checkpoint_max_items: _CheckpointMaxItemsOpt = 10000,
    flush_interval: _FlushIntervalOpt = 0.02,
    expiry_pager_interval: _ExpiryPagerIntervalOpt = 10.0,
    max_backfills: _MaxBackfillsOpt = 8,
    purge_age: _PurgeAgeOpt = "3d",
    compaction_interval: _CompactionIntervalOpt = "off",
    hwt_max_hold: _HwtMaxHoldOpt = "30d",
    no_hwt: _NoHwtOpt = False,
    no_collections: _NoCollectionsOpt = False,
    tls_cert: _TlsCertOpt = None,
    tls_key: _TlsKeyOpt = None,
    tls_port: _TlsPortOpt = 11207,
    client_ca: _ClientCaOpt = None,
    client_auth: _ClientAuthOpt = None,
    rest_port: _RestPortOpt = None,
    rest_tls_port: _RestTlsPortOpt = None,
    max_connections: _MaxConnectionsOpt = 4096,
    max_body: _MaxBodyOpt = "21MiB",
    max_pending_output: _MaxPendingOutputOpt = "8MiB",
    stuck_timeout: _StuckTimeoutOpt = "60s",
    auth_timeout: _AuthTimeoutOpt = "10s",
    max_input_memory: _MaxInputMemoryOpt = None,
    max_unauth_connections: _MaxUnauthConnectionsOpt = None,
    max_unauth_per_address: _MaxUnauthPerAddressOpt = None,
    auth_failure_delay: _AuthFailureDelayOpt = "5s",
    eviction: _EvictionOpt = "value",
    memory_quota: _MemoryQuotaOpt = "64MiB",
    log_level: _LogLevelOpt = "warning",
) -> None:
    """Run a node in the foreground until SIGTERM or SIGINT.

    Prints "listening on HOST:PORT" once it accepts connections (and, with --tls-cert,
    "listening (tls) on HOST:PORT" next), then "rest on http://HOST:PORT" for the
    management REST port (and, with --tls-cert, "rest on https://HOST:PORT"): the part of
    Couchbase Server's REST API that tools and SDKs read, same users and roles
    (docs/rest.md). DIR/node.json records the ports. The first start creates
    the user (--username, --password or DCPTOOL_PASSWORD) with the admin role; later starts
    reuse the stored users unless a password is given again (the user's roles stay). Other
    users: 'dcptool node user'.

    Example: DCPTOOL_PASSWORD=secret dcptool node start --data ./node --port 11210
    """
    from dcptool.node.config import NodeConfig, parse_duration, parse_size

    level = _log_level(log_level)
    config = NodeConfig(
        data_dir=data, host=host, port=port, vbuckets=vbuckets, bucket=bucket,
        checkpoint_memory=parse_size(checkpoint_memory, what="--checkpoint-memory"),
        checkpoint_max_items=checkpoint_max_items, flush_interval=flush_interval,
        expiry_pager_interval=expiry_pager_interval, max_backfills=max(1, max_backfills),
        purge_age=parse_duration(purge_age, what="--purge-age"),
        compaction_interval=parse_duration(compaction_interval, what="--compaction-interval",
                                           allow_off=True),
        hwt_max_hold=parse_duration(hwt_max_hold, what="--hwt-max-hold", allow_off=True),
        hwt_enabled=not no_hwt, collections_enabled=not no_collections, tls_cert=tls_cert, tls_key=tls_key, tls_port=tls_port,
        client_ca=client_ca, client_auth=client_auth,
        rest_port=rest_port, rest_tls_port=rest_tls_port,
        max_connections=max_connections,
        max_body=parse_size(max_body, what="--max-body"),
        max_pending_output=parse_size(max_pending_output, what="--max-pending-output"),
        stuck_timeout=parse_duration(stuck_timeout, what="--stuck-timeout", allow_off=True),
        auth_timeout=parse_duration(auth_timeout, what="--auth-timeout", allow_off=True),
        max_input_memory=(parse_size(max_input_memory, what="--max-input-memory")
                          if max_input_memory is not None else None),
        max_unauth_connections=max_unauth_connections,
        max_unauth_per_address=max_unauth_per_address,
        auth_failure_delay=parse_duration(auth_failure_delay, what="--auth-failure-delay",
                                          allow_off=True),
        eviction=eviction.strip().lower(),
        memory_quota=parse_size(memory_quota, what="--memory-quota"),
    )
    config.validate()
    if not username:
        raise UsageError("--username must not be empty")
    lock = _own_data_dir(data)
    _setup_logging(data, level)
    users = _start_users(data, username, _cli_password(password, password_file))
    _run_until_stopped(config, users, lock)


def _log_level(name: str) -> int:
    """--log-level as a logging level."""
    level = getattr(logging, name.upper(), None)
    if not isinstance(level, int):
        raise UsageError(f"--log-level {name!r} is not one of debug, info, warning, error")
    return level


def _own_data_dir(data: Path):
    """Create the data directory for its owner only, and take its one-node lock (held
    until this process ends; taken before anything in it is touched)."""
    if data.exists() and not data.is_dir():
        raise UsageError(f"--data {data} exists and is not a directory")
    # the node's files (database, users, cluster map with replication credentials, logs)
    # are its owner's only: DIR 0700 and, whatever the umask, files 0600
    os.umask(os.umask(0o077) | 0o077)
    try:
        data.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(data, 0o700)
    except OSError as exc:
        raise DcptoolError(f"cannot create {data}: {exc.strerror}") from None
    from dcptool.node.datalock import DataDirLock

    return DataDirLock(data).acquire()


def _start_users(data: Path, username: str, password: Optional[str]):
    """The node's users: the stored ones, with `username`'s password set when one is given
    (the first start must give one)."""
    from dcptool.node.auth import Users

    users = Users.load(data)
    if password is not None:
        if not password:
            raise UsageError("the password must not be empty")
        users.set_password(username, password)
        users.save()
    elif not users:
        raise UsageError(f"{data} has no users yet and no password was given",
                         hint="pass --password or set DCPTOOL_PASSWORD")
    return users


def _run_until_stopped(config, users, lock) -> None:
    """Run the node until SIGTERM or SIGINT; the log says why it stopped; the data
    directory's lock is released however it ends."""
    from dcptool.node.server import run_node

    host, port = config.host, config.port
    log = logging.getLogger("dcptool.node")
    log.info("starting: pid %d, data %s, %s:%d, bucket %s, %d vbuckets", os.getpid(),
             config.data_dir.absolute(), host, port, config.bucket, config.vbuckets)
    try:
        run_node(config, users)
    except OSError as exc:
        log.error("cannot listen on %s:%d: %s", host, port, exc.strerror or exc, extra=_FILE_ONLY)
        raise DcptoolError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    except DcptoolError as exc:
        log.error("stopped: %s", exc.message, extra=_FILE_ONLY)  # the CLI prints the error line
        raise
    except BaseException as exc:
        log.error("stopped by %s", type(exc).__name__, extra=_FILE_ONLY)
        raise
    finally:
        lock.release()
    log.info("exited (pid %d)", os.getpid())


def _cli_password(password: Optional[str], password_file: Optional[Path]) -> Optional[str]:
    """--password, else --password-file, else DCPTOOL_PASSWORD (DCPTOOL_PASSWORD_FILE is
    --password-file's variable: an explicit --password-file wins over DCPTOOL_PASSWORD)."""
    if password is None:
        password = os.environ.get("DCPTOOL_PASSWORD") or None
    if password_file is not None:
        from dcptool.cli.connopts import choose_password

        return choose_password(password, password_file)
    return password


#: a log record for node.log only: stderr gets the one-line error from the CLI instead
_FILE_ONLY = {"file_only": True}


def _setup_logging(data: Path, level: int) -> None:
    """stderr at --log-level, and DIR/logs/node.log (0600, rotated by size) at info or lower."""
    from dcptool.runlog import node_log_handler

    from dcptool.logsafe import one_line_formatter

    root = logging.getLogger()
    fmt = one_line_formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    err = logging.StreamHandler(sys.stderr)
    err.setLevel(level)
    err.setFormatter(fmt)
    err.addFilter(lambda record: not getattr(record, "file_only", False))
    root.addHandler(err)
    file_level = min(level, logging.INFO)
    try:
        fh = node_log_handler(data)
    except OSError as exc:
        print(f"dcptool: note: cannot write {data / 'logs'}: {exc.strerror or exc}; logging to "
              "stderr only", file=sys.stderr)
    else:
        fh.setLevel(file_level)
        root.addHandler(fh)
    root.setLevel(file_level)


@node_app.command("status")
def status(
    data: Annotated[Path, typer.Option("--data", metavar="DIR", help="The node's directory.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    username: Annotated[str, typer.Option(
        "--username", help="User for live figures from a running node.")] = "Administrator",
    password: Annotated[Optional[str], typer.Option(
        "--password", help="Password for live figures (default: $DCPTOOL_PASSWORD).")] = None,
    password_file: Annotated[Optional[Path], typer.Option(
        "--password-file", metavar="FILE", envvar="DCPTOOL_PASSWORD_FILE",
        help="Read the password for live figures from FILE's first line.")] = None,
) -> None:
    """Whether the node runs, its port, and per-vbucket seqnos and failover log heads.

    Reads DIR without a running node; with a password (--password or DCPTOOL_PASSWORD) it
    asks the running node for live figures.

    Example: dcptool node status --data ./node --json
    """
    from dcptool.node.status import node_status

    password = _cli_password(password, password_file)
    info = node_status(data, username=username, password=password)
    if as_json:
        from dcptool.cli.output import print_json

        print_json(info)
        return
    from rich.table import Table

    from dcptool.cli.output import console

    con = console()
    if info["running"]:
        con.print(f"running: yes (pid {info.get('pid')}, {info.get('host')}:{info.get('port')}, "
                  f"bucket {info.get('bucket')})")
    else:
        con.print("running: no")
    if info.get("live_error"):
        con.print(f"live figures unavailable: {info['live_error']}")
    logins = info.get("logins")
    if logins:
        con.print(f"failed logins: {logins.get('kv_failed', 0)} KV, "
                  f"{logins.get('rest_failed', 0)} REST; {logins.get('delayed', 0)} attempts "
                  f"delayed; {logins.get('unauthenticated_connections', 0)} connections not "
                  f"logged in ({logins.get('unauthenticated_closed', 0)} closed for room, "
                  f"{logins.get('auth_timeouts', 0)} timed out)")
    table = Table(title=f"vbuckets (from {info['source']})")
    for col in ("vb", "state", "high seqno", "persisted seqno", "purge seqno",
                "failover head uuid", "failover head seqno", "entries"):
        table.add_column(col, justify="right")
    states = {1: "active", 2: "replica", 3: "pending", 4: "dead"}
    for vb, d in info["vbuckets_detail"].items():
        head = d.get("failover_head") or [None, None]
        table.add_row(vb, states.get(d.get("state"), "?"), str(d.get("high_seqno", "")),
                      str(d.get("persisted_seqno", "")), str(d.get("purge_seqno", "")),
                      f"{head[0]:#x}" if head[0] is not None else "",
                      str(head[1] if head[1] is not None else ""),
                      str(d.get("failover_entries", "")))
    con.print(table)
    rows = info.get("hwt") or []
    if rows:
        by_state: dict[str, int] = {}
        for r in rows:
            by_state[r["state"]] = by_state.get(r["state"], 0) + 1
        con.print(f"high watermark table: {len(rows)} row{'s' if len(rows) != 1 else ''} ("
                  + ", ".join(f"{n} {st}" for st, n in sorted(by_state.items()))
                  + "); see 'dcptool watermark list'")
    else:
        con.print("high watermark table: empty")


user_app = typer.Typer(
    name="user",
    help="""Manage the node's users (in DIR/users.json). A running node applies a change
    within a second, to connections already open too (the DCP streams of a user who lost
    the backup role end), as Couchbase Server applies a role change. The REST port's
    /settings/rbac endpoints manage the same users and groups.

    Roles: admin (everything), backup (DCP streams, failover logs, watermarks), restore
    (the *_WITH_META writes), reader (GET), writer (SET, DELETE), scope_admin (scopes and
    collections); without a bucket they hold in every bucket, ROLE[BUCKET] in one. Couchbase
    Server's roles as it spells them: data_backup[BUCKET], data_reader[BUCKET],
    data_writer[BUCKET], data_dcp_reader[BUCKET], bucket_full_access[BUCKET],
    bucket_admin[BUCKET], scope_admin[BUCKET:SCOPE], replication_target[BUCKET],
    data_monitoring[BUCKET] (BUCKET * for every bucket), ro_admin, cluster_admin,
    security_admin. Every role may also read the bucket's layout (cluster config, seqnos,
    failover logs) and STAT. A user also holds the roles of its groups ('dcptool node
    group').

    Passwords are stored as salted SCRAM credentials only; they come from DCPTOOL_PASSWORD,
    --password-file or a prompt, never from the command line.

    Example: DCPTOOL_PASSWORD=secret dcptool node user add backup1 --role 'data_backup[travel]' --data ./node
    """,
    no_args_is_help=True,
)
node_app.add_typer(user_app, name="user")


def _read_password(password_file: Optional[Path], username: str) -> str:
    if password_file is not None:
        try:
            text = password_file.read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"--password-file {password_file}: {exc.strerror or exc}") from None
        lines = text.splitlines()
        password = lines[0] if lines else ""
    elif os.environ.get("DCPTOOL_PASSWORD"):
        password = os.environ["DCPTOOL_PASSWORD"]
    elif sys.stdin.isatty():
        import getpass

        try:
            password = getpass.getpass(f"Password for {username}: ")
            again = getpass.getpass(f"Password for {username} (again): ")
        except (EOFError, KeyboardInterrupt):
            raise UsageError("no password given") from None
        if password != again:
            raise UsageError("the passwords do not match")
    else:
        raise UsageError("no password given",
                         hint="set DCPTOOL_PASSWORD, pass --password-file FILE, or run on a "
                              "terminal to be prompted")
    if not password:
        raise UsageError("the password must not be empty")
    return password


def _load_users(data: Path, *, create: bool = False):
    from dcptool.node.auth import Users

    if not data.is_dir():
        if not create:
            raise UsageError(f"--data {data} is not a node directory")
        try:
            data.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise DcptoolError(f"cannot create {data}: {exc.strerror}") from None
    return Users.load(data)


@user_app.command("add")
def user_add(
    username: Annotated[str, typer.Argument(help="User name.")],
    data: Annotated[Path, typer.Option("--data", metavar="DIR", help="The node's directory.")],
    role: Annotated[Optional[list[str]], typer.Option(
        "--role", "-r", metavar="ROLE", help="Role: admin, backup, restore, reader, writer, "
                                             "scope_admin, or Couchbase's, e.g. "
                                             "data_backup[travel], data_reader[*], ro_admin "
                                             "(repeat, or comma-separate, for several).")] = None,
    group: Annotated[Optional[list[str]], typer.Option(
        "--group", "-g", metavar="GROUP", help="A group the user belongs to, holding its "
                                               "roles (repeat for several).")] = None,
    password_file: Annotated[Optional[Path], typer.Option(
        "--password-file", metavar="FILE", help="Read the password from FILE's first "
                                                "line (default: $DCPTOOL_PASSWORD or a prompt).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Create a user, or replace an existing user's password, roles and groups.

    Example: dcptool node user add restorer --role 'data_backup[travel]' --password-file pw.txt --data ./node
    """
    from dcptool.node.access import check_roles

    if not username or len(username) > 128 or any(c in username for c in "\x00\n\r"):
        raise UsageError("the user name must be 1 to 128 characters without NUL or newlines")
    try:
        roles = check_roles(role or [], allow_empty=bool(group))
    except ValueError as exc:
        raise UsageError(f"--role: {exc}") from None
    users = _load_users(data, create=True)
    try:
        groups = users.check_groups(group or [])
    except ValueError as exc:
        raise UsageError(f"--group: {exc}") from None
    password = _read_password(password_file, username)
    existed = username in users.users
    users.add(username, password, roles, groups)
    users.save()
    if as_json:
        from dcptool.cli.output import print_json

        print_json({"username": username, "roles": roles, "groups": groups,
                    "created": not existed})
        return
    held = ", ".join(roles + [f"group {g}" for g in groups])
    print(f"{'updated' if existed else 'added'} user {username} ({held})")


@user_app.command("remove")
def user_remove(
    username: Annotated[str, typer.Argument(help="User name.")],
    data: Annotated[Path, typer.Option("--data", metavar="DIR", help="The node's directory.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Remove a user.

    Example: dcptool node user remove backup1 --data ./node
    """
    users = _load_users(data)
    if not users.remove(username):
        raise DcptoolError(f"no user {username} in {data}")
    users.save()
    if as_json:
        from dcptool.cli.output import print_json

        print_json({"username": username, "removed": True})
        return
    print(f"removed user {username}")


@user_app.command("list")
def user_list(
    data: Annotated[Path, typer.Option("--data", metavar="DIR", help="The node's directory.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List the users, their roles and groups (never any credential).

    Example: dcptool node user list --data ./node --json
    """
    users = _load_users(data)
    rows = [{"username": name, "roles": users.roles(name), "groups": users.user_groups(name)}
            for name in sorted(users.users)]
    if as_json:
        from dcptool.cli.output import print_json

        print_json({"users": rows})
        return
    if not rows:
        print("no users")
    for row in rows:
        line = f"{row['username']}\t{','.join(row['roles'])}"
        if row["groups"]:
            line += f"\tgroups: {','.join(row['groups'])}"
        print(line)


group_app = typer.Typer(
    name="group",
    help="""Manage the node's user groups (in DIR/users.json, with the users). A user holds
    its own roles and those of every group it belongs to ('dcptool node user add --group').
    Roles as for 'dcptool node user'. A running node applies a change within a second.

    Example: dcptool node group add backups --role 'data_backup[*]' --data ./node
    """,
    no_args_is_help=True,
)
node_app.add_typer(group_app, name="group")


@group_app.command("add")
def group_add(
    name: Annotated[str, typer.Argument(help="Group name.")],
    data: Annotated[Path, typer.Option("--data", metavar="DIR", help="The node's directory.")],
    role: Annotated[Optional[list[str]], typer.Option(
        "--role", "-r", metavar="ROLE", help="Role of the group's members (repeat, or "
                                             "comma-separate, for several).")] = None,
    description: Annotated[str, typer.Option(
        "--description", metavar="TEXT", help="What the group is for.")] = "",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Create a group, or replace an existing group's roles and description.

    Example: dcptool node group add readers -r 'data_reader[travel]' --data ./node
    """
    from dcptool.node.access import BAD_GROUP, bad_name, check_roles

    if bad_name(name):
        raise UsageError(BAD_GROUP)
    try:
        roles = check_roles(role or [], what="group", allow_empty=True)
    except ValueError as exc:
        raise UsageError(f"--role: {exc}") from None
    users = _load_users(data, create=True)
    existed = name in users.groups
    users.set_group(name, roles, description)
    users.save()
    if as_json:
        from dcptool.cli.output import print_json

        print_json({"group": name, "roles": roles, "description": description,
                    "created": not existed})
        return
    print(f"{'updated' if existed else 'added'} group {name} ({', '.join(roles) or 'no roles'})")


@group_app.command("remove")
def group_remove(
    name: Annotated[str, typer.Argument(help="Group name.")],
    data: Annotated[Path, typer.Option("--data", metavar="DIR", help="The node's directory.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Remove a group; its members lose its roles.

    Example: dcptool node group remove readers --data ./node
    """
    users = _load_users(data)
    if not users.remove_group(name):
        raise DcptoolError(f"no group {name} in {data}")
    users.save()
    if as_json:
        from dcptool.cli.output import print_json

        print_json({"group": name, "removed": True})
        return
    print(f"removed group {name}")


@group_app.command("list")
def group_list(
    data: Annotated[Path, typer.Option("--data", metavar="DIR", help="The node's directory.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List the groups, their roles, descriptions and members.

    Example: dcptool node group list --data ./node --json
    """
    users = _load_users(data)
    rows = [{"group": g, "roles": users.group_roles(g),
             "description": users.groups[g].get("description", ""),
             "members": sorted(u for u in users.users if g in users.user_groups(u))}
            for g in sorted(users.groups)]
    if as_json:
        from dcptool.cli.output import print_json

        print_json({"groups": rows})
        return
    if not rows:
        print("no groups")
    for row in rows:
        print(f"{row['group']}\t{','.join(row['roles'])}\t{','.join(row['members'])}"
              f"\t{row['description']}")
