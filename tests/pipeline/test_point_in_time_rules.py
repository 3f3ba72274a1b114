"""The rules of point-in-time reads over synthetic records and manifests (no node, no Spark):
TIME parsing, snapshot boundaries and their times, the cut for a time, lags, coverage and
gaps, the timeline bar, and --keep-within."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from dcptool.archive.pointintime import (
    NS,
    Coverage,
    boundaries,
    coverage,
    covered,
    iso,
    lag_summary,
    parse_time,
    record_time,
    part_meta,
    timeline_bar,
    to_ns,
    vbucket_cut,
)
from dcptool.archive.retention import Policy, apply_policy, within_newest
from dcptool.errors import UsageError

NOW = datetime(2026, 11, 28, 15, 0, 0, tzinfo=timezone.utc)
T0 = to_ns(datetime(2026, 11, 28, 14, 0, 0, tzinfo=timezone.utc))


def cas(seconds: float, counter: int = 0) -> int:
    """A CAS whose time is T0 + seconds (its low 16 bits a logical counter)."""
    return ((T0 + int(seconds * NS)) & ~0xFFFF) | counter


def mut(seqno: int, t: float, key: bytes = b"\x00k") -> tuple:
    return (3, seqno, 1, cas(t), 0, 0, 0, key, b"v", None)


def dele(seqno: int, t: float, key: bytes = b"\x00k") -> tuple:
    return (4, seqno, 1, cas(t), key, 0, 0, b"")


def stream(seqno: int) -> tuple:
    return (1, 7, seqno, seqno, seqno, [[7, 0]])


def snap(start: int, end: int) -> tuple:
    return (2, start, end, 0)


def end(seqno: int) -> tuple:
    return (7, 7, seqno, seqno, seqno)


# -- TIME -----------------------------------------------------------------------------------


def test_iso_times_with_a_zone_and_relative_times_parse():
    assert parse_time("2026-11-28T14:03:00Z", now=NOW) == T0 + 180 * NS
    assert parse_time("2026-11-28T15:03:00+01:00", now=NOW) == T0 + 180 * NS
    assert parse_time("2026-11-28T14:03:00.250000Z", now=NOW) == T0 + 180 * NS + NS // 4
    assert parse_time("-15m", now=NOW) == to_ns(NOW - timedelta(minutes=15))
    assert parse_time("-2h", now=NOW) == to_ns(NOW - timedelta(hours=2))
    assert parse_time("-1d", now=NOW) == to_ns(NOW - timedelta(days=1))
    assert parse_time("-1d6h", now=NOW) == to_ns(NOW - timedelta(hours=30))


@pytest.mark.parametrize("text, word", [
    ("2026-11-28T14:03:00", "no zone"),
    ("2026-11-28T16:00:00Z", "future"),
    ("yesterday", "ISO 8601"),
    ("-15x", "relative"),
    ("", "ISO 8601"),
])
def test_bad_times_are_one_line_usage_errors(text, word):
    with pytest.raises(UsageError) as exc:
        parse_time(text, now=NOW, option="--to-time")
    assert exc.value.exit_code == 2
    assert word in str(exc.value) and "\n" not in str(exc.value)
    assert str(exc.value).startswith("--to-time")


def test_a_records_time_is_its_cas_without_the_counter():
    assert record_time(cas(1.5, 0x1234)) == record_time(cas(1.5))
    assert record_time(cas(1.5)) <= T0 + int(1.5 * NS)


# -- boundaries and cuts ---------------------------------------------------------------------


def test_boundary_times_are_the_newest_record_time_up_to_them():
    part = [stream(0), snap(1, 2), mut(1, 1.0), mut(2, 2.0, b"\x00j"), snap(3, 3),
            dele(3, 3.0), end(3)]
    b = boundaries([part])
    assert [(x.seqno, x.time) for x in b] == [(0, None), (2, record_time(cas(2.0))),
                                              (3, record_time(cas(3.0)))]


def test_a_deduplicated_snapshot_across_time_is_cut_at_its_start():
    # snapshot 3..6 holds changes at 3 s and at 9 s: TIME 5 s falls inside it
    part = [stream(0), snap(1, 2), mut(1, 1.0), mut(2, 2.0, b"\x00j"),
            snap(3, 6), mut(4, 3.0, b"\x00a"), mut(6, 9.0, b"\x00b"), end(6)]
    at = T0 + 5 * NS
    c = vbucket_cut(0, [part], at)
    assert (c.part, c.seqno) == (0, 2)
    assert c.lag == at - record_time(cas(2.0))


def test_the_cut_crosses_backups_of_the_chain():
    p0 = [stream(0), snap(1, 2), mut(1, 1.0), mut(2, 2.0, b"\x00j"), end(2)]
    p1 = [stream(2), snap(3, 3), mut(3, 4.0), end(3)]
    p2 = [stream(3), snap(4, 4), mut(4, 8.0), end(4)]
    c = vbucket_cut(0, [p0, p1, p2], T0 + 5 * NS)
    assert (c.part, c.seqno) == (1, 3)
    c = vbucket_cut(0, [p0, p1, p2], T0 + 8 * NS)
    assert (c.part, c.seqno, c.lag) == (2, 4, T0 + 8 * NS - record_time(cas(8.0)))
    # before every record: the start, nothing restored, no lag
    c = vbucket_cut(0, [p0, p1, p2], T0)
    assert (c.seqno, c.time, c.lag) == (0, None, None)


def test_a_rollback_removes_the_boundaries_above_it():
    p0 = [stream(0), snap(1, 5), mut(1, 1.0), mut(5, 2.0, b"\x00j"), end(5)]
    # the node rolled back to 1: the next backup records it and goes on from there
    p1 = [stream(5), (6, 1, 9), snap(2, 2), mut(2, 6.0, b"\x00x"), end(2)]
    b = boundaries([p0, p1])
    assert [x.seqno for x in b] == [0, 1, 2]
    assert [x.part for x in b] == [0, 1, 1]


def test_a_merged_backup_gives_its_start_and_end_only():
    p0 = [stream(0), snap(1, 1), mut(1, 1.0), end(1)]
    merged = [stream(1), snap(2, 3), mut(2, 2.0, b"\x00a"), mut(3, 3.0, b"\x00b"),
              snap(4, 5), mut(5, 5.0, b"\x00a"), end(5)]
    assert [x.seqno for x in boundaries([p0, merged])] == [0, 1, 3, 5]
    assert [x.seqno for x in boundaries([p0, merged], [False, True])] == [0, 1, 5]
    c = vbucket_cut(0, [p0, merged], T0 + 4 * NS, [False, True])
    assert (c.part, c.seqno) == (0, 1)


def test_lag_summary_worst_and_median():
    p = [stream(0), snap(1, 1), mut(1, 1.0), end(1)]
    cuts = [vbucket_cut(vb, [p], T0 + (2 + vb) * NS) for vb in range(4)]
    s = lag_summary(cuts + [vbucket_cut(9, [[stream(0)]], T0)])
    lags = sorted((T0 + (2 + vb) * NS - record_time(cas(1.0))) / NS for vb in range(4))
    assert s["vbuckets"] == 4
    assert s["worst_seconds"] == pytest.approx(lags[-1])
    assert s["median_seconds"] == pytest.approx((lags[1] + lags[2]) / 2)


# -- coverage and gaps -----------------------------------------------------------------------


def manifest(bid_s: float, finished_s: float, kind: str = "incremental", **extra) -> dict:
    start = datetime.fromtimestamp((T0 + int(bid_s * NS)) / NS, timezone.utc)
    bid = start.strftime("%Y%m%dT%H%M%S.%fZ")
    return {"id": bid, "type": kind, "started": iso(T0 + int(bid_s * NS)),
            "finished": iso(T0 + int(finished_s * NS)), "extra": extra}


def test_consecutive_backups_cover_without_gaps_and_hourly_ones_leave_gaps(monkeypatch):
    monkeypatch.delenv("DCPTOOL_GAP_TOLERANCE", raising=False)
    ms = [manifest(0, 5, "full"), manifest(6, 20), manifest(22, 30)]
    cov = coverage(ms)
    assert cov.gaps == [] and cov.earliest == T0 + 5 * NS and cov.latest == T0 + 30 * NS
    hourly = [manifest(0, 60, "full"), manifest(3600, 3660), manifest(7200, 7260)]
    cov = coverage(hourly)
    assert cov.gaps == [(T0 + 60 * NS, T0 + 3600 * NS),
                                           (T0 + 3660 * NS, T0 + 7200 * NS)]
    assert cov.gap_at(T0 + 1800 * NS) == (T0 + 60 * NS, T0 + 3600 * NS)
    assert cov.gap_at(T0 + 3630 * NS) is None
    j = cov.as_json()
    assert j["window"] == {"earliest": iso(T0 + 60 * NS), "latest": iso(T0 + 7260 * NS)}
    assert j["gaps"][0] == {"from": iso(T0 + 60 * NS), "to": iso(T0 + 3600 * NS)}


def test_a_recorded_checkpoint_interval_widens_the_tolerance(monkeypatch):
    monkeypatch.delenv("DCPTOOL_GAP_TOLERANCE", raising=False)
    ms = [manifest(0, 5, "full"), manifest(65, 70, checkpoint_interval=60)]
    assert coverage(ms).gaps == []
    assert len(coverage([manifest(0, 5, "full"), manifest(65, 70)]).gaps) == 1
    monkeypatch.setenv("DCPTOOL_GAP_TOLERANCE", "100")
    assert coverage([manifest(0, 5, "full"), manifest(65, 70)]).gaps == []


def test_a_merged_backup_covers_its_end():
    m = manifest(100, 101)
    m["extra"] = {"merge": {"from": "x", "covered": [[iso(T0), iso(T0 + 50 * NS)],
                                                     [iso(T0 + 80 * NS), iso(T0 + 99 * NS)]]}}
    assert covered(m) == [(T0 + 99 * NS, T0 + 99 * NS)]
    assert covered(manifest(0, 5, "full")) == [(T0 + 5 * NS, T0 + 5 * NS)]
    assert covered(manifest(0, 5)) == [(T0, T0 + 5 * NS)]



def test_a_history_keeping_merged_backup_covers_its_originals_and_keeps_its_boundaries():
    """A continuous backup's rotation (extra.merge.history) keeps every version of its
    range: it covers what its originals covered, and its snapshot boundaries are states."""
    spans = [[iso(T0), iso(T0 + 50 * NS)], [iso(T0 + 80 * NS), iso(T0 + 99 * NS)]]
    m = manifest(100, 101)
    m["extra"] = {"merge": {"from": "x", "covered": spans, "history": True}}
    assert covered(m) == [(T0, T0 + 50 * NS), (T0 + 80 * NS, T0 + 99 * NS)]
    whole, start = part_meta(m)
    assert whole is False and start == T0
    plain = manifest(100, 101)
    plain["extra"] = {"merge": {"from": "x", "covered": spans}}
    assert part_meta(plain)[0] is True


def test_a_checkpoint_covers_from_the_checkpoint_before_it(monkeypatch):
    """Checkpoints that found nothing new wrote no backup: the next one's covers_from says
    the node was seen unchanged since, so an idle stretch of a continuous backup is no
    gap; a batch incremental (no covers_from) an hour later still leaves one."""
    monkeypatch.delenv("DCPTOOL_GAP_TOLERANCE", raising=False)
    ck = manifest(600, 601, checkpoint_interval=2, covers_from=iso(T0 + 4 * NS))
    assert covered(ck) == [(T0 + 4 * NS, T0 + 601 * NS)]
    assert coverage([manifest(0, 5, "full"), ck]).gaps == []
    assert len(coverage([manifest(0, 5, "full"), manifest(600, 601)]).gaps) == 1
    # a full backup's state is known at its end only, whatever it records
    full = manifest(600, 601, "full", covers_from=iso(T0))
    assert covered(full) == [(T0 + 601 * NS, T0 + 601 * NS)]

def test_the_timeline_bar_draws_spans_and_gaps_in_its_width():
    cov = Coverage([(0, 10), (50, 60), (90, 100)], 0)
    bar = timeline_bar(cov, 10, covered_char="#", gap_char=".")
    assert bar == "#....#...#"
    assert len(timeline_bar(cov, 37)) == 37


# -- --keep-within ---------------------------------------------------------------------------


def test_keep_within_keeps_every_backup_within_the_duration_of_the_newest():
    base = datetime(2026, 11, 1, tzinfo=timezone.utc)
    ids = [(base + timedelta(hours=6 * i)).strftime("%Y%m%dT%H%M%S.%fZ") for i in range(40)]
    kept = within_newest(ids, "2d")
    assert kept == set(ids[-9:])  # 48 h back from the newest, both ends included
    reasons = apply_policy(ids, Policy(within="2d", daily=5))
    assert all(any(r.startswith("within 2d") for r in reasons[b]) for b in ids[-9:])
    assert not any(any(r.startswith("within") for r in reasons[b]) for b in ids[:-9])
    # daily thins what is older: one a day for the 5 newest days
    assert sum(1 for b in ids if reasons[b]) == 9 + 2
    with pytest.raises(UsageError):
        Policy(within="a week")


def test_a_cut_is_exact_when_the_next_change_is_after_the_time():
    part = [stream(0), snap(1, 2), mut(1, 1.0), mut(2, 2.0, b"\x00j"),
            snap(3, 4), mut(3, 3.0, b"\x00a"), mut(4, 9.0, b"\x00b"), end(4)]
    # an idle vbucket: nothing between 1 s and 9 s
    idle = [stream(0), snap(1, 1), mut(1, 1.0), snap(2, 2), mut(2, 9.0), end(2)]
    # seqnos 2..3 deduplicated away: their times are unknown
    gap = [stream(0), snap(1, 1), mut(1, 1.0), snap(2, 4), mut(4, 9.0), end(4)]
    straddled = vbucket_cut(0, [part], T0 + 5 * NS)
    exact = vbucket_cut(1, [idle], T0 + 5 * NS)
    unknown = vbucket_cut(2, [gap], T0 + 5 * NS)
    assert (straddled.seqno, straddled.exact) == (2, False)
    assert (exact.seqno, exact.exact) == (1, True) and exact.lag > 3 * NS
    assert (unknown.seqno, unknown.exact) == (1, False)
    assert lag_summary([straddled, exact, unknown])["exact_vbuckets"] == 1
    # after the last record: nothing follows, the archive cannot tell
    assert not vbucket_cut(0, [part], T0 + 10 * NS).exact


def test_a_rollback_recorded_after_the_time_does_not_move_the_cut():
    p0 = [stream(0), snap(1, 5), mut(1, 1.0), mut(5, 2.0, b"\x00j"), end(5)]
    p1 = [stream(5), snap(6, 6), mut(6, 4.0), end(6)]
    # later (after 5 s) the node rolled back to 1
    p2 = [stream(6), (6, 1, 9), snap(2, 2), mut(2, 8.0, b"\x00x"), end(2)]
    # the backup recording the rollback began at 7 s: the rollback does not apply at 5 s
    c = vbucket_cut(0, [p0, p1, p2], T0 + 5 * NS, starts=[T0, T0 + 3 * NS, T0 + 7 * NS])
    assert (c.part, c.seqno) == (1, 6)
    # it began at 4.5 s: the rollback applies (the archive knew of it by then)
    c = vbucket_cut(0, [p0, p1, p2], T0 + 5 * NS, starts=[T0, T0 + 3 * NS, T0 + int(4.5 * NS)])
    assert (c.part, c.seqno) == (2, 1)
    # the reading stopped at the first boundary after the time: p2 was not read
    read = []

    def tracked(p, i):
        for r in p:
            read.append(i)
            yield r

    vbucket_cut(0, [tracked(p, i) for i, p in enumerate([p0, p1, p2])], T0 + 3 * NS)
    assert 2 not in read


def test_timeline_lines_fit_80_columns_in_unicode_and_ascii():
    from dcptool.cli.timeline import timeline_lines

    cov = Coverage([(T0, T0 + 60 * NS), (T0 + 3600 * NS, T0 + 3660 * NS)], 10 * NS)
    info = {**cov.as_json(), "_coverage": cov}
    for uni, full, light in ((True, "█", "░"), (False, "#", ".")):
        lines = timeline_lines([("travel-sample", info), ("beer", info)], 80, unicode=uni)
        bars = lines[1:3]
        assert [b.split()[0] for b in bars] == ["travel-sample", "beer"]
        assert all(len(b) <= 80 and full in b and light in b for b in bars)
        assert "2026-11-28 14:00:00" in bars[0] and "2026-11-28 15:01:00" in bars[0]
        assert "1 gap, the longest 59 min" in lines[3]
