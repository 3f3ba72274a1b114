"""Resolving the backup a cluster archive's run names (archive/clusterruns.py) over
manifests: committed, replaced by a merged backup that ends where it ended (also after that
one was merged again: `extra.merge.ends_as`), or gone."""
from __future__ import annotations

from dcptool.archive.clusterruns import end_aliases, named_backups, resolve_backup
from dcptool.archive.merging import ends_as


def m(replaced=None, ends=None) -> dict:
    if replaced is None:
        return {"extra": {}}
    merge = {"replaced": list(replaced)}
    if ends is not None:
        merge["ends_as"] = list(ends)
    return {"extra": {"merge": merge}}


def test_committed_resolves_to_itself_also_beside_its_merged_backup():
    # a merge killed after publishing: originals and the merged backup side by side
    ms = {"a": m(), "b": m(), "b1": m(["a", "b"], ["b"])}
    assert resolve_backup(ms, "a") == "a" and resolve_backup(ms, "b") == "b"


def test_merged_range_ending_with_it_stands_for_it_and_the_middle_is_gone():
    ms = {"c1": m(["a", "b", "c"], ["c"]), "d": m()}
    assert resolve_backup(ms, "c") == "c1"
    assert resolve_backup(ms, "a") is None and resolve_backup(ms, "b") is None
    assert resolve_backup(ms, "zz") is None


def test_a_merged_backup_merged_again_through_ends_as():
    # c merged into c1 (ends as c), then c1 merged with later ones into f1: gone
    # c1's manifest, the run naming c still finds f1 only when f1 ended at c1
    first = m(["a", "b", "c"], ["c"])
    assert ends_as(first, "c1") == ["c1", "c"]
    ms = {"c2": m(["x", "c1"], ends_as(first, "c1"))}
    assert resolve_backup(ms, "c") == "c2" and resolve_backup(ms, "c1") == "c2"
    # a merged backup of an older dcptool (no ends_as): its last replaced id
    assert ends_as(m(["a", "b"]), "b1") == ["b1", "b"]
    ms = {"f": m(["c1", "d", "e"], ends_as(m(["e0", "e"]), "e"))}
    assert resolve_backup(ms, "c") is None and resolve_backup(ms, "c1") is None
    assert end_aliases(ms) == {"e": "f"}


def test_named_backups_leave_dropped_buckets_out():
    rec = {"buckets": {"a": {"backup": "x", "status": "full"}, "b": {"status": "dropped"}}}
    assert named_backups(rec) == {"a": "x"}
