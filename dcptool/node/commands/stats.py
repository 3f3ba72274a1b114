"""STAT groups real tools ask for: the default group, `vbucket-seqno`, `failovers`,
`vbucket`, `checkpoint`, `dcp` and `warmup`. Each stat is one response (key = name,
value = ASCII); an empty response ends the group."""
from __future__ import annotations

import os
import time

from dcptool import __version__
from dcptool.protocol.constants import Opcode, Status, VBucketState

from ..access import Privilege
from .common import command

_STATE_NAMES = {1: "active", 2: "replica", 3: "pending", 4: "dead"}


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


def default_stats(node, bucket=None) -> list[tuple[str, object]]:
    b = bucket or node.bucket
    totals = b.totals()
    active = sum(1 for vb in b.vbuckets.values() if vb.state == VBucketState.ACTIVE)
    replica = sum(1 for vb in b.vbuckets.values() if vb.state == VBucketState.REPLICA)
    now = time.time()
    return [
        ("pid", os.getpid()),
        ("uptime", int(now - node.started_at)),
        ("time", int(now)),
        ("version", f"7.6.0-dcptool-{__version__}"),
        ("curr_connections", len(node.connections)),
        ("total_connections", node.total_connections),
        ("max_connections", node.config.max_connections),
        ("rejected_conns", node.rejected_connections),
        ("auth_timeouts", node.auth_timeouts),
        ("conns_closed_stuck", node.stuck_closed),
        ("conns_closed_framing_lost", node.framing_lost),
        ("conn_output_holds", node.output_holds),
        ("frames_e2big", node.frames_too_big),
        ("frames_einval", node.bad_frames),
        ("auth_errors", node.auth_failures),
        ("rest_auth_errors", getattr(node, "rest_auth_failures", 0)),
        ("auth_delayed", node.login_guard.delayed if hasattr(node, "login_guard") else 0),
        ("curr_unauth_conns", len(getattr(node, "unauth", ()))),
        ("max_unauth_conns", getattr(node, "max_unauth", 0)),
        ("conns_closed_unauth_limit", getattr(node, "unauth_evicted", 0)),
        ("conns_closed_pre_auth_e2big", getattr(node, "pre_auth_too_big", 0)),
        ("input_reserved_bytes", getattr(node, "input_reserved", 0)),
        ("max_input_memory", getattr(node, "max_input_memory", 0)),
        ("conn_input_waits", getattr(node, "input_waits", 0)),
        ("curr_items", totals["curr_items"]),
        ("curr_temp_items", 0),
        ("ep_tombstones", totals["tombstones"]),
        ("vb_active_num", active),
        ("vb_replica_num", replica),
        ("ep_num_vbuckets", len(b.vbuckets)),
        ("ep_queue_size", len(b.storage.dirty)),
        ("ep_flusher_batches", b.storage.batches),
        ("ep_total_persisted", b.storage.items_written),
        ("ep_flusher_last_error", b.storage.last_error or ""),
        ("ep_checkpoint_memory", b.memory.used),
        ("ep_checkpoint_memory_budget", b.memory.budget),
        ("ep_cursors_dropped", b.memory.cursors_dropped),
        ("ep_write_throttles", node.write_throttles),
        ("ep_expired_pager", b.expired_by_pager),
        ("ep_dcp_producer_count", len(b.producers)),
        ("ep_dcp_backfills_running", node.backfills.running),
        ("ep_dcp_backfills_waiting", len(node.backfills.waiting)),
        ("mem_rss", _rss_bytes()),
    ] + b.eviction_stats() + purger_stats(b, now)


def purger_stats(b, now: float) -> list[tuple[str, object]]:
    """Compaction and the high watermark table (seed 002)."""
    p = b.purger
    counts = b.hwt.counts(now)
    return [
        ("ep_compactions", p.runs),
        ("ep_tombstones_purged", p.purged),
        ("ep_purge_age", p.purge_age),
        ("ep_compaction_interval", "off" if p.interval is None else p.interval),
        ("ep_hwt_max_hold", "off" if p.max_hold is None else p.max_hold),
        ("ep_hwt_entries", len(b.hwt)),
        ("ep_hwt_ok", counts["ok"]),
        ("ep_hwt_expired", counts["expired"]),
        ("ep_hwt_lost", counts["lost"]),
        ("ep_hwt_registrations", b.hwt.registrations),
        ("ep_last_compaction_purged", p.last.get("purged", 0)),
        ("ep_last_compaction_time", int(p.last.get("finished_at", 0))),
    ]


