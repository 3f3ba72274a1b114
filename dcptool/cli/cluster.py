"""`dcptool cluster`: make reference nodes one cluster, show it, fail a node over.

The maps go out with dcptool's admin opcodes (docs/protocol-extensions.md); every member
keeps the whole map and serves it with GET_CLUSTER_CONFIG.
"""
from __future__ import annotations

from typing import List, Optional

import typer
from rich.table import Table

from dcptool.cli.app import app
from dcptool.cli.connopts import (
    BucketOpt,
    CacertOpt,
    NoVerifyOpt,
    PasswordOpt,
    TimeoutOpt,
    UsernameOpt,
)
from dcptool.client.options import ConnOptions
from dcptool.cli.output import console, print_json
from dcptool.errors import DcptoolError, UsageError

cluster_app = typer.Typer(
    name="cluster",
    help="""Run several reference nodes as one cluster: replicas, failover.

    Example: dcptool cluster create -c 127.0.0.1:11210 -c 127.0.0.1:11211 --replicas 1
    """,
    no_args_is_help=True,
)
app.add_typer(cluster_app, name="cluster")

NodesOpt = typer.Option(..., "-c", "--cluster", metavar="URL",
                        help="A node (repeat for every member).")
STATE_NAMES = {1: "active", 2: "replica", 3: "pending", 4: "dead"}


def _opts(url, username, password, bucket, cacert, no_verify, timeout) -> ConnOptions:
    return ConnOptions.from_cli(url, username, password, bucket, cacert, no_verify, timeout)


def _doc(opts: ConnOptions, rev: int, nodes: list[str], this: int, vbmap, replicas: int,
         topology: str, services: list[dict] | None = None) -> dict:
    doc = {"rev": rev, "nodes": nodes, "this": this, "replicas": replicas,
           "topology": topology, "vbmap": vbmap,
           "auth": {"username": opts.username, "password": opts.password}}
    if services is not None:
        # each member's service ports (its REST port among them) as it told them in
        # CLUSTER_STATUS; {} for one that did not answer keeps what the last map said
        doc["services"] = services
    return doc


def _services(statuses: dict, n: int) -> list[dict]:
    return [dict((statuses.get(i) or {}).get("services") or {}) for i in range(n)]


@cluster_app.command("create")
def create(
    cluster: List[str] = NodesOpt,
    replicas: int = typer.Option(1, "--replicas", help="Replicas of each vbucket (0-3)."),
    topology: str = typer.Option("star", "--topology", metavar="star|chain",
                                 help="star: every replica streams from the active; chain: "
                                      "each replica streams from the previous copy."),
    as_json: bool = typer.Option(False, "--json", help="Print the map as JSON."),
    username: UsernameOpt = None,
    password: PasswordOpt = None,
    bucket: BucketOpt = "default",
    cacert: CacertOpt = None,
    no_verify: NoVerifyOpt = False,
    timeout: TimeoutOpt = 10.0,
) -> None:
    """Make the nodes one cluster: actives spread evenly, replicas on other nodes.

    Every node gets the whole map; a vbucket that is a replica on a node is fed over DCP
    from its active (its data there is replaced by the active's history).

    Example: dcptool cluster create -c 127.0.0.1:11210 -c 127.0.0.1:11211 -c 127.0.0.1:11212 --replicas 2
    """
    from dcptool.client.cluster import cluster_map, node_status, plan_map, set_map

    if len(set(cluster)) != len(cluster):
        raise UsageError("a node is named twice")
    if not 0 <= replicas <= 3:
        raise UsageError("--replicas must be between 0 and 3")
    if replicas >= len(cluster):
        raise UsageError(f"{replicas} replicas need at least {replicas + 1} nodes "
                         f"(-c given {len(cluster)} times)")
    if topology not in ("star", "chain"):
        raise UsageError("--topology must be star or chain")
    opts = [_opts(c, username, password, bucket, cacert, no_verify, timeout) for c in cluster]
    counts, revs, statuses = set(), [0], {}
    for i, o in enumerate(opts):
        with o.connect() as conn:
            counts.add(len(cluster_map(conn).vbmap))
            statuses[i] = node_status(conn)
            revs.append(int(statuses[i].get("rev") or 0))
    if len(counts) != 1:
        raise DcptoolError(f"the nodes hold different vbucket counts ({sorted(counts)})")
    nvb = counts.pop()
    vbmap = plan_map(len(opts), nvb, replicas)
    nodes = [o.address for o in opts]
    rev = max(revs) + 1
    services = _services(statuses, len(opts))
    for i, o in enumerate(opts):
        with o.connect() as conn:
            set_map(conn, _doc(o, rev, nodes, i, vbmap, replicas, topology, services))
    if as_json:
        print_json({"rev": rev, "nodes": nodes, "replicas": replicas, "topology": topology,
                    "vbmap": vbmap})
        return
    console().print(f"cluster of {len(nodes)} nodes, {nvb} vbuckets, {replicas} replica(s), "
                    f"map rev {rev}")


