"""Moving the active copy of vbuckets to another member of a cluster, and what the cluster
commands share: reading every member's status and building the map each member gets.

`move_vbuckets` is the whole move protocol: for each vbucket the destination takes it over
from the current active (VBUCKET_TAKEOVER: a takeover stream, then the SET_VBUCKET_STATE
handshake, docs/protocol-extensions.md), then every member gets the new map, the
destination first. On a failed takeover every member gets the current map again, so a
source whose copy went dead before the handshake ended becomes active again.

Members are named by URL; `member(url)` turns one into the `ConnOptions` to reach it (the
same credentials for every member).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Iterable

from dcptool.errors import DcptoolError, UsageError

from .connection import parse_cluster_url
from .errors import ClientError
from .options import ConnOptions
from .topology import ClusterView, cluster_map, move_map, node_status, set_map, take_over
from .vbspec import format_vbuckets, parse_vbuckets

#: vbucket states as CLUSTER_STATUS reports them
STATE_NAMES = {1: "active", 2: "replica", 3: "pending", 4: "dead"}

Member = Callable[[str], ConnOptions]


def node_address(url: str) -> str:
    """HOST:PORT of a member named by URL (the form the map lists)."""
    h, p, _tls = parse_cluster_url(url)
    return f"{h}:{p}"


def map_doc(opts: ConnOptions, rev: int, nodes: list[str], this: int, vbmap, replicas: int,
            topology: str, services: list[dict] | None = None,
            failed: list[dict] | None = None) -> dict:
    """The map document CLUSTER_SET_MAP sends to member `this` (`failed`: the nodes
    failed over out of the cluster, kept for the REST port's node list)."""
    doc = {"rev": rev, "nodes": nodes, "this": this, "replicas": replicas,
           "topology": topology, "vbmap": vbmap,
           "auth": {"username": opts.username, "password": opts.password}}
    if failed:
        doc["failed"] = failed
    if services is not None:
        # each member's service ports (its REST port among them) as it told them in
        # CLUSTER_STATUS; {} for one that did not answer keeps what the last map said
        doc["services"] = services
    return doc


def member_services(statuses: dict, n: int) -> list[dict]:
    """Each of `n` members' service ports from their statuses ({} for one that is down)."""
    return [dict((statuses.get(i) or {}).get("services") or {}) for i in range(n)]


def gather(opts: ConnOptions, member: Member) -> tuple[ClusterView, dict[int, dict | None]]:
    """(map view, {node index: status or None when unreachable})."""
    with opts.connect() as conn:
        view = cluster_map(conn)
    statuses: dict[int, dict | None] = {}
    for i, n in enumerate(view.nodes):
        try:
            o = member(n)
            with o.connect() as conn:
                statuses[i] = node_status(conn)
        except ClientError:
            statuses[i] = None
    return view, statuses


def move_vbuckets(members: Iterable[str], vbuckets: str, to: str, member: Member, *,
                  timeout: float, vbucket_timeout: float,
                  before: Callable[[int, str, str], None] | None = None,
                  after: Callable[[dict[str, Any], int], None] | None = None) -> dict[str, Any]:
    """Move the active copy of `vbuckets` (a spec like 0-3,7; "all": every vbucket not
    already active on `to`) to the member `to`.

    `members`: URLs of members to read the map from (the first that answers). `timeout`:
    the connections' timeout; the destination's is raised to cover `vbucket_timeout`, the
    longest one vbucket's takeover may take. `before(vb, source, dest)` is called before each
    takeover, `after(moved, rev)` after each vbucket's new map went out. Returns
    {"rev", "to", "moved": [{"vbucket", "from", "to", "high_seqno", "items", "start_seqno",
    "failover_log", "seconds"}, ...]}. Raises UsageError for a request that cannot be
    done, DcptoolError when the cluster is not in a state to do it or a takeover failed.
    """
    members = list(members)
    if vbucket_timeout <= 0:
        raise UsageError("--vbucket-timeout must be positive")
    view, statuses = _read_cluster(members, member)
    dest = node_address(to)
    if dest not in view.nodes:
        raise UsageError(f"--to {to}: not a member of the cluster ({', '.join(view.nodes)})")
    ti = view.nodes.index(dest)
    down = [view.nodes[i] for i, st in statuses.items() if st is None]
    if down:
        raise DcptoolError(f"{', '.join(down)} does not answer: every member must get the "
                           f"new map", hint="fail it over first (dcptool cluster failover)")
    vbs = _vbuckets_to_move(view, statuses, vbuckets, ti, dest)
    nodes = list(view.nodes)
    vbmap = [list(c) for c in view.vbmap]
    rev = max(int(st.get("rev") or 0) for st in statuses.values())
    push = _map_pusher(member, nodes, ti, statuses, replicas=max(len(c) for c in vbmap) - 1)
    dest_opts = member(dest)
    dest_opts = replace(dest_opts, timeout=max(timeout, vbucket_timeout + 30.0))
    moved: list[dict[str, Any]] = []
    for vb in vbs:
        src = vbmap[vb][0]
        if before is not None:
            before(vb, nodes[src], dest)
        summary = _take_over(dest_opts, vb, nodes[src], dest, vbucket_timeout, moved,
                             lambda: push(rev, vbmap))
        rev += 1
        vbmap = move_map(vbmap, [vb], ti)
        push(rev, vbmap)
        record = {"vbucket": vb, "from": nodes[src], "to": dest,
                  "high_seqno": summary.get("high_seqno"),
                  "items": summary.get("items"), "start_seqno": summary.get("start_seqno"),
                  "failover_log": summary.get("failover_log"),
                  "seconds": summary.get("seconds")}
        moved.append(record)
        if after is not None:
            after(record, rev)
    return {"rev": rev, "to": dest, "moved": moved}


def _read_cluster(members: list[str], member: Member):
    """The cluster map and every member's status, read from the first of `members` that
    answers; it must be a cluster."""
    view = statuses = None
    for candidate in members:
        try:
            o = member(candidate)
            view, statuses = gather(o, member)
            break
        except ClientError:
            continue
    if view is None:
        raise DcptoolError(f"cannot read the cluster map from {', '.join(members)}",
                           hint="name a live member with -c")
    if not view.clustered or not statuses or all(not (st or {}).get("rev") for st in
                                                 statuses.values()):
        raise UsageError(f"{members[0]} is not a member of a cluster",
                         hint="make one with dcptool cluster create")
    return view, statuses


def _vbuckets_to_move(view, statuses, vbuckets: str, ti: int, dest: str) -> list[int]:
    """The vbuckets of the spec `vbuckets` ("all": every one not active on `dest`, the
    member at index `ti`), each active on the member the map names."""
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
    return vbs


def _map_pusher(member: Member, nodes: list[str], ti: int, statuses, *, replicas: int
                ) -> Callable[[int, list[list[int]]], None]:
    """push(rev, vbmap): give every member the map, the destination (index `ti`) first:
    it is the vbucket's active already. The cluster's topology, services and failed
    members stay what the statuses say."""
    topology = next((st.get("topology") for st in statuses.values() if st), None) or "star"
    services = member_services(statuses, len(nodes))
    failed = next((st.get("failed") for st in statuses.values() if st), None) or []

    def push(rev: int, vbmap: list[list[int]]) -> None:
        for i in sorted(range(len(nodes)), key=lambda i: i != ti):
            o = member(nodes[i])
            with o.connect() as conn:
                set_map(conn, map_doc(o, rev, nodes, i, vbmap, replicas, topology, services,
                                      failed))
    return push


def _take_over(dest_opts: ConnOptions, vb: int, source: str, dest: str, vbucket_timeout: float,
               moved: list[dict[str, Any]], push_current: Callable[[], None]) -> dict[str, Any]:
    """The destination takes `vb` over from `source`: the takeover's summary. When it
    fails, every member gets the current map again (a source whose copy went dead before
    the handshake ended becomes active again) and the error names what moved before."""
    try:
        with dest_opts.connect() as conn:
            return take_over(conn, vb, source, timeout=vbucket_timeout)
    except ClientError as exc:
        try:
            push_current()
        except ClientError:
            pass
        done_before = [m["vbucket"] for m in moved]
        done = f" (moved before it: {format_vbuckets(done_before)})" if done_before else ""
        raise DcptoolError(f"moving vbucket {vb} to {dest} failed: {exc}{done}") from None
