"""Position: the rollback rule (latest known snapshot end at or below the rollback seqno,
failover entries above it dropped), persistence round trip, and snapshot-end thinning."""
from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from dcptool.client.position import MAX_SNAPSHOT_ENDS, Position, thin_ends

W, X = 0xAAAA, 0xBBBB


def test_seed_004_rollback_to_900_when_900_is_a_known_snapshot_end():
    # B streamed (W, 1000) and holds snapshot ends 800, 900, 1000; C answers ROLLBACK 900
    b = Position(W, 1000, 1000, 1000, ((W, 0),), (800, 900, 1000))
    after = b.rolled_back(900)
    assert (after.uuid, after.seqno, after.snap_start, after.snap_end) == (W, 900, 900, 900)
    assert after.failover_log == ((W, 0),)
    assert after.snapshot_ends == (800, 900)


def test_rollback_goes_to_latest_snapshot_end_below():
    p = Position(X, 1000, 1000, 1000, ((X, 950), (W, 0)), (300, 850, 1000))
    after = p.rolled_back(900)
    assert after.seqno == 850
    # the entry (X, 950) is above 850: dropped; the uuid is W's now
    assert after.failover_log == ((W, 0),)
    assert after.uuid == W


def test_rollback_to_zero_when_no_snapshot_end_fits():
    p = Position(W, 1000, 1000, 1000, ((W, 0),), (1000,))
    after = p.rolled_back(900)
    assert (after.seqno, after.snap_start, after.snap_end) == (0, 0, 0)
    assert after.failover_log == ((W, 0),) and after.uuid == W


def test_rollback_of_partial_snapshot_ignores_unfinished_snapshot():
    p = Position(W, 950, 901, 1000, ((W, 0),), (900,))
    assert p.rolled_back(940).seqno == 900


def test_uuid_at():
    p = Position(X, 1000, 1000, 1000, ((X, 900), (W, 0)))
    assert p.uuid_at(899) == W and p.uuid_at(900) == X and p.uuid_at(2000) == X


def test_invalid_snapshot_bounds():
    with pytest.raises(ValueError):
        Position(W, 5, 6, 10)


def test_dict_round_trip():
    p = Position(X, 950, 901, 1000, ((X, 900), (W, 0)), (100, 900))
    assert Position.from_dict(p.to_dict()) == p


@given(st.lists(st.integers(1, 10**9), min_size=0, max_size=500, unique=True))
def test_thin_keeps_newest_and_bounds_size(ends):
    ends = tuple(sorted(ends))
    out = thin_ends(ends)
    assert len(out) <= MAX_SNAPSHOT_ENDS
    assert list(out) == sorted(out) and set(out) <= set(ends)
    if ends:
        assert out[-1] == ends[-1]
