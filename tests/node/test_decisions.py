"""The node's rules as pure functions, checked with the seeds' and the fact sheet's numbers."""
from __future__ import annotations

import pytest

from dcptool.node.decisions import (
    RELATIVE_EXPIRY_LIMIT,
    VBucketView,
    absolute_expiry,
    evaluate_stream_request,
    first_marker_start,
    rollback_point,
    stream_end_reached,
    with_meta_wins,
)
from dcptool.protocol.constants import SEQNO_MAX, Status, StreamFlag, VBucketState

W, X, Y = 0xAAAA, 0xBBBB, 0xCCCC


# -- rollback point (fact sheet 8.3, seeds 000 and 004) ------------------------------------


def test_start_zero_never_rolls_back():
    assert rollback_point([(W, 0)], 0, 0, 0, 0, high_seqno=500) is None
    # even with a uuid the node never heard of
    assert rollback_point([(W, 0)], 0, 0x1234, 0, 0, high_seqno=500) is None


def test_start_zero_with_strict_uuid_checks_the_uuid():
    assert rollback_point([(W, 0)], 0, 0x1234, 0, 0, 500, strict_vb_uuid=True) == 0
    assert rollback_point([(W, 0)], 0, W, 0, 0, 500, strict_vb_uuid=True) is None
    assert rollback_point([(W, 0)], 0, 0, 0, 0, 500, strict_vb_uuid=True) is None


def test_unknown_uuid_rolls_back_to_zero():
    # pydcp-rollback vector: uuid 0x1234, start 3 against a node that never had it
    assert rollback_point([(W, 0)], 3, 0x1234, 3, 3, high_seqno=10) == 0
    # uuid 0 with start > 0 always rolls back to 0 (fact sheet checklist 5)
    assert rollback_point([(W, 0)], 5, 0, 5, 5, high_seqno=10) == 0


def test_seed_004_rolls_back_to_the_branch_point_900():
    log = [(X, 900), (W, 0)]  # node C after promotion: new entry X at 900
    # node B asks to continue W from 1000; C's history W ended at 900
    assert rollback_point(log, 1000, W, 1000, 1000, high_seqno=900) == 900
    # after rolling back it asks from (W, 900) and is accepted
    assert rollback_point(log, 900, W, 900, 900, high_seqno=900) is None


def test_seed_000_failover_log_example():
    log = [(Y, 900), (X, 500), (W, 0)]
    # a client that followed W to 700 must go back to 500, where X began
    assert rollback_point(log, 700, W, 700, 700, high_seqno=1200) == 500
    # a client on X at 800 is fine: X ran until 900
    assert rollback_point(log, 800, X, 800, 800, high_seqno=1200) is None
    # a client on X at 950 went past X's end (900)
    assert rollback_point(log, 950, X, 950, 950, high_seqno=1200) == 900
    # the current branch is bounded by the high seqno
    assert rollback_point(log, 1200, Y, 1200, 1200, high_seqno=1200) is None
    assert rollback_point(log, 1300, Y, 1300, 1300, high_seqno=1200) == 1200


def test_partial_snapshot_rolls_back_to_its_start():
    log = [(X, 900), (W, 0)]
    # client has 850 of the snapshot 800..1000 on W: the branch point 900 is inside its
    # partial snapshot, so it must go back to the snapshot start
    assert rollback_point(log, 850, W, 800, 1000, high_seqno=2000) == 800
    # the same position inside a snapshot that ends before the branch is fine
    assert rollback_point(log, 850, W, 800, 890, high_seqno=2000) is None
    # at the start of a snapshot the client has nothing of it: only the start counts
    assert rollback_point(log, 880, W, 880, 1000, high_seqno=2000) is None
    # branch point below the snapshot start: roll back to the branch point
    assert rollback_point(log, 960, W, 950, 1000, high_seqno=2000) == 900
    # at the end of a complete snapshot above the branch: the snapshot start is not used
    assert rollback_point(log, 1000, W, 950, 1000, high_seqno=2000) == 900


