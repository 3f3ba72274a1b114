"""prune, remove, merge and watermarks of a cluster archive: the unit is the backup run.

One node (module-scoped) with three buckets of 64 vbuckets; three backup runs with changes
between them (the documents each bucket held at each run are kept); bucket `events` is
dropped and created again before the third run (two chains in its archive). Each test that
changes the archive works on a copy. Restores go into a second node (module-scoped), each
into buckets of new names (--map-data), and are compared with what the node held at the
run's time. Spark jobs run on the warm engine.
"""
from __future__ import annotations

import itertools
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from cliutil import documented_under, run_as_cluster_user
from docutil import delete, load, node_documents, opts_for
from nodeprocutil import NodeProcess

from dcptool.archive.cluster import ClusterArchive
from dcptool.archive.clusterruns import RunResolver

PASSWORD = "password"
VBS = 64
BUCKETS = ("default", "events", "travel")


def run(*args: str, **kw) -> subprocess.CompletedProcess:
    return run_as_cluster_user(*args, password=PASSWORD, **kw)


def live(node, bucket: str) -> dict[bytes, bytes]:
    return {k: v[1] for k, v in node_documents(opts_for(node, bucket)).items()
            if v[0] == "live"}


def tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file() and "logs" not in p.parts}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, warm_engine):
    """(the node, the prepared archive, [run ids], [{bucket: live documents} per run])."""
    mp = pytest.MonkeyPatch()
    mp.setenv("DCPTOOL_ENGINE_DIR", warm_engine)
    mp.delenv("DCPTOOL_ENGINE", raising=False)
    root = tmp_path_factory.mktemp("clprune")
    node = NodeProcess(root / "node", vbuckets=VBS).start()
    try:
        c = f"{node.host}:{node.port}"
        node.cluster = c
        for b in ("travel", "events"):
            run("bucket", "create", b, "-c", c, "--num-vbuckets", str(VBS))

        def write(bucket: str, docs: dict, gone=()) -> None:
            with opts_for(node, bucket).connect() as conn:
                load(conn, docs, VBS)
                delete(conn, gone, VBS)

        archive = root / "cluster"
        runs, states = [], []
        for i in range(3):
            if i == 0:
                write("default", {f"d{n}": {"v": n} for n in range(30)})
                write("travel", {f"t{n}": {"v": n} for n in range(20)})
                write("events", {f"e{n}": {"v": n} for n in range(10)})
            else:
                write("default", {f"d{n}": {"v": n, "run": i} for n in range(5 * i, 5 * i + 8)},
                      gone=[f"d{20 + i}"])
                write("travel", {f"t{20 + i}": {"v": i}, f"t{i}": {"v": -i}}, gone=[f"t{10 + i}"])
                if i == 2:  # dropped and created again: a new chain in its archive
                    run("bucket", "drop", "events", "-c", c)
                    run("bucket", "create", "events", "-c", c, "--num-vbuckets", str(VBS))
                    write("events", {f"new{n}": {"n": n} for n in range(4)})
                else:
                    write("events", {f"e{i}": {"v": i, "run": i}})
            r = run("backup", "-c", c, str(archive), "--all-buckets", "--no-watermark",
                    "--disable-users", "--json")
            runs.append(json.loads(r.stdout)["run_id"])
            states.append({b: live(node, b) for b in BUCKETS})
        yield node, archive, runs, states
    finally:
        node.stop()
        mp.undo()


@pytest.fixture(scope="module")
def target(prepared, tmp_path_factory):
    """The node restores go into."""
    with NodeProcess(tmp_path_factory.mktemp("target") / "node", vbuckets=VBS) as t:
        t.cluster = f"{t.host}:{t.port}"
        yield t


@pytest.fixture
def copy(prepared, tmp_path):
    """A copy of the prepared archive for a test that changes it."""
    node, archive, runs, states = prepared
    dst = tmp_path / "cluster"
    shutil.copytree(archive, dst)
    return dst


