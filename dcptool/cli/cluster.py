"""`dcptool cluster`: make reference nodes one cluster, show it, fail a node over.

The maps go out with dcptool's admin opcodes (docs/protocol-extensions.md); every member
keeps the whole map of each bucket and serves it with GET_CLUSTER_CONFIG. Every bucket the
members share has its own map (same members, its own vbucket count and replicas);
`create`, `status` and `failover` work on each of them, `move` on the bucket `-b` selects.
"""
from __future__ import annotations

from typing import Annotated, List, Optional

import typer
from rich.table import Table

from dcptool.cli.app import app
from dcptool.cli.connopts import ConnArgs, connection_options
from dcptool.cli.manual import manual
from dcptool.cli.output import console, print_json
from dcptool.client.privileges import NODE_MANAGEMENT, PrivilegeError, check_privileges
from dcptool.client.vbmove import (
    STATE_NAMES,
    gather,
    map_doc,
    member_services,
    move_vbuckets,
    node_address,
)
from dcptool.errors import DcptoolError, UsageError


def _with_bucket(opts, name: str):
    """`opts` with bucket `name` selected."""
    from dataclasses import replace

    return replace(opts, bucket=name)


def _bucket_names(statuses, first: str) -> list[str]:
    """The buckets the members' statuses list, `first` (the one -b selects) first; a
    member without a bucket list (an older node) holds `first` only."""
    names: dict[str, None] = {first: None}
    for st in statuses.values():
        if st:
            names.update(dict.fromkeys(st.get("buckets") or {first: {}}))
    return list(names)


manual(
    "cluster",
    exit_note="1 when the user lacks the NodeManagement privilege (the admin role).",
    see_also=("node", "failover-log", "backup"),
)


cluster_app = typer.Typer(
    name="cluster",
    help="""Run several reference nodes as one cluster: replicas, failover.

    Example: dcptool cluster create -c 127.0.0.1:11210 -c 127.0.0.1:11211 --replicas 1
    """,
    no_args_is_help=True,
)
app.add_typer(cluster_app, name="cluster")

NodesOpt = Annotated[List[str], typer.Option(
    "-c", "--cluster", metavar="URL", help="A node (repeat for every member).")]


#: what the cluster commands do, for the error of a user who may not
MANAGE = "manage the cluster at"


def _check_first(conn_args: ConnArgs, urls) -> None:
    """Check NodeManagement on the first of `urls` that answers (a member may be down:
    the command says so itself when none answers)."""
    from dcptool.client.errors import ClientError

    for url in urls:
        try:
            check_privileges(conn_args.options(url), MANAGE, NODE_MANAGEMENT, bucket=False)
            return
        except PrivilegeError:
            raise
        except ClientError:
            continue