def _vb_filter(conn, arg: str):
    vbs = conn.bucket.vbuckets
    if not arg:
        return sorted(vbs.items())
    try:
        vbid = int(arg)
    except ValueError:
        return None
    if vbid not in vbs:
        return None
    return [(vbid, vbs[vbid])]


def vbucket_seqno_stats(vbs) -> list[tuple[str, object]]:
    out = []
    for vbid, vb in vbs:
        p = f"vb_{vbid}:"
        out += [
            (p + "high_seqno", vb.high_seqno),
            (p + "abs_high_seqno", vb.high_seqno),
            (p + "last_persisted_seqno", vb.persisted_seqno),
            (p + "uuid", vb.uuid),
            (p + "purge_seqno", vb.purge_seqno),
            (p + "last_persisted_snap_start", vb.persisted_seqno),
            (p + "last_persisted_snap_end", vb.persisted_seqno),
            (p + "high_completed_seqno", 0),
            (p + "high_prepared_seqno", 0),
            (p + "max_visible_seqno", vb.high_seqno),
        ]
    return out


def failover_stats(vbs) -> list[tuple[str, object]]:
    out = []
    for vbid, vb in vbs:
        p = f"vb_{vbid}:"
        out.append((p + "num_entries", len(vb.failover_log)))
        out.append((p + "num_erroneous_entries_erased", 0))
        for i, (uuid, seqno) in enumerate(vb.failover_log):
            out.append((f"{p}{i}:id", uuid))
            out.append((f"{p}{i}:seq", seqno))
    return out


def checkpoint_stats(vbs) -> list[tuple[str, object]]:
    out = []
    for vbid, vb in vbs:
        for k, v in vb.checkpoints.stats().items():
            out.append((f"vb_{vbid}:{k}", v))
    return out


def dcp_stats(node, bucket=None) -> list[tuple[str, object]]:
    b = bucket or node.bucket
    out: list[tuple[str, object]] = [("ep_dcp_count", len(b.producers))]
    for name, prod in sorted(b.producers.items()):
        for k, v in prod.stats().items():
            out.append((f"eq_dcpq:{name}:{k}", v))
    return out


@command(Opcode.STAT, privilege=Privilege.SIMPLE_STATS)
def stat(conn, frame, msg) -> None:
    group, _, arg = msg.group.strip().partition(" ")
    arg = arg.strip()
    node = conn.node
    if group == "":
        stats = default_stats(node, conn.bucket)
    elif group in ("vbucket-seqno", "vbucket-seqno-details"):
        vbs = _vb_filter(conn, arg)
        if vbs is None:
            conn.reply(frame, Status.NOT_MY_VBUCKET)
            return
        stats = vbucket_seqno_stats(vbs)
    elif group == "failovers":
        vbs = _vb_filter(conn, arg)
        if vbs is None:
            conn.reply(frame, Status.NOT_MY_VBUCKET)
            return
        stats = failover_stats(vbs)
    elif group == "vbucket":
        stats = [(f"vb_{vbid}", _STATE_NAMES.get(vb.state, "dead"))
                 for vbid, vb in sorted(conn.bucket.vbuckets.items())]
    elif group == "checkpoint":
        vbs = _vb_filter(conn, arg)
        if vbs is None:
            conn.reply(frame, Status.NOT_MY_VBUCKET)
            return
        stats = checkpoint_stats(vbs) + [("ep_checkpoint_memory", conn.bucket.memory.used)]
    elif group == "dcp":
        stats = dcp_stats(node, conn.bucket)
    elif group == "warmup":
        stats = [(f"ep_warmup_{k}", v) for k, v in (conn.bucket or node.bucket).warmup.items()]
    else:
        conn.reply(frame, Status.KEY_ENOENT)
        return
    for name, value in stats:
        if isinstance(value, bool):
            value = "true" if value else "false"
        # names carry what clients chose (DCP connection names, decoded with
        # surrogateescape): give back the bytes they sent, valid UTF-8 or not
        conn.reply(frame, key=name.encode("utf-8", "surrogateescape"),
                   value=str(value).encode("utf-8", "surrogateescape"))
    conn.reply(frame)
