"""prune, remove, merge and watermarks of a cluster archive: the unit is the backup run.

One node (module-scoped) with three buckets of 64 vbuckets; four backup runs with changes
between them (the documents each bucket held at each run are kept); bucket `events` is
dropped and created again before the fourth run (two chains in its archive). Each test that
changes the archive works on a copy. Restores go into fresh node processes and are
compared with what the node held at the run's time. Spark jobs run on the warm engine.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from docutil import delete, load, node_documents, opts_for
from nodeprocutil import NodeProcess

from dcptool.archive.cluster import ClusterArchive
from dcptool.archive.clusterruns import RunResolver

PASSWORD = "password"
VBS = 64
BUCKETS = ("default", "events", "travel")
JSON_DOC = Path(__file__).resolve().parents[2] / "docs" / "json-output.md"


def documented(title: str) -> dict:
    text = JSON_DOC.read_text()
    at = text.index(title)
    block = text[text.index("```json\n", at) + 8:]
    return json.loads(block[:block.index("```")])


def run(*args: str, ok: bool = True, timeout: float = 240) -> subprocess.CompletedProcess:
    e = dict(os.environ)
    e["DCPTOOL_PASSWORD"] = PASSWORD
    r = subprocess.run([sys.executable, "-m", "dcptool", *args], capture_output=True, text=True,
                       env=e, stdin=subprocess.DEVNULL, timeout=timeout)
    if ok:
        assert r.returncode == 0, (args, r.stderr)
    return r


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
        for i in range(4):
            if i == 0:
                write("default", {f"d{n}": {"v": n} for n in range(30)})
                write("travel", {f"t{n}": {"v": n} for n in range(20)})
                write("events", {f"e{n}": {"v": n} for n in range(10)})
            else:
                write("default", {f"d{n}": {"v": n, "run": i} for n in range(5 * i, 5 * i + 8)},
                      gone=[f"d{20 + i}"])
                write("travel", {f"t{20 + i}": {"v": i}, f"t{i}": {"v": -i}}, gone=[f"t{10 + i}"])
                if i == 3:  # dropped and created again: a new chain in its archive
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


@pytest.fixture
def copy(prepared, tmp_path):
    """A copy of the prepared archive for a test that changes it."""
    node, archive, runs, states = prepared
    dst = tmp_path / "cluster"
    shutil.copytree(archive, dst)
    return dst


def committed(archive: Path, bucket: str) -> list[str]:
    return ClusterArchive.open(archive).open_bucket(bucket).committed_ids()


def restore_equals(archive: Path, run_id: str | None, want: dict, tmp_path: Path,
                   name: str) -> None:
    """Restore `run_id` into a fresh node and compare each bucket with `want`."""
    with NodeProcess(tmp_path / name, vbuckets=VBS) as target:
        t = f"{target.host}:{target.port}"
        args = ["restore", str(archive), "-c", t, "--auto-create-buckets", "--json",
                "--no-progress"]
        if run_id is not None:
            args += ["--run", run_id]
        run(*args)
        for b in BUCKETS:
            assert live(target, b) == want[b], (run_id, b)


def test_prune_keep_last_2_then_kept_runs_restore_as_they_were(prepared, copy, tmp_path):
    node, _archive, runs, states = prepared
    before = {b: committed(copy, b) for b in BUCKETS}
    r = run("prune", str(copy), "--keep-last", "2", "--json", "--no-progress")
    d = json.loads(r.stdout)
    assert set(d) == set(documented("### dcptool prune of a cluster archive"))
    assert d["kept_runs"] == runs[2:] and d["dropped_runs"] == runs[:2]
    assert d["deleted_runs"] == runs[:2] and d["incomplete_runs"] == {}
    assert ClusterArchive.open(copy).run_ids() == runs[2:]
    # default and travel: the first two runs' backups merged forward into the third's
    for b in ("default", "travel"):
        m = d["buckets"][b]["merges"]
        assert len(m) == 1 and m[0]["replaced"] == before[b][:3] and m[0]["type"] == "full"
        assert committed(copy, b) == [m[0]["merged_id"], before[b][3]]
    # events: its first chain ends at the third run, the fourth starts a new one
    assert d["buckets"]["events"]["merges"][0]["replaced"] == before["events"][:3]
    assert len(committed(copy, "events")) == 2
    restore_equals(copy, runs[2], states[2], tmp_path, "t3")
    restore_equals(copy, runs[3], states[3], tmp_path, "t4")


def test_merge_all_runs_then_the_last_restores_the_node(prepared, copy, tmp_path):
    node, _archive, runs, states = prepared
    r = run("merge", str(copy), "--json", "--no-progress")
    d = json.loads(r.stdout)
    assert set(d) == set(documented("### dcptool merge of a cluster archive"))
    assert d["runs"] == runs
    assert d["buckets"]["default"]["status"] == "merged"
    assert d["buckets"]["travel"]["status"] == "merged"
    assert len(d["buckets"]["default"]["merge"]["replaced"]) == 4
    # the bucket dropped and created again: two chains in the range, reported and left
    assert d["buckets"]["events"]["status"] == "left"
    assert "two chains" in d["buckets"]["events"]["reason"]
    assert len(committed(copy, "events")) == 4
    assert d["deleted_runs"] == runs[:3]
    assert ClusterArchive.open(copy).run_ids() == [runs[3]]
    assert committed(copy, "default") == [d["buckets"]["default"]["merge"]["merged_id"]]
    restore_equals(copy, None, {b: live(node, b) for b in BUCKETS}, tmp_path, "t")


def test_remove_a_run_and_an_incomplete_run_is_refused(prepared, copy, tmp_path):
    node, _archive, runs, states = prepared
    before = committed(copy, "travel")
    r = run("remove", str(copy), "--run", runs[1], "--json", "--no-progress")
    d = json.loads(r.stdout)
    assert set(d) == set(documented("### dcptool remove of a cluster archive"))
    assert d["dropped_runs"] == [runs[1]] and d["deleted_runs"] == [runs[1]]
    # the second run's backup merged into the third's; the others stay
    m = d["buckets"]["travel"]["merges"]
    assert [x["replaced"] for x in m] == [before[1:3]]
    assert committed(copy, "travel") == [before[0], m[0]["merged_id"], before[3]]
    cluster = ClusterArchive.open(copy)
    assert cluster.run_ids() == [runs[0], runs[2], runs[3]]
    # then the first run's backups of travel only (--bucket): its file is kept and it is
    # incomplete; the third run resolves through a merged backup merged again
    r = run("remove", str(copy), "--run", runs[0], "--bucket", "travel", "--json",
            "--no-progress")
    d = json.loads(r.stdout)
    assert d["deleted_runs"] == [] and list(d["buckets"]) == ["travel"]
    assert d["incomplete_runs"] == {runs[0]: {"travel": before[0]}}
    assert ClusterArchive.open(copy).run_ids() == [runs[0], runs[2], runs[3]]
    resolver = RunResolver(ClusterArchive.open(copy))
    assert resolver.state(runs[2]).complete and not resolver.state(runs[0]).complete
    with NodeProcess(tmp_path / "t", vbuckets=VBS) as target:
        t = f"{target.host}:{target.port}"
        r = run("restore", str(copy), "-c", t, "--run", runs[0], "--auto-create-buckets",
                ok=False)
        assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
        assert "incomplete" in r.stderr and "travel" in r.stderr and before[0] in r.stderr
        assert "Traceback" not in r.stderr
    restore_equals(copy, runs[2], states[2], tmp_path, "t3")
    # the newest run is never removed
    r = run("remove", str(copy), "--run", runs[3], ok=False)
    assert r.returncode == 2 and "newest" in r.stderr and r.stderr.strip().count("\n") == 0


def test_dry_run_changes_nothing(prepared, copy):
    _node, _archive, runs, _states = prepared
    snap = tree(copy)
    r = run("prune", str(copy), "--keep-last", "1", "--dry-run", "--json")
    d = json.loads(r.stdout)
    assert d["dry_run"] and d["dropped_runs"] == runs[:3] and d["deleted_runs"] == []
    assert [x["action"] for x in d["runs"]] == ["drop"] * 3 + ["keep"]
    actions = [x["action"] for x in d["buckets"]["default"]["backups"]]
    assert actions == ["merge", "merge", "merge", "merge-into"]
    r = run("prune", str(copy), "--keep-last", "1", "--dry-run")
    assert "would drop 3 runs" in r.stdout
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
    assert sorted(d["incomplete_runs"]) == runs[:2]
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


def test_watermarks_of_a_cluster_archive(prepared):
    node, archive, _runs, _states = prepared
    c = node.cluster
    r = run("watermark", "register", "-c", c, "--archive", str(archive), "--json")
    d = json.loads(r.stdout)
    assert sorted(d["buckets"]) == list(BUCKETS) and d["skipped"] == {}
    uuids = {b: ClusterArchive.open(archive).open_bucket(b).uuid for b in BUCKETS}
    for b in BUCKETS:
        listed = json.loads(run("watermark", "list", "-c", c, "-b", b, "--json").stdout)
        mine = [e for e in listed["entries"] if e["instance"] == uuids[b]]
        assert len(mine) == 1 and len(mine[0]["vbuckets"]) == VBS, b
        # each bucket's table holds its own archive's watermark only
        assert not [e for e in listed["entries"]
                    if e["instance"] in set(uuids.values()) - {uuids[b]}]
    r = run("watermark", "remove", "-c", c, "--archive", str(archive), "--json")
    assert sorted(x["bucket"] for x in json.loads(r.stdout)["removed"]) == list(BUCKETS)
    listed = json.loads(run("watermark", "list", "-c", c, "-b", "travel", "--json").stdout)
    assert not [e for e in listed["entries"] if e["instance"] == uuids["travel"]]