def committed(archive: Path, bucket: str) -> list[str]:
    return ClusterArchive.open(archive).open_bucket(bucket).committed_ids()


_TAGS = itertools.count(1)


def restore_equals(archive: Path, run_id: str | None, want: dict, target) -> None:
    """Restore `run_id` (None: the latest) into new buckets of `target` and compare each
    bucket with `want`."""
    tag = next(_TAGS)
    renames = ",".join(f"{b}={b}_{tag}" for b in BUCKETS)
    args = ["restore", str(archive), "-c", target.cluster, "--auto-create-buckets", "--json",
            "--no-progress", "--map-data", renames, "--bucket-ram-quota", "100"]
    if run_id is not None:
        args += ["--run", run_id]
    d = json.loads(run(*args).stdout)
    assert sorted(d["created_buckets"]) == [f"{b}_{tag}" for b in BUCKETS]
    for b in BUCKETS:
        assert live(target, f"{b}_{tag}") == want[b], (run_id, b)


def test_prune_keep_last_2_then_kept_runs_restore_as_they_were(prepared, copy, target):
    node, _archive, runs, states = prepared
    before = {b: committed(copy, b) for b in BUCKETS}
    r = run("prune", str(copy), "--keep-last", "2", "--json", "--no-progress")
    d = json.loads(r.stdout)
    assert set(d) == set(documented_under("### dcptool prune of a cluster archive"))
    assert d["kept_runs"] == runs[1:] and d["dropped_runs"] == runs[:1]
    assert d["deleted_runs"] == runs[:1] and d["incomplete_runs"] == {}
    assert ClusterArchive.open(copy).run_ids() == runs[1:]
    # the first run's backups merged forward into the second's (its events backup too:
    # the end of that bucket's first chain; the third run's starts a new one)
    for b in BUCKETS:
        m = d["buckets"][b]["merges"]
        assert len(m) == 1 and m[0]["replaced"] == before[b][:2] and m[0]["type"] == "full"
        assert committed(copy, b) == [m[0]["merged_id"], before[b][2]]
    restore_equals(copy, runs[1], states[1], target)
    restore_equals(copy, runs[2], states[2], target)


def test_merge_all_runs_then_the_last_restores_the_node(prepared, copy, target):
    node, _archive, runs, states = prepared
    r = run("merge", str(copy), "--json", "--no-progress")
    d = json.loads(r.stdout)
    assert set(d) == set(documented_under("### dcptool merge of a cluster archive"))
    assert d["runs"] == runs
    for b in ("default", "travel"):
        assert d["buckets"][b]["status"] == "merged"
        assert len(d["buckets"][b]["merge"]["replaced"]) == 3
        assert committed(copy, b) == [d["buckets"][b]["merge"]["merged_id"]]
    # the bucket dropped and created again: two chains in the range, reported and left
    assert d["buckets"]["events"]["status"] == "left"
    assert "two chains" in d["buckets"]["events"]["reason"]
    assert len(committed(copy, "events")) == 3
    assert d["deleted_runs"] == runs[:2]
    assert ClusterArchive.open(copy).run_ids() == [runs[2]]
    restore_equals(copy, None, {b: live(node, b) for b in BUCKETS}, target)


