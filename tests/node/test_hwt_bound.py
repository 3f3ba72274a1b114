"""The purge bound and the HWT guard rail as pure functions, with seed 002's numbers.

Seed 002: vbucket 128; the tombstone purger has purged everything up to seqno 1000; XDCR,
the slowest client, has replicated up to 2000; a backup is further ahead. The purger may
advance to 2000 and no further.
"""
from __future__ import annotations

import pytest

from dcptool.node.decisions import (
    PurgeBound,
    Watermark,
    hold_seconds,
    is_lost,
    may_purge,
    purge_bound,
    purge_seqno_after,
)
from dcptool.node.hwt import (
    EXPIRED,
    LOST,
    OK,
    HwtEntry,
    HwtRequestError,
    parse_registration,
    parse_selector,
)

DAY = 86400.0
NOW = 1_800_000_000.0
PURGE_AGE = 3 * DAY
VB = 128


def xdcr(seqno=2000, expires=NOW + DAY, lost=False):
    return Watermark("xdcr/1", {VB: seqno}, expires, lost)


def backup(seqno=3500, expires=NOW + 7 * DAY):
    return Watermark("backup/a", {VB: seqno, 5: 10}, expires)


def test_seed_002_the_slowest_client_is_the_bound():
    b = purge_bound(VB, [backup(), xdcr()], now=NOW, purge_age=PURGE_AGE)
    assert b.seqno == 2000
    assert b.held_by == ("xdcr/1",)
    assert b.before == NOW - PURGE_AGE
    old = NOW - 4 * DAY
    # the purger was at 1000; tombstones up to 2000 may go now, none above
    assert may_purge(b, 1500, old)
    assert may_purge(b, 2000, old)
    assert not may_purge(b, 2001, old)
    assert not may_purge(b, 3000, old)
    # the new purge seqno is the highest purged tombstone, never lower than before
    assert purge_seqno_after(1000, [1500, 2000]) == 2000
    assert purge_seqno_after(1000, []) == 1000


def test_tombstones_must_also_be_old_enough():
    b = purge_bound(VB, [xdcr()], now=NOW, purge_age=PURGE_AGE)
    assert not may_purge(b, 1500, NOW - 2 * DAY)         # deleted two days ago: too young
    assert may_purge(b, 1500, NOW - PURGE_AGE)            # exactly the purge age
    assert not may_purge(b, 1500, NOW - PURGE_AGE + 1)


def test_no_registration_means_age_only():
    b = purge_bound(VB, [], now=NOW, purge_age=PURGE_AGE)
    assert b == PurgeBound(None, NOW - PURGE_AGE, ())
    assert may_purge(b, 10**9, NOW - 4 * DAY)
    # a row that does not name the vbucket does not hold it back
    assert purge_bound(VB, [Watermark("other/1", {7: 3}, NOW + DAY)], now=NOW,
                       purge_age=PURGE_AGE).seqno is None


def test_an_expired_row_stops_holding_back():
    expired = xdcr(expires=NOW - 1)
    assert not expired.live(NOW)
    b = purge_bound(VB, [backup(), expired], now=NOW, purge_age=PURGE_AGE)
    assert b.seqno == 3500 and b.held_by == ("backup/a",)
    # expiry is exclusive: a row expiring exactly now no longer holds
    assert purge_bound(VB, [xdcr(expires=NOW)], now=NOW, purge_age=PURGE_AGE).seqno is None


def test_a_lost_row_stops_holding_back():
    b = purge_bound(VB, [backup(), xdcr(lost=True)], now=NOW, purge_age=PURGE_AGE)
    assert b.seqno == 3500


def test_ties_name_every_slowest_client():
    b = purge_bound(VB, [xdcr(2000), Watermark("index/1", {VB: 2000}, NOW + DAY), backup()],
                    now=NOW, purge_age=PURGE_AGE)
    assert b.seqno == 2000 and set(b.held_by) == {"xdcr/1", "index/1"}


def test_compact_db_cut_off_replaces_the_age_but_not_the_watermarks():
    b = purge_bound(VB, [xdcr()], now=NOW, purge_age=PURGE_AGE, before=NOW)
    assert may_purge(b, 1999, NOW - 1)
    assert not may_purge(b, 2001, NOW - 10 * DAY)