def _gather(opts: ConnOptions, username, password, bucket, cacert, no_verify, timeout):
    """(map view, {node index: status or None when unreachable})."""
    from dcptool.client.cluster import cluster_map, node_status
    from dcptool.client.errors import ClientError

    with opts.connect() as conn:
        view = cluster_map(conn)
    statuses: dict[int, dict | None] = {}
    for i, n in enumerate(view.nodes):
        try:
            o = _opts(n, username, password, bucket, cacert, no_verify, timeout)
            with o.connect() as conn:
                statuses[i] = node_status(conn)
        except ClientError:
            statuses[i] = None
    return view, statuses


@cluster_app.command("status")
def status(
    cluster: Optional[str] = typer.Option(None, "-c", "--cluster", envvar="DCPTOOL_CLUSTER",
                                          metavar="URL", help="Any member of the cluster."),
    as_json: bool = typer.Option(False, "--json", help="Print the status as JSON."),
    username: UsernameOpt = None,
    password: PasswordOpt = None,
    bucket: BucketOpt = "default",
    cacert: CacertOpt = None,
    no_verify: NoVerifyOpt = False,
    timeout: TimeoutOpt = 10.0,
) -> None:
    """Show the nodes, their vbuckets per state and their replication lag.

    The lag of a node is the sum, over its replica vbuckets, of how many seqnos the
    replica is behind its active.

    Example: dcptool cluster status -c 127.0.0.1:11210 --json
    """
    opts = _opts(cluster, username, password, bucket, cacert, no_verify, timeout)
    view, statuses = _gather(opts, username, password, bucket, cacert, no_verify, timeout)
    high: dict[int, dict[int, int]] = {}
    for i, st in statuses.items():
        if st:
            high[i] = {int(vb): d["high_seqno"] for vb, d in st["vbuckets"].items()}
    rows = []
    for i, n in enumerate(view.nodes):
        st = statuses.get(i)
        row = {"node": n, "up": st is not None, "active": 0, "replica": 0, "dead": 0,
               "lag": 0, "held": []}
        if st:
            for vb, d in st["vbuckets"].items():
                name = STATE_NAMES.get(d["state"], "dead")
                if name in row:
                    row[name] += 1
                if "hold" in d:
                    row["held"].append(int(vb))
                if d["state"] == 2 and int(vb) < len(view.vbmap):
                    act = view.vbmap[int(vb)][0]
                    if act >= 0 and act in high:
                        row["lag"] += max(0, high[act].get(int(vb), 0) - d["high_seqno"])
        rows.append(row)
    # the map's own rev (what `cluster create|failover|move` print); a node's config rev
    # also counts its own changes
    map_rev = view.map_rev or view.rev
    doc = {"rev": map_rev, "config_rev": view.rev, "vbuckets": len(view.vbmap), "nodes": rows}
    if as_json:
        print_json(doc)
        return
    table = Table(title=f"Cluster map rev {map_rev}, {len(view.vbmap)} vbuckets")
    for col in ("node", "up", "active", "replica", "dead", "lag"):
        table.add_column(col, justify="left" if col == "node" else "right")
    for r in rows:
        table.add_row(r["node"], "yes" if r["up"] else "DOWN", str(r["active"]),
                      str(r["replica"]), str(r["dead"]), str(r["lag"]))
    console().print(table)