@cluster_app.command("create")
@connection_options(cluster=None, timeout=True)
def create(
    cluster: NodesOpt,
    replicas: Annotated[int, typer.Option(
        "--replicas", help="Replicas of each vbucket (0-3).")] = 1,
    topology: Annotated[str, typer.Option(
        "--topology", metavar="star|chain", help="star: every replica streams from "
                                                 "the active; chain: each replica streams from "
                                                 "the previous copy.")] = "star",
    as_json: Annotated[bool, typer.Option("--json", help="Print the map as JSON.")] = False,
    conn_args: ConnArgs = None,
) -> None:
    """Make the nodes one cluster: actives spread evenly, replicas on other nodes.

    Every node gets the whole map of every bucket the nodes share (each bucket its own
    map, with its own vbucket count; the --replicas count, or fewer where a bucket's
    replicaNumber says so). A vbucket that is a replica on a node is fed over DCP from its
    active (its data there is replaced by the active's history). A bucket some nodes lack,
    or with different vbucket counts, is refused. Buckets created or dropped later on a
    member are created or dropped on every member.

    Example: dcptool cluster create -c 127.0.0.1:11210 -c 127.0.0.1:11211 -c 127.0.0.1:11212 --replicas 2
    """
    from dcptool.client.topology import cluster_map, node_status, plan_map, set_map

    if len(set(cluster)) != len(cluster):
        raise UsageError("a node is named twice")
    if not 0 <= replicas <= 3:
        raise UsageError("--replicas must be between 0 and 3")
    if replicas >= len(cluster):
        raise UsageError(f"{replicas} replicas need at least {replicas + 1} nodes "
                         f"(-c given {len(cluster)} times)")
    if topology not in ("star", "chain"):
        raise UsageError("--topology must be star or chain")
    opts = [conn_args.options(c) for c in cluster]
    for o in opts:
        check_privileges(o, MANAGE, NODE_MANAGEMENT, bucket=False)
    counts, revs, statuses = set(), [0], {}
    for i, o in enumerate(opts):
        with o.connect() as conn:
            counts.add(len(cluster_map(conn).vbmap))
            statuses[i] = node_status(conn)
            revs.append(int(statuses[i].get("rev") or 0))
            revs.extend(int(b.get("rev") or 0)
                        for b in (statuses[i].get("buckets") or {}).values())
    if len(counts) != 1:
        raise DcptoolError(f"the nodes hold different vbucket counts ({sorted(counts)})")
    nvb = counts.pop()
    nodes = [o.address for o in opts]
    # the nodes' first bucket (--bucket) has the cluster's replica count whatever its
    # replicaNumber says
    first = next((n for n, b in (statuses[0].get("buckets") or {}).items() if b.get("first")),
                 opts[0].bucket)
    # every bucket the members share gets its own map; one some lack, or with different
    # vbucket counts, cannot be mapped: refused before any member changes
    plans: dict[str, tuple[int, list[list[int]]]] = {}
    for name in _bucket_names(statuses, first):
        held = {i: (statuses[i].get("buckets") or {first: {"vbuckets": nvb}}).get(name)
                for i in range(len(opts))}
        lacking = [nodes[i] for i, b in held.items() if b is None]
        if lacking:
            have = [nodes[i] for i, b in held.items() if b is not None]
            raise DcptoolError(f"bucket {name} is on {', '.join(have)} only, not on "
                               f"{', '.join(lacking)}: create or drop it so that every "
                               "member holds the same buckets")
        bcounts = {int(b.get("vbuckets", nvb)) for b in held.values()}
        if len(bcounts) != 1:
            raise DcptoolError(f"bucket {name} has different vbucket counts on the members "
                               f"({sorted(bcounts)})")
        reps = replicas
        if name != first:
            reps = min([replicas] + [int(b.get("replicaNumber", replicas))
                                     for b in held.values()])
        bvb = bcounts.pop()
        plans[name] = (reps, plan_map(len(opts), bvb, reps))
    rev = max(revs) + 1
    services = member_services(statuses, len(opts))
    for i, o in enumerate(opts):
        for name, (reps, bmap) in plans.items():
            with o.connect(bucket=name) as conn:
                set_map(conn, map_doc(o, rev, nodes, i, bmap, reps, topology, services))
    vbmap = plans[first][1]
    if as_json:
        print_json({"rev": rev, "nodes": nodes, "replicas": replicas, "topology": topology,
                    "vbmap": vbmap,
                    "buckets": {name: {"vbuckets": len(bmap), "replicas": reps, "vbmap": bmap}
                                for name, (reps, bmap) in plans.items()}})
        return
    out = console()
    out.print(f"cluster of {len(nodes)} nodes, {nvb} vbuckets, {replicas} replica(s), "
              f"map rev {rev}")
    for name, (reps, bmap) in plans.items():
        if name != first:
            out.print(f"bucket {name}: {len(bmap)} vbuckets, {reps} replica(s)")