def test_hold_seconds_measures_the_oldest_kept_tombstone():
    before = NOW - PURGE_AGE
    tombs = [(1500, before - 9 * DAY), (2100, before - 2 * DAY), (2600, before - 5 * DAY),
             (2700, before + 100)]  # the last is not old enough yet: it is not held
    assert hold_seconds(2000, tombs, before) == 5 * DAY
    assert hold_seconds(2600, tombs, before) == 0.0
    assert hold_seconds(0, tombs, before) == 9 * DAY
    assert is_lost(5 * DAY, 4 * DAY)
    assert not is_lost(5 * DAY, 6 * DAY)
    assert not is_lost(100 * DAY, None)


# -- HWT rows and requests ---------------------------------------------------------------


def test_entry_states_and_row_round_trip():
    e = HwtEntry("xdcr", "1", {VB: 2000, 3: 7}, NOW, NOW + 60, {"checkpoint": 12})
    assert e.state(NOW) == OK
    assert e.state(NOW + 60) == EXPIRED
    back = HwtEntry.from_row(e.to_row())
    assert back == e
    e.lost_at = NOW
    assert e.state(NOW) == LOST
    d = e.describe(NOW)
    assert d["lowest_seqno"] == 7 and d["highest_seqno"] == 2000
    assert d["vbuckets"] == {"3": 7, "128": 2000}


def test_parse_registration():
    e = parse_registration({"name": "xdcr", "instance": "u-1", "vbuckets": {"128": 2000},
                            "ttl": 3600, "meta": {"a": 1}}, num_vbuckets=1024, now=NOW,
                           default_ttl=7 * DAY)
    assert (e.name, e.instance, e.seqnos, e.expires_at, e.meta) == \
        ("xdcr", "u-1", {128: 2000}, NOW + 3600, {"a": 1})
    e = parse_registration({"name": "b", "instance": "i", "vbuckets": {"0": 0}},
                           num_vbuckets=16, now=NOW, default_ttl=7 * DAY)
    assert e.expires_at == NOW + 7 * DAY


@pytest.mark.parametrize("doc, fragment", [
    ([], "JSON object"),
    ({"instance": "i", "vbuckets": {"0": 1}}, '"name"'),
    ({"name": "", "instance": "i", "vbuckets": {"0": 1}}, '"name"'),
    ({"name": "x" * 201, "instance": "i", "vbuckets": {"0": 1}}, "longer"),
    ({"name": "a\nb", "instance": "i", "vbuckets": {"0": 1}}, "control"),
    ({"name": "a", "vbuckets": {"0": 1}}, '"instance"'),
    ({"name": "a", "instance": "i"}, '"vbuckets"'),
    ({"name": "a", "instance": "i", "vbuckets": {}}, '"vbuckets"'),
    ({"name": "a", "instance": "i", "vbuckets": {"16": 1}}, "vbucket '16'"),
    ({"name": "a", "instance": "i", "vbuckets": {"x": 1}}, "not a number"),
    ({"name": "a", "instance": "i", "vbuckets": {"0": -1}}, "seqno"),
    ({"name": "a", "instance": "i", "vbuckets": {"0": "5"}}, "seqno"),
    ({"name": "a", "instance": "i", "vbuckets": {"0": True}}, "seqno"),
    ({"name": "a", "instance": "i", "vbuckets": {"0": 1}, "ttl": 0}, '"ttl"'),
    ({"name": "a", "instance": "i", "vbuckets": {"0": 1}, "ttl": 10**9}, '"ttl"'),
    ({"name": "a", "instance": "i", "vbuckets": {"0": 1}, "meta": []}, '"meta"'),
    ({"name": "a", "instance": "i", "vbuckets": {"0": 1}, "meta": {"x": "y" * 5000}}, "larger"),
    ({"name": "a", "instance": "i", "vbuckets": {"0": 1}, "extra": 1}, "unknown field"),
])
def test_parse_registration_refuses(doc, fragment):
    with pytest.raises(HwtRequestError) as exc:
        parse_registration(doc, num_vbuckets=16, now=NOW, default_ttl=DAY)
    assert fragment in str(exc.value)


def test_parse_selector():
    assert parse_selector(None, name_required=False) == (None, None)
    assert parse_selector({"name": "a"}, name_required=True) == ("a", None)
    assert parse_selector({"name": "a", "instance": "i"}, name_required=True) == ("a", "i")
    with pytest.raises(HwtRequestError):
        parse_selector(None, name_required=True)
    with pytest.raises(HwtRequestError):
        parse_selector({"instance": "i"}, name_required=True)
    with pytest.raises(HwtRequestError):
        parse_selector({"name": "a", "x": 1}, name_required=False)