@cluster_app.command("failover")
def failover(
    cluster: str = typer.Option(..., "-c", "--cluster", metavar="URL",
                                help="The node to fail over (it may be gone)."),
    via: Optional[str] = typer.Option(None, "--via", metavar="URL",
                                      help="A live member to read the map from (default: "
                                           "the first other member that answers)."),
    promote: Optional[str] = typer.Option(
        None, "--promote", metavar="URL",
        help="Promote this node's replicas rather than the ones with the highest seqno."),
    as_json: bool = typer.Option(False, "--json", help="Print the promotions as JSON."),
    username: UsernameOpt = None,
    password: PasswordOpt = None,
    bucket: BucketOpt = "default",
    cacert: CacertOpt = None,
    no_verify: NoVerifyOpt = False,
    timeout: TimeoutOpt = 10.0,
) -> None:
    """Take a node out of the cluster and promote replicas of the vbuckets active there.

    For each such vbucket the replica with the highest seqno becomes active (a new
    failover entry: a new history starts at its seqno); the other replicas stream from
    it and roll back where they were ahead.

    Example: dcptool cluster failover -c 127.0.0.1:11210 --via 127.0.0.1:11211
    """
    from dcptool.client.cluster import failover_map, set_map
    from dcptool.client.connection import parse_cluster_url
    from dcptool.client.errors import ClientError

    def norm(url: str) -> str:
        h, p, _tls = parse_cluster_url(url)
        return f"{h}:{p}"

    failed = norm(cluster)
    view = statuses = None
    tried = [via] if via else []
    for candidate in tried + [failed]:
        try:
            o = _opts(candidate, username, password, bucket, cacert, no_verify, timeout)
            view, statuses = _gather(o, username, password, bucket, cacert, no_verify, timeout)
            break
        except ClientError:
            continue
    if view is None:
        raise UsageError(f"cannot read the cluster map from {via or failed}",
                         hint="name a live member with --via")
    if failed not in view.nodes:
        raise UsageError(f"{failed} is not a member of the cluster ({', '.join(view.nodes)})")
    fi = view.nodes.index(failed)
    seqnos = {i: {int(vb): d["high_seqno"] for vb, d in st["vbuckets"].items()
                  if d["state"] == 2}
              for i, st in statuses.items() if st and i != fi}
    if promote is not None:
        pn = norm(promote)
        if pn not in view.nodes or view.nodes.index(pn) == fi:
            raise UsageError(f"--promote {promote}: not another member of the cluster")
        pi = view.nodes.index(pn)
        for vb in seqnos.get(pi, {}):
            seqnos[pi][vb] = 1 << 62
    vbmap, promoted = failover_map([list(c) for c in view.vbmap], fi, seqnos)
    nodes = list(view.nodes)
    rev = max(int(st.get("rev") or 0) for st in statuses.values() if st) + 1
    replicas = max(len(c) for c in vbmap) - 1
    topology = next((st.get("topology") for st in statuses.values() if st), None) or "star"
    order = sorted((i for i in statuses if i != fi and statuses[i]),
                   key=lambda i: i not in promoted.values())
    services = _services(statuses, len(nodes))
    for i in order:
        o = _opts(nodes[i], username, password, bucket, cacert, no_verify, timeout)
        with o.connect() as conn:
            set_map(conn, _doc(o, rev, nodes, i, vbmap, replicas, topology, services))
    doc = {"rev": rev, "failed": failed,
           "promoted": {str(vb): nodes[n] for vb, n in sorted(promoted.items())}}
    if as_json:
        print_json(doc)
        return
    console().print(f"{failed} failed over; {len(promoted)} vbucket(s) promoted; map rev {rev}")


