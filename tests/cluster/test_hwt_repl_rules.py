"""The rules of HWT replication (dcptool/node/hwtrepl.py), without a node: which source
rows a replica installs, which stay pending, and how far a replica's purger may go."""
from __future__ import annotations

from dcptool.node.hwt import ReplicatedRow
from dcptool.node.hwtrepl import offered_rows, plan_install, purge_cap

NOW = 1_800_000_000.0


def row(name: str, seqno: int, vb: int = 128, instance: str = "r1") -> ReplicatedRow:
    return ReplicatedRow(name, instance, vb, seqno, NOW - 10, NOW + 3600, source="a:1")


def test_seed002_row_ahead_of_the_replica_is_pending_then_installed():
    # local replication at 1024, XDCR registered 2048 on the master
    offered = {("xdcr", "r1"): row("xdcr", 2048)}
    rows, pending = plan_install({}, offered, persisted=1024)
    assert rows == {} and [p.seqno for p in pending] == [2048]
    # the replica has replicated 2048: the row arrives
    rows, pending = plan_install({}, offered, persisted=2048)
    assert rows == offered and pending == []


def test_older_row_stays_while_the_newer_one_waits():
    old = row("xdcr", 1000)
    rows, pending = plan_install({("xdcr", "r1"): old}, {("xdcr", "r1"): row("xdcr", 2048)},
                                 persisted=1500)
    assert rows == {("xdcr", "r1"): old} and [p.seqno for p in pending] == [2048]


def test_rows_the_source_dropped_go_and_rows_past_a_rollback_go():
    cur = {("gone", "r1"): row("gone", 10), ("xdcr", "r1"): row("xdcr", 900)}
    # the source no longer lists "gone"; the replica was rolled back to 500, below 900
    rows, pending = plan_install(cur, {("xdcr", "r1"): row("xdcr", 900)}, persisted=500)
    assert rows == {} and [p.seqno for p in pending] == [900]


def test_per_vbucket_granularity():
    """One row naming two vbuckets: each vbucket installs on its own replicated seqno."""
    answer = {"entries": [{"name": "backup", "instance": "u", "vbuckets": {"0": 50, "1": 70},
                           "reported_at": NOW, "expires_at": NOW + 60, "meta": {"m": 1},
                           "lost_at": None, "lost_reason": None}],
              "replicated": []}
    offered = offered_rows(answer, [0, 1, 2], "a:1", NOW)
    assert set(offered) == {0, 1, 2} and offered[2] == {}
    r0, p0 = plan_install({}, offered[0], persisted=60)
    r1, p1 = plan_install({}, offered[1], persisted=60)
    assert r0[("backup", "u")].seqno == 50 and r0[("backup", "u")].meta == {"m": 1} and not p0
    assert r1 == {} and [p.seqno for p in p1] == [70]


def test_chain_rows_pass_on_and_the_lower_seqno_wins():
    """A hop offers what it replicated itself; the same client registered there too:
    the lower seqno holds back more and is the one offered."""
    answer = {"entries": [{"name": "x", "instance": "i", "vbuckets": {"3": 400},
                           "reported_at": NOW, "expires_at": NOW + 60}],
              "replicated": [{"name": "x", "instance": "i", "vbucket": 3, "seqno": 300,
                              "reported_at": NOW, "expires_at": NOW + 60, "lost_at": None},
                             {"name": "y", "instance": "j", "vbucket": 3, "seqno": 700,
                              "reported_at": NOW, "expires_at": NOW + 60, "lost_at": NOW}]}
    offered = offered_rows(answer, [3], "b:2", NOW)[3]
    assert offered[("x", "i")].seqno == 300 and offered[("x", "i")].source == "b:2"
    assert offered[("y", "j")].lost_at == NOW  # a lost row stays lost (holds nothing)
    assert not offered[("y", "j")].watermark().live(NOW)


def test_purge_cap():
    assert purge_cap(False, ("a:1", 500)) is None      # an active has no source
    assert purge_cap(True, None) == 0                 # not known yet: purge nothing
    assert purge_cap(True, ("a:1", 500)) == 500       # never beyond the source