@cluster_app.command("status")
@connection_options(cluster=None, timeout=True)
def status(
    cluster: Annotated[Optional[str], typer.Option(
        "-c", "--cluster", envvar="DCPTOOL_CLUSTER", metavar="URL",
        help="Any member of the cluster.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the status as JSON.")] = False,
    conn_args: ConnArgs = None,
) -> None:
    """Show the nodes, their vbuckets per state and their replication lag, bucket by
    bucket (the nodes failed over are listed last, as failed over).

    The lag of a node is the sum, over its replica vbuckets, of how many seqnos the
    replica is behind its active.

    Example: dcptool cluster status -c 127.0.0.1:11210 --json
    """
    opts = conn_args.options(cluster)
    check_privileges(opts, MANAGE, NODE_MANAGEMENT, bucket=False)
    view, statuses = gather(opts, conn_args.options)
    doc = _status_doc(view, statuses, conn_args)
    from dcptool.client.errors import ClientError

    others = {}
    for name in _bucket_names(statuses, opts.bucket)[1:]:
        try:
            bview, bstatuses = gather(_with_bucket(opts, name),
                                      lambda url, n=name: _with_bucket(conn_args.options(url), n))
        except ClientError:  # dropped meanwhile, or not on the member asked
            continue
        others[name] = _status_doc(bview, bstatuses, conn_args)
    doc["buckets"] = {opts.bucket: {k: doc[k] for k in ("rev", "config_rev", "vbuckets",
                                                         "nodes")}, **others}
    if as_json:
        print_json(doc)
        return
    out = console()
    for name, bdoc in doc["buckets"].items():
        title = f"Cluster map rev {bdoc['rev']}, {bdoc['vbuckets']} vbuckets"
        if name != opts.bucket:
            title = f"Bucket {name}: map rev {bdoc['rev']}, {bdoc['vbuckets']} vbuckets"
        _status_table(out, title, bdoc["nodes"])


def _status_doc(view, statuses, conn_args) -> dict:
    """The status of one bucket's map: its revs, vbucket count and a row per node."""
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
    # the nodes failed over out of the map (the members keep their names): shown apart
    from dcptool.client.errors import ClientError
    from dcptool.client.topology import node_status

    gone = next((st.get("failed") for st in statuses.values() if st), None) or []
    for f in gone:
        try:
            with conn_args.options(f["node"]).connect() as conn:
                node_status(conn)
            up = True
        except ClientError:
            up = False
        rows.append({"node": f["node"], "up": up, "failed_over": True, "active": 0,
                     "replica": 0, "dead": 0, "lag": 0, "held": []})
    for row in rows:
        row.setdefault("failed_over", False)
    # the map's own rev (what `cluster create|failover|move` print); a node's config rev
    # also counts its own changes
    map_rev = view.map_rev or view.rev
    return {"rev": map_rev, "config_rev": view.rev, "vbuckets": len(view.vbmap), "nodes": rows}


def _status_table(out, title: str, rows: list[dict]) -> None:
    table = Table(title=title)
    for col in ("node", "up", "active", "replica", "dead", "lag"):
        table.add_column(col, justify="left" if col == "node" else "right")
    for r in rows:
        state = "yes" if r["up"] else "DOWN"
        if r["failed_over"]:
            state = ("up, " if r["up"] else "") + "failed over"
        table.add_row(r["node"], state, str(r["active"]),
                      str(r["replica"]), str(r["dead"]), str(r["lag"]))
    out.print(table)