@cluster_app.command("move")
def move(
    cluster: List[str] = typer.Option(..., "-c", "--cluster", metavar="URL",
                                      help="A member of the cluster (repeat to name more; "
                                           "the first that answers gives the map)."),
    vbuckets: str = typer.Option(..., "--vbuckets", metavar="SPEC",
                                 help="The vbuckets to move, e.g. 0-3,7 (all: every vbucket "
                                      "not already active on --to)."),
    to: str = typer.Option(..., "--to", metavar="URL",
                           help="The member that becomes their active node."),
    vbucket_timeout: float = typer.Option(600.0, "--vbucket-timeout", metavar="SECONDS",
                                          help="Give up on a vbucket whose takeover takes "
                                               "longer."),
    as_json: bool = typer.Option(False, "--json", help="Print the moves as JSON."),
    username: UsernameOpt = None,
    password: PasswordOpt = None,
    bucket: BucketOpt = "default",
    cacert: CacertOpt = None,
    no_verify: NoVerifyOpt = False,
    timeout: TimeoutOpt = 10.0,
) -> None:
    """Move the active copy of vbuckets to another member, without a history branch.

    For each vbucket the destination opens a takeover stream from the current active,
    receives everything, and the SET_VBUCKET_STATE handshake hands the vbucket over: the
    old active stops taking writes (NOT_MY_VBUCKET) before it sends its last changes, the
    destination becomes active at the same seqno with the same failover log (no new
    entry, so no client has to roll back). Then every member gets the new map: the old
    active becomes a replica where the destination held one, otherwise it leaves the
    vbucket's chain; the other replicas stream from the new active.

    Example: dcptool cluster move -c 127.0.0.1:11210 --vbuckets 0-3 --to 127.0.0.1:11211
    """
    from dataclasses import replace

    from dcptool.client.vbspec import format_vbuckets, parse_vbuckets
    from dcptool.client.cluster import move_map, set_map, take_over
    from dcptool.client.connection import parse_cluster_url
    from dcptool.client.errors import ClientError

    def norm(url: str) -> str:
        h, p, _tls = parse_cluster_url(url)
        return f"{h}:{p}"

    if vbucket_timeout <= 0:
        raise UsageError("--vbucket-timeout must be positive")
    view = statuses = None
    for candidate in cluster:
        try:
            o = _opts(candidate, username, password, bucket, cacert, no_verify, timeout)
            view, statuses = _gather(o, username, password, bucket, cacert, no_verify, timeout)
            break
        except ClientError:
            continue
    if view is None:
        raise DcptoolError(f"cannot read the cluster map from {', '.join(cluster)}",
                           hint="name a live member with -c")
    if not view.clustered or not statuses or all(not (st or {}).get("rev") for st in
                                                 statuses.values()):
        raise UsageError(f"{cluster[0]} is not a member of a cluster",
                         hint="make one with dcptool cluster create")
    dest = norm(to)
    if dest not in view.nodes:
        raise UsageError(f"--to {to}: not a member of the cluster ({', '.join(view.nodes)})")
    ti = view.nodes.index(dest)
    down = [view.nodes[i] for i, st in statuses.items() if st is None]
    if down:
        raise DcptoolError(f"{', '.join(down)} does not answer: every member must get the "
                           f"new map", hint="fail it over first (dcptool cluster failover)")
    nvb = len(view.vbmap)
    vbs = parse_vbuckets(vbuckets, limit=nvb)
    if vbs is None:
        vbs = [vb for vb in range(nvb) if view.vbmap[vb][0] != ti]
    for vb in vbs:
        act = view.vbmap[vb][0]
        if act < 0:
            raise DcptoolError(f"vbucket {vb} is not active on any node",
                               hint="fail over or recreate the cluster first")
        if act == ti:
            raise UsageError(f"vbucket {vb} is already active on {dest}")
        state = statuses[act]["vbuckets"].get(str(vb), {}).get("state")
        if state != 1:
            raise DcptoolError(f"vbucket {vb} is not active on {view.nodes[act]}, the node the "
                               f"map names (state {STATE_NAMES.get(state, state)})",
                               hint="send the map again (dcptool cluster create) or fail over")
    nodes = list(view.nodes)
    vbmap = [list(c) for c in view.vbmap]
    rev = max(int(st.get("rev") or 0) for st in statuses.values())
    replicas = max(len(c) for c in vbmap) - 1
    topology = next((st.get("topology") for st in statuses.values() if st), None) or "star"
    services = _services(statuses, len(nodes))

    def push(rev_: int, vbmap_: list[list[int]]) -> None:
        # the destination first: it is the vbucket's active already
        for i in sorted(range(len(nodes)), key=lambda i: i != ti):
            o = _opts(nodes[i], username, password, bucket, cacert, no_verify, timeout)
            with o.connect() as conn:
                set_map(conn, _doc(o, rev_, nodes, i, vbmap_, replicas, topology, services))

    dest_opts = _opts(dest, username, password, bucket, cacert, no_verify, timeout)
    dest_opts = replace(dest_opts, timeout=max(timeout, vbucket_timeout + 30.0))
    out = console()
    moved = []
    for vb in vbs:
        src = vbmap[vb][0]
        if not as_json:
            out.print(f"vbucket {vb}: {nodes[src]} -> {dest} ...")
        try:
            with dest_opts.connect() as conn:
                summary = take_over(conn, vb, nodes[src], timeout=vbucket_timeout)
        except ClientError as exc:
            # give the source and the destination the current map again: a source whose
            # copy went dead before the handshake ended becomes active again
            try:
                push(rev, vbmap)
            except ClientError:
                pass
            before = [m["vbucket"] for m in moved]
            done = f" (moved before it: {format_vbuckets(before)})" if before else ""
            raise DcptoolError(f"moving vbucket {vb} to {dest} failed: {exc}{done}") from None
        rev += 1
        vbmap = move_map(vbmap, [vb], ti)
        push(rev, vbmap)
        moved.append({"vbucket": vb, "from": nodes[src], "to": dest,
                      "high_seqno": summary.get("high_seqno"),
                      "items": summary.get("items"), "start_seqno": summary.get("start_seqno"),
                      "failover_log": summary.get("failover_log"),
                      "seconds": summary.get("seconds")})
        if not as_json:
            out.print(f"vbucket {vb}: active on {dest} at seqno {summary.get('high_seqno')} "
                      f"({summary.get('items')} items streamed, {summary.get('seconds')} s); "
                      f"map rev {rev}")
    doc = {"rev": rev, "to": dest, "moved": moved}
    if as_json:
        print_json(doc)
        return
    out.print(f"{len(moved)} vbucket(s) moved to {dest}; map rev {rev}")