def test_purge_seqno_rule():
    log = [(W, 0)]
    # a client behind the purge seqno may have missed deletions: back to 0
    assert rollback_point(log, 10, W, 10, 10, high_seqno=100, purge_seqno=50) == 0
    # unless it asks to ignore purged tombstones
    assert rollback_point(log, 10, W, 10, 10, high_seqno=100, purge_seqno=50,
                          ignore_purged_tombstones=True) is None
    # or it already knows that purge seqno
    assert rollback_point(log, 10, W, 10, 10, high_seqno=100, purge_seqno=50,
                          client_purge_seqno=50) is None
    # at or above the purge seqno it resumes
    assert rollback_point(log, 50, W, 50, 50, high_seqno=100, purge_seqno=50) is None
    # a snapshot that began below the purge seqno counts too (issue 7: "start or snapshot start")
    assert rollback_point(log, 60, W, 40, 80, high_seqno=100, purge_seqno=50) == 0
    assert rollback_point(log, 60, W, 40, 80, high_seqno=100, purge_seqno=50,
                          ignore_purged_tombstones=True) is None
    # start 0 is never affected
    assert rollback_point(log, 0, 0, 0, 0, high_seqno=100, purge_seqno=50) is None


# -- stream request (fact sheet 8.1) --------------------------------------------------------


def view(state=VBucketState.ACTIVE, high=100, persisted=100, purge=0, log=((W, 0),)):
    return VBucketView(state, high, persisted, purge, tuple(log))


def req(vb, **kw):
    args = dict(flags=0, start=0, end=SEQNO_MAX, vb_uuid=0, snap_start=0, snap_end=0)
    args.update(kw)
    return evaluate_stream_request(vb, **args)


def test_stream_request_success_plan():
    d = req(view())
    assert d.status == Status.SUCCESS
    assert (d.plan.start, d.plan.end) == (0, SEQNO_MAX)


def test_stream_request_validation_order():
    assert req(None).status == Status.NOT_MY_VBUCKET
    assert req(view(state=VBucketState.DEAD)).status == Status.NOT_MY_VBUCKET
    assert req(view(state=VBucketState.PENDING)).status == Status.NOT_MY_VBUCKET
    assert req(view(state=VBucketState.REPLICA)).status == Status.SUCCESS
    assert req(view(state=VBucketState.REPLICA),
               flags=StreamFlag.ACTIVE_VB_ONLY).status == Status.NOT_MY_VBUCKET
    assert req(view(), flags=StreamFlag.NO_VALUE).status == Status.EINVAL
    assert req(view(), start=10, end=5, snap_start=10, snap_end=10).status == Status.ERANGE
    assert req(view(), start=10, snap_start=11, snap_end=20, vb_uuid=W).status == Status.ERANGE
    assert req(view(), start=10, snap_start=0, snap_end=9, vb_uuid=W).status == Status.ERANGE
    # the vbucket is checked before the ranges
    assert req(None, start=10, end=5).status == Status.NOT_MY_VBUCKET
    # the range is checked before the existing stream, which is checked before rollback
    assert req(view(), start=10, end=5, stream_exists=True).status == Status.ERANGE
    assert req(view(), start=3, vb_uuid=0x1234, snap_start=3, snap_end=3,
               stream_exists=True).status == Status.KEY_EEXISTS
    d = req(view(), start=3, vb_uuid=0x1234, snap_start=3, snap_end=3)
    assert (d.status, d.rollback_seqno) == (Status.ROLLBACK, 0)


def test_noop_is_required_for_xattrs():
    assert req(view(), wants_xattrs=True, noop_enabled=False).status == Status.NOT_SUPPORTED
    assert req(view(), wants_xattrs=True, noop_enabled=True).status == Status.SUCCESS


def test_unknown_high_flag_bits_are_tolerated():
    # libdcp writes 0x30 without byte swapping: 0x30000000
    d = req(view(), flags=0x30000000)
    assert d.status == Status.SUCCESS
    assert d.plan.flags == 0


def test_to_latest_disk_only_and_from_latest():
    d = req(view(high=120, persisted=90), flags=StreamFlag.TO_LATEST)
    assert d.plan.end == 120
    d = req(view(high=120, persisted=90), flags=StreamFlag.DISK_ONLY)
    assert d.plan.end == 90
    d = req(view(high=120), flags=StreamFlag.FROM_LATEST)
    assert (d.plan.start, d.plan.snap_start, d.plan.snap_end, d.plan.vb_uuid) == (120, 120, 120, W)
    # start beyond the adjusted end
    d = req(view(high=120, persisted=90), flags=StreamFlag.DISK_ONLY, start=100, vb_uuid=W,
            snap_start=100, snap_end=100)
    assert d.status == Status.ERANGE


def test_start_above_high_seqno_on_current_branch_rolls_back():
    d = req(view(high=100), start=150, vb_uuid=W, snap_start=150, snap_end=150)
    assert (d.status, d.rollback_seqno) == (Status.ROLLBACK, 100)


def test_stream_ids_must_match_the_control():
    assert req(view(), stream_ids_enabled=True).status == Status.DCP_STREAM_ID_INVALID
    assert req(view(), stream_id=3).status == Status.DCP_STREAM_ID_INVALID
    assert req(view(), stream_ids_enabled=True, stream_id=3).status == Status.SUCCESS


