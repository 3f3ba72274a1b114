"""Retention without Spark: policies over a synthetic chain of 40 backups with chosen
timestamps, removals that merge forward what kept backups depend on, every kept backup
restoring to its own state, a prune killed at each step, and the object-storage backend."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

import dcptool.archive.archive as archive_mod
from dcptool.archive import Archive
from dcptool.archive.retention import (
    Policy,
    apply_policy,
    older_than,
    parse_duration,
    plan_removal,
    remove_archive_backups,
    select_prune,
)
from dcptool.archive.verify import verify_archive
from dcptool.errors import UsageError

REPO = Path(__file__).resolve().parents[2]
VBS = 2
UUID = 0x5151
T0 = 1_700_000_000_000_000_000


def _t(s: str) -> datetime:
    return datetime.strptime(s, "%Y-%m-%d %H:%M").replace(tzinfo=timezone.utc)


def times40() -> list[datetime]:
    """40 backup times: one a month (2025-06..12, on the 15th), one or two a week (January
    2026 to February 3rd), two a day (February 10th..16th) and many an hour (February 17th)."""
    out = [_t(f"2025-{m:02d}-15 12:00") for m in range(6, 13)]                      # 0..6
    out += [_t(f"2026-{d} 09:00") for d in ("01-05", "01-07", "01-13", "01-20", "01-27",
                                           "02-03")]                                # 7..12
    for day in range(10, 17):                                                       # 13..26
        out += [_t(f"2026-02-{day} 08:00"), _t(f"2026-02-{day} 20:00")]
    out += [_t(f"2026-02-17 {hm}") for hm in ("00:10", "00:40", "01:10", "02:10", "02:20",
                                               "02:30", "03:05", "04:00", "04:59", "05:30",
                                               "06:00", "06:15", "06:45")]           # 27..39
    assert len(out) == 40 and out == sorted(out)
    return out


FULLS = {0, 20}


class Model:
    """What each backup of the synthetic chain holds, and the state a restore of it gives."""

    def __init__(self) -> None:
        self.seq = [0] * VBS
        self.live: list[dict[bytes, tuple[int, bytes]]] = [{} for _ in range(VBS)]
        self.states: dict[str, list[dict[bytes, bytes]]] = {}


def _mut(s: int, key: bytes, value: bytes) -> tuple:
    return (3, s, s, T0 + s, 0, 0, 1, key, value, None)


def add_backup(archive: Archive, model: Model, i: int, when: datetime, full: bool) -> str:
    with pytest.MonkeyPatch.context() as mp:  # the backup's id is its time
        mp.setattr(archive_mod, "utc_now", lambda: when)
        bw = archive.begin_backup("full" if full else "incremental")
    sums = []
    for vb in range(VBS):
        s0 = model.seq[vb]
        live = model.live[vb]
        recs: list[tuple] = []
        s = s0
        for key, value in ((b"k%d-%d" % (vb, i % 4), b'{"i":%d}' % i),
                           (b"n%d-%d" % (vb, i), b'{"new":%d}' % i)):
            s += 1
            recs.append(_mut(s, key, value))
            live[key] = (s, value)
        gone = b"n%d-%d" % (vb, i - 3)
        if gone in live:
            s += 1
            recs.append((4, s, s, T0 + s, gone, 0, 0, b""))
            del live[gone]
        if full:  # a full backup streams every live key from seqno 0, at its latest seqno
            recs = [_mut(q, k, v) for k, (q, v) in sorted(live.items(), key=lambda kv: kv[1][0])]
            start = {"uuid": UUID, "seqno": 0, "snap_start": 0, "snap_end": 0}
            marker = (2, 1, s, 2)
        else:
            start = {"uuid": UUID, "seqno": s0, "snap_start": s0, "snap_end": s0}
            marker = (2, s0 + 1, s, 2)
        w = bw.vbucket(vb, start, [[UUID, 0]])
        w.write([marker] + recs)
        model.seq[vb] = s
        sums.append(w.close({"uuid": UUID, "seqno": s, "snap_start": s, "snap_end": s}))
    bid = bw.commit(sums)["id"]
    model.states[bid] = [{k: v for k, (_, v) in model.live[vb].items()} for vb in range(VBS)]
    return bid


def make_chain(path, times=None, fulls=FULLS,
               passphrase: str | None = None) -> tuple[Archive, list[str], Model]:
    archive = Archive.create(path, bucket="default", vbuckets=VBS, passphrase=passphrase)
    model = Model()
    ids = [add_backup(archive, model, i, t, i in fulls) for i, t in enumerate(times or times40())]
    return archive, ids, model


def restored(archive: Archive, bid: str) -> list[dict[bytes, bytes]]:
    out = []
    for vb in range(VBS):
        state = archive.resolve_vbucket(vb, backup=bid)
        out.append({k: r[8] for k, r in state.items() if r[0] == 3})
    return out


def prune(archive: Archive, policy: Policy, **kw):
    with archive.lock("prune"):
        remove, reasons = select_prune(archive, policy)
        return remove_archive_backups(archive, remove, reasons=reasons, **kw)


def check_kept(archive: Archive, model: Model, kept: list[str], renamed: dict[str, str]) -> None:
    """The archive holds exactly the kept backups (some under their merged ids), each
    restores to the state its original held, and verify is clean."""
    now = [renamed.get(b, b) for b in kept]
    assert archive.committed_ids() == now
    assert archive.partial_ids() == []
    for orig, bid in zip(kept, now):
        assert restored(archive, bid) == model.states[orig], orig
    report = verify_archive(archive.path)
    assert report.ok, report.problems[:3]
    assert report.partial_backups == 0


# -- the policies ------------------------------------------------------------------------------


POLICIES = [
    (Policy(last=3), {37, 38, 39}),
    (Policy(hourly=4), {33, 35, 36, 39}),
    (Policy(daily=3), {24, 26, 39}),
    (Policy(weekly=3), {12, 24, 39}),
    (Policy(monthly=4), {5, 6, 11, 39}),
    (Policy(last=2, hourly=3, daily=2, weekly=2, monthly=3), {6, 11, 24, 26, 35, 36, 38, 39}),
    (Policy(daily=100), {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, *range(14, 27, 2), 39}),
    (Policy(monthly=1), {39}),
]


@pytest.mark.parametrize("policy,want", POLICIES, ids=lambda p: str(p))
def test_policies_keep_exactly_the_expected_backups(policy, want):
    from dcptool.archive.format import backup_id_for

    ids = [backup_id_for(t) for t in times40()]
    reasons = apply_policy(ids, policy)
    assert {i for i, b in enumerate(ids) if reasons[b]} == want
    assert "newest" in reasons[ids[-1]]


def test_policy_reasons_name_the_rule_and_its_bucket():
    from dcptool.archive.format import backup_id_for

    ids = [backup_id_for(t) for t in times40()]
    reasons = apply_policy(ids, Policy(last=1, hourly=1, daily=2, weekly=2, monthly=2))
    assert reasons[ids[39]] == ["last", "hourly 2026-02-17 06:00", "daily 2026-02-17",
                                "weekly 2026-W08", "monthly 2026-02", "newest"]
    assert reasons[ids[26]] == ["daily 2026-02-16"]
    assert reasons[ids[24]] == ["weekly 2026-W07"]
    assert reasons[ids[11]] == ["monthly 2026-01"]


def test_durations_and_older_than():
    assert parse_duration("30d") == timedelta(days=30)
    assert parse_duration("1d12h") == timedelta(hours=36)
    assert parse_duration("2w") == timedelta(weeks=2)
    assert parse_duration("90m") == timedelta(minutes=90)
    for bad in ("", "10", "d", "3x", "1d 2h", "-1d"):
        with pytest.raises(UsageError):
            parse_duration(bad)
    from dcptool.archive.format import backup_id_for

    ids = [backup_id_for(t) for t in times40()]
    got = older_than(ids, timedelta(days=1), now=_t("2026-02-17 08:00"))
    assert got == ids[:25]  # February 16th 08:00 is exactly a day old: not older


# -- pruning the 40-backup chain -------------------------------------------------------------


def test_prune_of_40_backups_keeps_the_policy_and_every_kept_backup_restores(tmp_path):
    archive, ids, model = make_chain(tmp_path / "a")
    policy, want = POLICIES[5]
    kept = [ids[i] for i in sorted(want)]

    dry = prune(archive, policy, dry_run=True)
    assert archive.committed_ids() == ids  # nothing changed
    assert dry.plan.keep == kept
    actions = {r["id"]: r["action"] for r in dry.rows}
    assert [i for i in range(40) if actions[ids[i]] == "delete"] == list(range(12, 20))
    # removed backups that kept ones depend on are merged into them
    assert [(ids.index(f), ids.index(k)) for f, k, _ in dry.plan.merges] == \
        [(0, 6), (7, 11), (20, 24), (25, 26), (27, 35), (37, 38)]

    ends = archive.end_positions()
    res = prune(archive, policy)
    assert archive.end_positions() == ends  # where the next backup starts: the watermark
    assert res.deleted == [ids[i] for i in range(19, 11, -1)]
    assert [m["type"] for m in res.merges] == ["full", "incremental", "full", "incremental",
                                               "incremental", "incremental"]
    check_kept(archive, model, kept, res.renamed)
    # a merged backup keeps its original's place in time: the same policy keeps them all
    again = prune(archive, policy)
    assert again.deleted == [] and again.merges == []
    assert archive.committed_ids() == [res.renamed.get(b, b) for b in kept]


def test_remove_keeps_chains_restorable(tmp_path):
    times = times40()[:8]
    archive, ids, model = make_chain(tmp_path / "a", times, fulls={0, 5})
    with archive.lock("remove"):
        with pytest.raises(UsageError, match="newest"):
            remove_archive_backups(archive, [ids[7]])
        # a full backup that later ones depend on: merged forward, the next one becomes full
        res = remove_archive_backups(archive, [ids[0], ids[3]])
    assert [(m["replaced"], m["type"]) for m in res.merges] == \
        [([ids[0], ids[1]], "full"), ([ids[3], ids[4]], "incremental")]
    kept = [ids[i] for i in (1, 2, 4, 5, 6, 7)]
    check_kept(archive, model, kept, res.renamed)
    # the newest backups of an older chain: nothing depends on them, they are deleted
    with archive.lock("remove"):
        res2 = remove_archive_backups(archive, [ids[2], res.renamed[ids[4]]])
    assert res2.deleted == [res.renamed[ids[4]], ids[2]] and res2.merges == []
    check_kept(archive, model, [ids[i] for i in (1, 5, 6, 7)], res.renamed)


def test_a_backup_two_kept_branches_depend_on_is_kept(tmp_path):
    archive, ids, model = make_chain(tmp_path / "a", times40()[:3], fulls={0})
    # a second branch from the first backup
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(archive_mod, "utc_now", lambda: _t("2026-03-01 00:00"))
        bw = archive.begin_backup("incremental", parent=ids[0])
    sums = []
    for vb in range(VBS):
        s0 = archive.manifest(ids[0])["vbuckets"][vb]["end"]["seqno"]
        w = bw.vbucket(vb, {"uuid": UUID, "seqno": s0, "snap_start": s0, "snap_end": s0},
                       [[UUID, 0]])
        w.write([(2, s0 + 1, s0 + 1, 2), _mut(s0 + 1, b"branch", b"{}")])
        sums.append(w.close({"uuid": UUID, "seqno": s0 + 1, "snap_start": s0 + 1,
                             "snap_end": s0 + 1}))
    branch = bw.commit(sums)["id"]
    plan = plan_removal(archive.manifests(), [ids[0], ids[1]])
    assert list(plan.held) == [ids[0]] and "separate branches" in plan.held[ids[0]]
    assert plan.merges == [(ids[1], ids[2], [ids[1], ids[2]])]
    with archive.lock("remove"):
        with pytest.raises(UsageError, match="cannot be removed"):
            remove_archive_backups(archive, [ids[0]], strict=True)
        res = remove_archive_backups(archive, [ids[0], ids[1]])
    assert archive.committed_ids() == [ids[0], res.renamed[ids[2]], branch]
    assert restored(archive, res.renamed[ids[2]]) == model.states[ids[2]]
    assert verify_archive(archive.path).ok


# -- a prune killed at each step ---------------------------------------------------------------

KILL_SCRIPT = """
import sys
from dcptool.archive import Archive
from dcptool.archive.retention import Policy, remove_archive_backups, select_prune
archive = Archive.open(sys.argv[1])
policy = Policy(**{k: int(v) for k, v in (a.split("=") for a in sys.argv[2:])})
with archive.lock("prune"):
    remove, reasons = select_prune(archive, policy)
    remove_archive_backups(archive, remove, reasons=reasons)