@cluster_app.command("failover")
@connection_options(cluster=None, timeout=True)
def failover(
    cluster: Annotated[str, typer.Option(
        "-c", "--cluster", metavar="URL", help="The node to fail over (it may be gone).")],
    via: Annotated[Optional[str], typer.Option(
        "--via", metavar="URL", help="A live member to read the map from (default: the "
                                     "first other member that answers).")] = None,
    promote: Annotated[Optional[str], typer.Option(
        "--promote", metavar="URL", help="Promote this node's replicas rather than the "
                                         "ones with the highest seqno.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the promotions as JSON.")] = False,
    conn_args: ConnArgs = None,
) -> None:
    """Take a node out of the cluster and promote replicas of the vbuckets active there.

    For each such vbucket of every bucket the replica with the highest seqno becomes
    active (a new failover entry: a new history starts at its seqno); the other replicas stream from
    it and roll back where they were ahead. The node leaves the bucket's map (clients
    stop using it at once); the REST port lists it as inactiveFailed.

    Example: dcptool cluster failover -c 127.0.0.1:11210 --via 127.0.0.1:11211
    """
    from dcptool.client.errors import ClientError
    from dcptool.client.topology import set_map

    failed = node_address(cluster)
    view = statuses = None
    tried = [via] if via else []
    _check_first(conn_args, tried + [failed])
    for candidate in tried + [failed]:
        try:
            o = conn_args.options(candidate)
            view, statuses = gather(o, conn_args.options)
            break
        except ClientError:
            continue
    if view is None:
        raise UsageError(f"cannot read the cluster map from {via or failed}",
                         hint="name a live member with --via")
    if failed not in view.nodes:
        raise UsageError(f"{failed} is not a member of the cluster ({', '.join(view.nodes)})")
    if promote is not None:
        pn = node_address(promote)
        if pn not in view.nodes or pn == failed:
            raise UsageError(f"--promote {promote}: not another member of the cluster")
    # every bucket has its own map: each is failed over with its own replicas' seqnos, and
    # every map gets the same new rev
    views = {o.bucket: (view, statuses)}
    for name in _bucket_names(statuses, o.bucket)[1:]:
        try:
            bview, bstatuses = gather(_with_bucket(o, name),
                                      lambda url, n=name: _with_bucket(conn_args.options(url), n))
        except ClientError:  # not on the member asked: nothing of it to fail over there
            continue
        if bview.clustered and failed in bview.nodes:
            views[name] = (bview, bstatuses)
    revs = [0]
    for _v, sts in views.values():
        for st in sts.values():
            if st:
                revs.append(int(st.get("rev") or 0))
                revs.extend(int(b.get("rev") or 0) for b in (st.get("buckets") or {}).values())
    rev = max(revs) + 1
    results = {}
    for name, (bview, bstatuses) in views.items():
        plan = _failover_plan(bview, bstatuses, failed, promote)
        for i in plan["order"]:
            bo = _with_bucket(conn_args.options(bview.nodes[i]), name)
            with bo.connect() as conn:
                set_map(conn, map_doc(bo, rev, plan["nodes"], plan["index"][i],
                                      plan["vbmap"], plan["replicas"], plan["topology"],
                                      plan["services"], plan["gone"]))
        results[name] = {str(vb): bview.nodes[n] for vb, n in sorted(plan["promoted"].items())}
    promoted = results[o.bucket]
    doc = {"rev": rev, "failed": failed, "promoted": promoted,
           "buckets": {name: {"promoted": p} for name, p in results.items()}}
    if as_json:
        print_json(doc)
        return
    out = console()
    out.print(f"{failed} failed over; {len(promoted)} vbucket(s) promoted; map rev {rev}")
    for name, p in results.items():
        if name != o.bucket:
            out.print(f"bucket {name}: {len(p)} vbucket(s) promoted")