def test_merge_a_range_of_runs(prepared, copy, target):
    """--from/--to: each bucket's backups of the first two runs merged (events too: both
    on its first chain); the first run's file deleted, the second restores as it was
    through the merged backups, the third is untouched."""
    _node, _archive, runs, states = prepared
    before = {b: committed(copy, b) for b in BUCKETS}
    r = run("merge", str(copy), "--from", runs[0], "--to", runs[1], "--json")
    d = json.loads(r.stdout)
    assert d["runs"] == runs[:2] and d["deleted_runs"] == [runs[0]]
    for b in BUCKETS:
        x = d["buckets"][b]
        assert x["status"] == "merged" and x["merge"]["replaced"] == before[b][:2], b
        assert committed(copy, b) == [x["merge"]["merged_id"], before[b][2]]
    assert ClusterArchive.open(copy).run_ids() == runs[1:]
    assert RunResolver(ClusterArchive.open(copy)).state(runs[2]).complete
    restore_equals(copy, runs[1], states[1], target)
    # a range of one run: nothing to merge, nothing deleted
    d = json.loads(run("merge", str(copy), "--from", runs[2], "--json").stdout)
    assert {x["status"] for x in d["buckets"].values()} == {"nothing"}
    assert d["deleted_runs"] == [] and ClusterArchive.open(copy).run_ids() == runs[1:]
    r = run("merge", str(copy), "--from", runs[2], "--to", runs[1], ok=False)
    assert r.returncode == 2 and "after" in r.stderr


def test_remove_a_run_and_an_incomplete_run_is_refused(prepared, copy, target):
    node, _archive, runs, states = prepared
    before = committed(copy, "travel")
    events = committed(copy, "events")
    r = run("remove", str(copy), "--run", runs[1], "--json", "--no-progress")
    d = json.loads(r.stdout)
    assert set(d) == set(documented_under("### dcptool remove of a cluster archive"))
    assert d["dropped_runs"] == [runs[1]] and d["deleted_runs"] == [runs[1]]
    # the second run's backup merged into the third's; the first run's stays
    m = d["buckets"]["travel"]["merges"]
    assert [x["replaced"] for x in m] == [before[1:3]]
    assert committed(copy, "travel") == [before[0], m[0]["merged_id"]]
    # events: nothing kept depends on the second run's backup (the third is a new chain)
    assert d["buckets"]["events"]["deleted"] == [events[1]]
    assert committed(copy, "events") == [events[0], events[2]]
    assert ClusterArchive.open(copy).run_ids() == [runs[0], runs[2]]
    # then the first run's backup of travel only (--bucket): its file is kept and it is
    # incomplete; the third run resolves through a merged backup merged again
    r = run("remove", str(copy), "--run", runs[0], "--bucket", "travel", "--json",
            "--no-progress")
    d = json.loads(r.stdout)
    assert d["deleted_runs"] == [] and list(d["buckets"]) == ["travel"]
    assert d["incomplete_runs"] == {runs[0]: {"travel": before[0]}}
    assert ClusterArchive.open(copy).run_ids() == [runs[0], runs[2]]
    resolver = RunResolver(ClusterArchive.open(copy))
    assert resolver.state(runs[2]).complete and not resolver.state(runs[0]).complete
    r = run("restore", str(copy), "-c", target.cluster, "--run", runs[0],
            "--auto-create-buckets", "--map-data", "travel=refused", ok=False)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
    assert "incomplete" in r.stderr and "travel" in r.stderr and before[0] in r.stderr
    listed = json.loads(run("bucket", "list", "-c", target.cluster, "--json").stdout)
    assert "refused" not in [b["name"] for b in listed]  # nothing built
    restore_equals(copy, runs[2], states[2], target)
    # the newest run is never removed
    r = run("remove", str(copy), "--run", runs[2], ok=False)
    assert r.returncode == 2 and "newest" in r.stderr and r.stderr.strip().count("\n") == 0


def test_dry_run_changes_nothing(prepared, copy):
    _node, _archive, runs, _states = prepared
    snap = tree(copy)
    r = run("prune", str(copy), "--keep-last", "1", "--dry-run", "--json")
    d = json.loads(r.stdout)
    assert d["dry_run"] and d["dropped_runs"] == runs[:2] and d["deleted_runs"] == []
    assert [x["action"] for x in d["runs"]] == ["drop", "drop", "keep"]
    actions = [x["action"] for x in d["buckets"]["default"]["backups"]]
    assert actions == ["merge", "merge", "merge-into"]
    # events: the old chain's backups nothing kept depends on are deleted
    assert [x["action"] for x in d["buckets"]["events"]["backups"]] == \
        ["delete", "delete", "keep"]
    r = run("prune", str(copy), "--keep-last", "1", "--dry-run")
    assert "would drop 2 runs" in r.stdout
    run("merge", str(copy), "--bucket", "nosuch", ok=False)
    assert tree(copy) == snap


