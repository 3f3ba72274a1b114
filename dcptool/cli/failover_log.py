"""`dcptool failover-log`: print vbucket failover logs (GET_FAILOVER_LOG, no streams)."""
from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.table import Table

from dcptool.cli.app import app
from dcptool.cli.connopts import ConnArgs, connection_options
from dcptool.cli.manual import manual
from dcptool.cli.output import console, print_json
from dcptool.client import get_failover_logs, get_vbucket_seqnos
from dcptool.client.privileges import META_READ, check_privileges
from dcptool.client.vbspec import parse_vbuckets


manual(
    "failover-log",
    exit_note="1 when the user lacks the MetaRead privilege (every role holds it).",
    see_also=("tail", "node", "cluster"),
)


@app.command("failover-log")
@connection_options(timeout=True)
def failover_log(
    vbuckets: Annotated[Optional[str], typer.Option(
        "--vbuckets", metavar="LIST", help="vbuckets, e.g. 0-15,512 (default: all).")] = None,
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print {\"<vb>\": [{\"uuid\": N, \"seqno\": N}, ...]}.")] = False,
    conn_args: ConnArgs = None,
) -> None:
    """Print each vbucket's failover log, newest entry first.

    Each entry is a (vbucket uuid, seqno) pair: the history branch the vbucket started at
    that seqno. Uses GET_FAILOVER_LOG only; it opens no stream. On a member of a
    cluster each vbucket's log is read from its active node.

    Example: dcptool failover-log -c couchbase://127.0.0.1 --vbuckets 0-3 --json
    """
    vbs = parse_vbuckets(vbuckets)
    opts = conn_args.options()
    check_privileges(opts, "read the failover logs of", META_READ)
    from dcptool.pipeline.nodeinfo import active_nodes, node_opts

    with opts.connect(collections=True) as conn:  # the same answer with or without
        # a member of a cluster: each vbucket's log as its active node holds it
        found = active_nodes(opts, conn, vbs)
        if found is None:
            if vbs is None:
                vbs = sorted(get_vbucket_seqnos(conn))
            logs = get_failover_logs(conn, vbs)
    if found is not None:
        logs = {}
        for node, mine in sorted(found[1].items()):
            with node_opts(opts, node).connect() as conn:
                logs.update(get_failover_logs(conn, mine))
        vbs = sorted(logs) if vbs is None else [vb for vb in vbs if vb in logs]
    if as_json:
        print_json({str(vb): [{"uuid": u, "seqno": s} for u, s in logs[vb]] for vb in vbs})
        return
    table = Table(title=f"Failover logs of bucket '{opts.bucket}' on {opts.address}",
                  show_lines=False)
    table.add_column("vbucket", justify="right")
    table.add_column("entry", justify="right")
    table.add_column("uuid (hex)", justify="right", style="cyan")
    table.add_column("uuid", justify="right")
    table.add_column("seqno", justify="right", style="green")
    for vb in vbs:
        for i, (u, s) in enumerate(logs[vb]):
            table.add_row(str(vb) if i == 0 else "", str(i), f"0x{u:016x}", str(u), str(s),
                          end_section=(i == len(logs[vb]) - 1))
    console().print(table)