def _failover_plan(view, statuses, failed: str, promote: str | None) -> dict:
    """One bucket's map once `failed` is out: its promotions, and the order the members
    get it (the promoted ones first)."""
    from dcptool.client.topology import failover_map

    fi = view.nodes.index(failed)
    seqnos = {i: {int(vb): d["high_seqno"] for vb, d in st["vbuckets"].items()
                  if d["state"] == 2}
              for i, st in statuses.items() if st and i != fi}
    if promote is not None:
        pn = node_address(promote)
        if pn in view.nodes and view.nodes.index(pn) != fi:
            pi = view.nodes.index(pn)
            for vb in seqnos.get(pi, {}):
                seqnos[pi][vb] = 1 << 62
    vbmap, promoted = failover_map([list(c) for c in view.vbmap], fi, seqnos)
    replicas = max(len(c) for c in vbmap) - 1
    topology = next((st.get("topology") for st in statuses.values() if st), None) or "star"
    services = member_services(statuses, len(view.nodes))
    # the failed node leaves the map (ns_server's failover): clients drop it at once; the
    # map keeps it in `failed` for the REST port's node list
    keep = [i for i in range(len(view.nodes)) if i != fi]
    index = {old: new for new, old in enumerate(keep)}
    nodes = [view.nodes[i] for i in keep]
    new_vbmap = [[index[n] if n >= 0 else -1 for n in chain] for chain in vbmap]
    gone = next((st.get("failed") for st in statuses.values() if st), None) or []
    gone = [f for f in gone if f.get("node") != failed] + [
        {"node": failed, "services": services[fi]}]
    order = sorted((i for i in statuses if i != fi and statuses[i]),
                   key=lambda i: i not in promoted.values())
    return {"nodes": nodes, "index": index, "vbmap": new_vbmap, "replicas": replicas,
            "topology": topology, "services": [services[j] for j in keep], "gone": gone,
            "order": order, "promoted": promoted}


@cluster_app.command("move")
@connection_options(cluster=None, timeout=True)
def move(
    cluster: Annotated[List[str], typer.Option(
        "-c", "--cluster", metavar="URL", help="A member of the cluster (repeat to name more; "
                                               "the first that answers gives the map).")],
    vbuckets: Annotated[str, typer.Option(
        "--vbuckets", metavar="SPEC", help="The vbuckets to move, e.g. 0-3,7 (all: every "
                                           "vbucket not already active on --to).")],
    to: Annotated[str, typer.Option(
        "--to", metavar="URL", help="The member that becomes their active node.")],
    vbucket_timeout: Annotated[float, typer.Option(
        "--vbucket-timeout", metavar="SECONDS", help="Give up on a vbucket whose "
                                                     "takeover takes longer.")] = 600.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the moves as JSON.")] = False,
    conn_args: ConnArgs = None,
) -> None:
    """Move the active copy of vbuckets of a bucket (-b) to another member, without a
    history branch.

    For each vbucket the destination opens a takeover stream from the current active,
    receives everything, and the SET_VBUCKET_STATE handshake hands the vbucket over: the
    old active stops taking writes (NOT_MY_VBUCKET) before it sends its last changes, the
    destination becomes active at the same seqno with the same failover log (no new
    entry, so no client has to roll back). Then every member gets the new map: the old
    active becomes a replica where the destination held one, otherwise it leaves the
    vbucket's chain; the other replicas stream from the new active.

    Example: dcptool cluster move -c 127.0.0.1:11210 --vbuckets 0-3 --to 127.0.0.1:11211
    """
    _check_first(conn_args, cluster)
    out = console()

    def before(vb: int, src: str, dest: str) -> None:
        if not as_json:
            out.print(f"vbucket {vb}: {src} -> {dest} ...")

    def after(moved: dict, rev: int) -> None:
        if not as_json:
            out.print(f"vbucket {moved['vbucket']}: active on {moved['to']} at seqno "
                      f"{moved['high_seqno']} ({moved['items']} items streamed, "
                      f"{moved['seconds']} s); map rev {rev}")

    doc = move_vbuckets(cluster, vbuckets, to,
                        conn_args.options, timeout=conn_args.timeout,
                        vbucket_timeout=vbucket_timeout,
                        before=before, after=after)
    if as_json:
        print_json(doc)
        return
    out.print(f"{len(doc['moved'])} vbucket(s) moved to {doc['to']}; map rev {doc['rev']}")