def test_takeover_needs_an_active_vbucket_and_value_needs_collections():
    d = req(view(), flags=StreamFlag.TAKEOVER, end=50)
    assert d.status == Status.SUCCESS and d.plan.end == SEQNO_MAX  # ends by its handshake
    assert req(view(state=VBucketState.REPLICA),
               flags=StreamFlag.TAKEOVER).status == Status.NOT_MY_VBUCKET
    assert req(view(), flags=StreamFlag.CACHE_TRANSFER).status == Status.NOT_SUPPORTED
    assert req(view(), has_value=True).status == Status.EINVAL


def test_takeover_handshake_order():
    from dcptool.node import decisions as d

    phase, done = d.TAKEOVER_SEND, []
    # an answer before anything was asked changes nothing
    assert d.takeover_step(phase, d.ACKED) == (phase, ())
    for event in (d.CAUGHT_UP, d.CAUGHT_UP, d.ACKED, d.ACKED, d.CAUGHT_UP, d.CAUGHT_UP,
                  d.ACKED):
        phase, actions = d.takeover_step(phase, event)
        done.extend(actions)
    assert done == [d.SEND_PENDING, d.SET_DEAD, d.SEND_ACTIVE, d.END_OK]
    assert phase == d.TAKEOVER_DONE
    assert d.takeover_waits(d.TAKEOVER_WAIT_PENDING) and d.takeover_waits(d.TAKEOVER_WAIT_ACTIVE)
    assert not d.takeover_waits(d.TAKEOVER_SEND) and not d.takeover_waits(d.TAKEOVER_SEND_DEAD)


# -- conflict resolution (fact sheet 4.14) -----------------------------------------------


def test_higher_revision_wins_lower_loses():
    existing = (5, 1000, 0, 0)
    assert with_meta_wins((6, 1, 0, 0), existing)
    assert not with_meta_wins((4, 999999, 0, 0), existing)


def test_cas_expiry_and_flags_break_ties_in_order():
    existing = (5, 1000, 10, 7)
    assert with_meta_wins((5, 1001, 0, 0), existing)
    assert not with_meta_wins((5, 999, 99, 99), existing)
    assert with_meta_wins((5, 1000, 11, 0), existing)
    assert with_meta_wins((5, 1000, 10, 8), existing)
    assert not with_meta_wins((5, 1000, 10, 6), existing)


def test_identical_versions_lose_unless_bringing_xattrs():
    existing = (5, 1000, 10, 7)
    assert not with_meta_wins(existing, existing)
    assert with_meta_wins(existing, existing, incoming_xattr=True)
    assert not with_meta_wins(existing, existing, incoming_xattr=True, existing_xattr=True)


def test_deletions_compare_revision_and_cas_only_and_lose_ties():
    existing = (5, 1000, 10, 7)
    assert with_meta_wins((5, 1001, 0, 0), existing, deletion=True)
    assert not with_meta_wins((5, 1000, 99, 99), existing, deletion=True)
    assert not with_meta_wins((4, 5000, 0, 0), existing, deletion=True)


def test_nothing_stored_accepts():
    assert with_meta_wins((1, 1, 0, 0), None)
    assert with_meta_wins((1, 1, 0, 0), None, deletion=True)


# -- expiry ------------------------------------------------------------------------------


@pytest.mark.parametrize("expiry,now,expected", [
    (0, 1_700_000_000, 0),
    (10, 1_700_000_000, 1_700_000_010),
    (RELATIVE_EXPIRY_LIMIT, 1_700_000_000, 1_700_000_000 + RELATIVE_EXPIRY_LIMIT),
    (RELATIVE_EXPIRY_LIMIT + 1, 1_700_000_000, RELATIVE_EXPIRY_LIMIT + 1),
    (1_800_000_000, 1_700_000_000, 1_800_000_000),
])
def test_memcached_expiry_convention(expiry, now, expected):
    assert absolute_expiry(expiry, now) == expected


# -- snapshot markers (seed 003) -----------------------------------------------------------


def test_first_marker_start_follows_seed_003():
    assert first_marker_start(0, 1) == 0      # R1: 0..100
    assert first_marker_start(0, 2) == 2      # A, B, A: marker 2..3
    assert first_marker_start(100, 101) == 100


def test_stream_end_after_the_snapshot_holding_end():
    assert stream_end_reached(100, 100)
    assert stream_end_reached(120, 100)
    assert not stream_end_reached(99, 100)
    assert not stream_end_reached(10**9, SEQNO_MAX)