print("finished")
"""


def run_killed(path: str, step: int, policy: dict[str, int]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "DCPTOOL_FAULT":
           f"kill-after-removal-step:{step}"}
    return subprocess.run([sys.executable, "-c", KILL_SCRIPT, path,
                           *(f"{k}={v}" for k, v in policy.items())],
                          env=env, capture_output=True, text=True, timeout=120,
                          start_new_session=True)


def _killed_then_finished(location: str, archive: Archive, ids: list[str], model: Model,
                          policy: Policy, steps: int) -> None:
    """Run the prune in a process killed after one step of removal, again and again, until
    a run finishes: each run goes one step further (finishing what the last one left)."""
    want = sorted(b for b, why in apply_policy(ids, policy).items() if why)
    pol = {k: v for k, v in policy.as_dict().items() if v}
    killed = 0
    marked: list[str] = []  # backups a kill left half removed (object storage)
    for step in range(steps + 5):
        r = run_killed(location, 1, pol)
        if r.returncode == 0:
            assert "finished" in r.stdout
            break
        assert r.returncode == -signal.SIGKILL, r.stderr
        killed += 1
        # after the kill: restorable and verify-clean; no partial backup to resume; every
        # backup the policy keeps (or its merged successor) restores to its own state
        report = verify_archive(archive.path)
        assert report.ok, report.problems[:3]
        assert archive.partial_ids() == []
        marked += [b for b in archive.backup_ids() if archive.is_being_removed(b)
                   and not archive.is_committed(b)]
        present = archive.committed_ids()
        for bid in present:
            assert archive.chain(bid)[0].manifest["type"] == "full"
        for orig in want:
            now = orig if orig in present else next(
                b for b in present if b > orig and b[:15] == orig[:15])
            assert restored(archive, now) == model.states[orig], (step, orig)
    assert killed == steps
    if archive.path.__class__.__name__ == "S3Path":
        assert marked, "no kill left a backup half removed"
    res = prune(archive, policy)  # the next run finishes the work
    renamed = {}
    for bid in archive.committed_ids():
        orig = next((o for o in want if o[:15] == bid[:15] and o <= bid), bid)
        renamed[orig] = bid
    check_kept(archive, model, want, renamed)
    assert res.plan.remove == []


def test_a_prune_killed_at_each_step_leaves_a_valid_archive(tmp_path):
    archive, ids, model = make_chain(tmp_path / "a", times40()[:10], fulls={0, 3, 6})
    # keeps 4 (3 merged into it), 5, 6, 8 (7 merged into it) and 9; 0..2 are deleted
    policy = Policy(last=2, monthly=4)
    # steps: the deletions one by one, then per merge: published, each original removed
    _killed_then_finished(str(tmp_path / "a"), archive, ids, model, policy, 9)


# -- object storage ----------------------------------------------------------------------------


def test_prune_on_object_storage(s3):
    server, bucket = s3
    loc = f"s3://{bucket}/arch"
    archive, ids, model = make_chain(loc, times40()[:8], fulls={0, 3})
    policy = Policy(last=1, monthly=3)
    want = sorted(b for b, why in apply_policy(ids, policy).items() if why)
    assert [ids.index(b) for b in want] == [5, 6, 7]
    ends = archive.end_positions()
    res = prune(archive, policy)
    assert archive.end_positions() == ends
    assert res.deleted == [ids[2], ids[1], ids[0]]
    assert [(m["replaced"], m["type"]) for m in res.merges] == [(ids[3:6], "full")]
    check_kept(archive, model, want, res.renamed)


def test_a_prune_killed_on_object_storage_is_finished_by_the_next(s3):
    server, bucket = s3
    loc = f"s3://{bucket}/arch"
    archive, ids, model = make_chain(loc, times40()[:6], fulls={0, 3})
    _killed_then_finished(loc, archive, ids, model, Policy(last=1, monthly=2), 6)