def test_bucket_selection_prunes_only_those_buckets(prepared, copy):
    _node, _archive, runs, _states = prepared
    default_before = committed(copy, "default")
    r = run("prune", str(copy), "--keep-last", "2", "--bucket", "travel", "--json")
    d = json.loads(r.stdout)
    assert list(d["buckets"]) == ["travel"] and d["deleted_runs"] == []
    assert len(committed(copy, "travel")) == 2
    assert committed(copy, "default") == default_before
    assert ClusterArchive.open(copy).run_ids() == runs
    assert sorted(d["incomplete_runs"]) == runs[:1]
    assert set(d["incomplete_runs"][runs[0]]) == {"travel"}
    # merge of one bucket keeps the run files too
    r = run("merge", str(copy), "--bucket", "default", "--json")
    d = json.loads(r.stdout)
    assert list(d["buckets"]) == ["default"] and d["deleted_runs"] == []
    assert len(committed(copy, "default")) == 1
    assert ClusterArchive.open(copy).run_ids() == runs
    r = run("prune", str(copy), "--keep-last", "1", "--bucket", "nosuch", ok=False)
    assert r.returncode == 2 and "no bucket nosuch" in r.stderr


def test_the_cluster_lock_is_met_as_a_bucket_archives(prepared, copy):
    snap = tree(copy)
    lock = ClusterArchive.open(copy).lock("test").acquire()
    try:
        for args in (["prune", "--keep-last", "1"], ["merge"],
                     ["remove", "--older-than", "1s"]):
            r = run(args[0], str(copy), *args[1:], ok=False)
            assert r.returncode == 3, (args, r.stderr)
            assert r.stderr.strip().count("\n") <= 1 and "Traceback" not in r.stderr
    finally:
        lock.release()
    assert tree(copy) == snap
    # bucket-archive options on a cluster archive, and the reverse: one line
    r = run("remove", str(copy), "--backup", "20261122T101502.123456Z", ok=False)
    assert r.returncode == 2 and "--run" in r.stderr
    r = run("prune", str(copy / "buckets" / "travel"), "--keep-last", "1", "--bucket", "x",
            ok=False)
    assert r.returncode == 2 and "--bucket is for cluster archives" in r.stderr


def test_watermarks_of_a_cluster_archive(prepared):
    """register --archive of a cluster archive: each bucket archive's watermark in the
    node's bucket of its name (each bucket's table holds its own archive's only); remove
    --archive takes them all out."""
    from dcptool.client.watermark import list_watermarks

    node, archive, _runs, _states = prepared
    c = node.cluster

    def entries(bucket: str) -> list[dict]:
        with opts_for(node, bucket).connect() as conn:
            return list_watermarks(conn)["entries"]

    r = run("watermark", "register", "-c", c, "--archive", str(archive), "--json")
    d = json.loads(r.stdout)
    assert sorted(d["buckets"]) == list(BUCKETS) and d["skipped"] == {}
    uuids = {b: ClusterArchive.open(archive).open_bucket(b).uuid for b in BUCKETS}
    for b in BUCKETS:
        mine = [e for e in entries(b) if e["instance"] in set(uuids.values())]
        assert [e["instance"] for e in mine] == [uuids[b]], b
        assert len(mine[0]["vbuckets"]) == VBS
    r = run("watermark", "remove", "-c", c, "--archive", str(archive), "--json")
    assert sorted(x["bucket"] for x in json.loads(r.stdout)["removed"]) == list(BUCKETS)
    assert not [e for e in entries("travel") if e["instance"] == uuids["travel"]]
