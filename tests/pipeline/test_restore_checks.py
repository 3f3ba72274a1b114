"""What a restore checks before it writes, and restores across vbucket counts.

Real node processes (64 and 1024 vbuckets), the session's SparkSession, real archives:
- `restore --dry-run` checks the target as the restore does (connection, login, bucket,
  privileges, collections it would create) and fails with the restore's line and status;
  a dry run that passes reports the target and the archive's checks and writes nothing;
- a 64-vbucket archive restored into a 1024-vbucket node and a 1024-vbucket archive into a
  64-vbucket node: every document with its metadata, `verify --against` passes, and a
  document changed on the target is found;
- a restore (and its dry run) refuses the backups `verify` refuses: a changed byte in a
  done file (plain and encrypted archive), a changed vbucket end uuid in a manifest.
"""
from __future__ import annotations

import json
import shutil
import socket

import pytest
from cliutil import cli
from docutil import load, node_documents, opts_for
from nodeprocutil import NodeProcess

from dcptool.archive import crypto
from dcptool.client.ops import get_vbucket_seqnos
from dcptool.client.rest import RestClient
from dcptool.protocol import vbucket_of

DOCS = 300
PASS = "restore-checks passphrase"
USERS = {"rd": "reader", "rs": "restore"}


def pw(user: str) -> str:
    return f"{user}-pw-31"


def _rest(node) -> RestClient:
    return RestClient(node.host, node.rest_port, username=node.username,
                      password=node.password, bucket=node.bucket)


def _addr(node) -> str:
    return f"{node.host}:{node.port}"


def _highs(node) -> dict[int, int]:
    with opts_for(node).connect() as conn:
        return get_vbucket_seqnos(conn, state=1)


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("dcptool: error: "), err
    return lines[0]


@pytest.fixture(scope="module")
def nodes(tmp_path_factory):
    """src (64 vbuckets, documents in the default collection and in s1.c1), t1024 (empty,
    1024 vbuckets, users rd and rs), t64 (empty, 64 vbuckets)."""
    from client.nodeutil import run_cli

    base = tmp_path_factory.mktemp("restore-checks")
    src = NodeProcess(base / "src", vbuckets=64)
    t1024 = NodeProcess(base / "t1024", vbuckets=1024)
    t64 = NodeProcess(base / "t64", vbuckets=64)
    t1024.data_dir.mkdir(parents=True)
    for user, role in USERS.items():
        r = run_cli("node", "user", "add", user, "--role", role, "--data", str(t1024.data_dir),
                    env_extra={"DCPTOOL_PASSWORD": pw(user)})
        assert r.returncode == 0, r.stderr
    for n in (src, t1024, t64):
        n.start()
    try:
        r = _rest(src)
        r.create_scope("s1")
        r.create_collection("s1", "c1")
        with opts_for(src).connect() as conn:
            load(conn, {f"doc::{i:04d}": {"i": i} for i in range(DOCS)}, 64)
        yield src, t1024, t64
    finally:
        for n in (src, t1024, t64):
            n.stop()


@pytest.fixture(scope="module")
def archive64(nodes, spark, tmp_path_factory):
    from dcptool.pipeline.backup import run_backup

    src = nodes[0]
    path = tmp_path_factory.mktemp("a64") / "archive"
    run_backup(opts_for(src), path, spark=spark)
    return path


@pytest.fixture
def admin(monkeypatch, nodes):
    monkeypatch.setenv("DCPTOOL_PASSWORD", nodes[0].password)
    monkeypatch.delenv("DCPTOOL_USERNAME", raising=False)


def test_a_dry_run_fails_where_and_as_the_restore_fails(nodes, archive64, capsys, monkeypatch,
                                                        admin):
    _src, t1024, _t64 = nodes
    addr = _addr(t1024)
    cases = {
        "closed port": (["-c", f"127.0.0.1:{_closed_port()}"], {}, "127.0.0.1"),
        "wrong password": (["-c", addr], {"DCPTOOL_PASSWORD": "not-the-password"}, "auth"),
        "no such bucket": (["-c", addr, "-b", "nosuch"], {}, "nosuch"),
        "no MetaWrite": (["-c", addr, "-u", "rd"], {"DCPTOOL_PASSWORD": pw("rd")},
                         "MetaWrite"),
        "may not create s1.c1": (["-c", addr, "-u", "rs"], {"DCPTOOL_PASSWORD": pw("rs")},
                                 "may not create scopes and collections"),
    }
    for name, (args, env, word) in cases.items():
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        rc_dry, _out, err_dry = cli(capsys, "restore", archive64, *args, "--dry-run")
        rc, _out, err = cli(capsys, "restore", archive64, *args)
        monkeypatch.setenv("DCPTOOL_PASSWORD", t1024.password)
        line_dry, line = _one_line(err_dry), _one_line(err)
        assert rc_dry == rc and rc != 0, (name, rc_dry, rc, err_dry, err)
        assert line_dry == line, name
        assert word.lower() in line.lower(), (name, line)
    # nothing was written or created
    assert not any(_highs(t1024).values())
    assert _rest(t1024).manifest().scope("s1") is None


def test_a_dry_run_reports_the_target_and_writes_nothing(nodes, archive64, capsys, admin):
    _src, t1024, _t64 = nodes
    rc, out, err = cli(capsys, "restore", archive64, "-c", _addr(t1024), "--dry-run", "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert d["dry_run"] and d["restored"]["mutation"] == DOCS
    assert d["target"] == {"address": _addr(t1024), "bucket": "default", "vbuckets": 1024,
                           "archive_vbuckets": 64, "rerouted": True, "nodes": 1}
    assert d["collections"]["would_create"] == ["s1 (scope)", "s1.c1"]
    assert d["collections"]["created"] == []
    assert d["checked"]["backups"] == 1 and d["checked"]["files"] > 0
    assert d["checked"]["records"] >= DOCS
    # the backups' size is the one `info` and `verify` give (the bytes of their files)
    rc, info_out, err = cli(capsys, "info", archive64, "--json")
    assert rc == 0, err
    size = json.loads(info_out)["backups"][0]["size_on_disk"]
    assert d["checked"]["size_on_disk"] == size
    rc, verify_out, err = cli(capsys, "verify", archive64)
    assert rc == 0, err
    from dcptool.cli.output import human_bytes

    assert f"1 backup ({human_bytes(size)})" in verify_out
    rc, out, err = cli(capsys, "restore", archive64, "-c", _addr(t1024), "--dry-run")
    assert rc == 0, err
    assert f"archive: 1 backup ({human_bytes(size)}), " in out
    assert (f"target: bucket default on {_addr(t1024)}: logged in, privileges held, 1024 "
            "vbuckets, keys routed by its own map (the archive has 64)") in out
    assert "would create on the target: s1 (scope), s1.c1" in out
    assert "records checked as verify does" in out
    assert not any(_highs(t1024).values())
    assert _rest(t1024).manifest().scope("s1") is None


def _verify_against(capsys, archive, node) -> dict:
    rc, out, err = cli(capsys, "verify", archive, "--against", "-c", _addr(node), "--json")
    d = json.loads(out)
    assert rc == (0 if d["ok"] else 1), err
    return d


def _change_and_find(capsys, archive, node, vbuckets: int) -> None:
    """A document changed on `node` is found by verify --against, in the archive's vbucket
    of its key."""
    key = "doc::0123"
    with opts_for(node).connect() as conn:
        load(conn, {key: {"i": 123, "changed": True}}, node.vbuckets)
    d = _verify_against(capsys, archive, node)
    vb = vbucket_of(key.encode(), vbuckets)
    assert not d["ok"] and d["vbuckets_differing"] == [vb]
    (bad,) = [v for v in d["vbuckets"] if v["vbucket"] == vb]
    (diff,) = bad["differences"]
    assert diff["key"] == key and diff["archive"]["rev_seqno"] < diff["node"]["rev_seqno"]
    rc, out, _err = cli(capsys, "verify", archive, "--against", "-c", _addr(node))
    assert rc == 1 and f"vbucket {vb} differs" in out and key in out


def test_64_vbuckets_into_1024_then_verify_against(nodes, archive64, capsys, admin):
    src, t1024, _t64 = nodes
    rc, out, err = cli(capsys, "restore", archive64, "-c", _addr(t1024), "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert d["restored"]["mutation"] == DOCS and d["target"]["rerouted"]
    assert d["collections"]["created"] == ["s1 (scope)", "s1.c1"]
    # every document with its metadata (value, cas, rev seqno, flags, expiry)
    assert node_documents(opts_for(t1024)) == node_documents(opts_for(src))
    # each key in the target's own vbucket for it
    highs = _highs(t1024)
    used = {vbucket_of(f"doc::{i:04d}".encode(), 1024) for i in range(DOCS)}
    assert {vb for vb, h in highs.items() if h} == used
    v = _verify_against(capsys, archive64, t1024)
    assert v["ok"] and v["vbuckets_compared"] == 64
    assert v["keys_archive"] == v["keys_node"] == DOCS
    assert any("1024 vbuckets" in n for n in v["notes"])
    _change_and_find(capsys, archive64, t1024, 64)


def test_1024_vbuckets_into_64_then_verify_against(nodes, spark, tmp_path, capsys, admin):
    from dcptool.pipeline.backup import run_backup

    _src, t1024, t64 = nodes
    if not any(_highs(t1024).values()):
        pytest.skip("needs the 64 -> 1024 restore before it")
    archive = tmp_path / "archive1024"
    run_backup(opts_for(t1024), archive, spark=spark)
    rc, out, err = cli(capsys, "restore", archive, "-c", _addr(t64), "--json")
    assert rc == 0, err
    assert json.loads(out)["target"]["vbuckets"] == 64
    assert node_documents(opts_for(t64)) == node_documents(opts_for(t1024))
    v = _verify_against(capsys, archive, t64)
    assert v["ok"] and v["keys_archive"] == v["keys_node"] == DOCS
    _change_and_find(capsys, archive, t64, 1024)


def _flip(path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def _refused(capsys, archive, target, victim: str) -> None:
    """verify fails naming `victim`; restore and its dry run fail in one line naming it,
    with verify's exit status, and write nothing."""
    rc_v, out, _err = cli(capsys, "verify", archive)
    assert rc_v == 1 and victim in out, out
    before = _highs(target)
    for dry in ((), ("--dry-run",)):
        rc, _out, err = cli(capsys, "restore", archive, "-c", _addr(target), *dry)
        assert rc == rc_v and victim in _one_line(err), err
    assert _highs(target) == before


def test_restore_refuses_a_changed_done_file(nodes, archive64, tmp_path, capsys, admin):
    archive = tmp_path / "a"
    shutil.copytree(archive64, archive)
    (done,) = [p for p in archive.glob("backups/*/vb-0001.done.json")]
    _flip(done, 40)
    _refused(capsys, archive, nodes[2], str(done))


def test_restore_refuses_a_changed_done_file_of_an_encrypted_archive(nodes, tmp_path, capsys,
                                                                      admin, monkeypatch):
    src, _t1024, t64 = nodes
    monkeypatch.setenv(crypto.PASSPHRASE_ENV, PASS)
    archive = tmp_path / "enc"
    rc, _out, err = cli(capsys, "backup", archive, "-c", _addr(src), "--encrypt",
                        "--no-progress")
    assert rc == 0, err
    (done,) = [p for p in archive.glob("backups/*/vb-0001.done.json")]
    _flip(done, 40)
    _refused(capsys, archive, t64, str(done))


def test_restore_refuses_a_changed_end_uuid_in_a_manifest(nodes, archive64, tmp_path, capsys,
                                                          admin):
    archive = tmp_path / "a"
    shutil.copytree(archive64, archive)
    (mpath,) = archive.glob("backups/*/manifest.json")
    m = json.loads(mpath.read_text())
    m["vbuckets"][0]["end"]["uuid"] += 1
    mpath.write_text(json.dumps(m, indent=2))
    vb = m["vbuckets"][0]["vbucket"]
    # verify names the vbucket's done file (it no longer says what the manifest says) and
    # its data file (its end record is not the manifest's end); restore the first of them
    _refused(capsys, archive, nodes[2], f"/vb-{vb:04d}")


def test_a_chain_checked_in_spark_tasks_refuses_a_changed_data_file(nodes, archive64, tmp_path,
                                                                     capsys, admin, monkeypatch):
    """A restore large enough to check its chain in Spark tasks of their own (the thresholds
    lowered to every restore and the test session's 2 slots; the check in the restore's
    tasks turned off) still fails before writing anything, in one line naming the file, with
    verify's exit status; the run log says the check ran in tasks."""
    from dcptool.pipeline import restore

    monkeypatch.setattr(restore, "CHECK_IN_TASKS", False)
    monkeypatch.setattr(restore, "PARALLEL_CHECK_RECORDS", 0)
    monkeypatch.setattr(restore, "PARALLEL_CHECK_SLOTS", 2)   # the test session's local[2]
    archive = tmp_path / "a"
    shutil.copytree(archive64, archive)
    data = sorted(archive.glob("backups/*/vb-0005-000.mpk.zst"))[0]
    _flip(data, data.stat().st_size // 2)
    _refused(capsys, archive, nodes[2], str(data))
    logs = sorted(archive.glob("logs/restore-*.log"))
    assert logs and "as verify does in 2 Spark tasks" in logs[-1].read_text()


def test_a_chain_checked_in_spark_tasks_restores_every_document(nodes, archive64, tmp_path,
                                                                capsys, admin, monkeypatch):
    """The same check on a sound archive: every document restored, each with its metadata
    (the restore into a fresh node equals the source)."""
    from dcptool.pipeline import restore

    monkeypatch.setattr(restore, "CHECK_IN_TASKS", False)
    monkeypatch.setattr(restore, "PARALLEL_CHECK_RECORDS", 0)
    monkeypatch.setattr(restore, "PARALLEL_CHECK_SLOTS", 2)   # the test session's local[2]
    with NodeProcess(tmp_path / "t", vbuckets=64) as target:
        rc, _out, err = cli(capsys, "restore", archive64, "-c", _addr(target), "--no-progress")
        assert rc == 0, err
        assert node_documents(opts_for(target)) == node_documents(opts_for(nodes[0]))


# -- the check in the restore's own tasks (one barrier stage) ----------------------------------

IN_TASKS = "as verify does in the 2 restore tasks, before any wrote"


@pytest.fixture
def t64c(tmp_path):
    """A fresh 64-vbucket target that has s1.c1 already: the restore creates nothing on it,
    so its tasks check the chain themselves."""
    with NodeProcess(tmp_path / "t64c", vbuckets=64) as t:
        r = _rest(t)
        r.create_scope("s1")
        r.create_collection("s1", "c1")
        yield t


def _last_log(archive) -> str:
    """The run log of the last restore that was not a dry run."""
    logs = [t for t in (p.read_text() for p in sorted(archive.glob("logs/restore-*.log")))
            if "INFO restore dry run of" not in t]
    assert logs
    return logs[-1]


def _damaged_copy(archive64, tmp_path, *vbuckets: int):
    """A copy of the archive with one byte changed in the middle of each of the data files of
    `vbuckets`; returns (the copy, those files)."""
    archive = tmp_path / "a"
    shutil.copytree(archive64, archive)
    files = []
    for vb in vbuckets:
        data = sorted(archive.glob(f"backups/*/vb-{vb:04d}-000.mpk.zst"))[0]
        _flip(data, data.stat().st_size // 2)
        files.append(data)
    return archive, files


def test_restore_tasks_check_their_vbuckets_then_write_every_document(nodes, archive64, t64c,
                                                                      capsys, admin):
    """Into a target that lacks nothing, the 2 restore tasks check their own vbuckets' files
    and records and then write: every document with its metadata, and the result counts
    what a dry run's check counts."""
    rc, out, err = cli(capsys, "restore", archive64, "-c", _addr(t64c), "--json",
                       "--no-progress")
    assert rc == 0, err
    d = json.loads(out)
    assert IN_TASKS in _last_log(archive64)
    assert node_documents(opts_for(t64c)) == node_documents(opts_for(nodes[0]))
    rc, out, err = cli(capsys, "restore", archive64, "-c", _addr(t64c), "--json", "--dry-run")
    assert rc == 0, err
    assert d["checked"] == json.loads(out)["checked"]


def test_a_damaged_file_one_restore_task_finds_stops_every_task_before_it_writes(
        nodes, archive64, tmp_path, t64c, capsys, admin, spark):
    """A changed byte in a data file of vbucket 5 (the second task's): the first task's
    vbuckets are sound, yet neither task writes; the restore fails in verify's line, with
    verify's status."""
    archive, (data,) = _damaged_copy(archive64, tmp_path, 5)
    _refused(capsys, archive, t64c, str(data))
    assert not any(_highs(t64c).values())
    log = _last_log(archive)
    assert IN_TASKS in log and "restored backup" not in log
    # the progress a bar would draw: no record counted as restored, though the tasks ran
    from dcptool.archive.errors import CorruptFileError
    from dcptool.pipeline import progress
    from dcptool.pipeline.restore import run_restore

    reports: list[dict] = []
    with progress.reporting(reports.append), pytest.raises(CorruptFileError):
        run_restore(archive, opts_for(t64c), spark=spark)
    counted = [r for r in reports if r["phase"] == progress.WORK]
    assert counted and counted[-1]["total"] > 0
    assert all(r["done"] == 0 for r in counted), counted


def test_restore_tasks_name_the_problems_as_the_check_before_the_tasks_does(
        nodes, archive64, tmp_path, t64c, capsys, admin, monkeypatch):
    """Damaged files in both tasks' vbuckets: the one line names the first problem verify
    names and counts the others, the same line the check in the driver gives, and nothing
    is written."""
    from dcptool.pipeline import restore

    archive, files = _damaged_copy(archive64, tmp_path, 6, 3)
    rc, out, _err = cli(capsys, "verify", archive, "--json")
    first = json.loads(out)["problems"][0]["path"]
    rc, _out, err = cli(capsys, "restore", archive, "-c", _addr(t64c))
    line = _one_line(err)
    assert rc == 1 and first in line and "more problems)" in line, line
    assert IN_TASKS in _last_log(archive)
    monkeypatch.setattr(restore, "CHECK_IN_TASKS", False)
    rc_d, _out, err_d = cli(capsys, "restore", archive, "-c", _addr(t64c))
    assert (rc_d, _one_line(err_d)) == (rc, line)
    assert not any(_highs(t64c).values())


def test_more_restore_tasks_than_slots_are_checked_before_they_start(nodes, archive64,
                                                                     tmp_path, t64c, capsys,
                                                                     admin):
    """3 tasks on the test session's 2 slots cannot all wait for each other: the chain is
    checked before the tasks start, a damaged file still fails the restore with nothing
    written, and a sound archive is restored whole."""
    archive, (data,) = _damaged_copy(archive64, tmp_path, 5)
    rc, _out, err = cli(capsys, "restore", archive, "-c", _addr(t64c), "--partitions", "3")
    assert rc == 1 and str(data) in _one_line(err)
    log = _last_log(archive)
    # refused by the check before the tasks: no job was started
    assert "in the restore tasks" not in log and "spark local" not in log, log
    assert not any(_highs(t64c).values())
    rc, _out, err = cli(capsys, "restore", archive64, "-c", _addr(t64c), "--partitions", "3",
                        "--no-progress")
    assert rc == 0, err
    assert "spark local[2]: 3 tasks (started" in _last_log(archive64)
    assert node_documents(opts_for(t64c)) == node_documents(opts_for(nodes[0]))


def test_collections_are_created_only_once_the_chain_is_checked(nodes, archive64, tmp_path,
                                                               capsys, admin):
    """A target that lacks s1.c1: a damaged archive fails the restore before anything is
    created or written on it."""
    archive, (data,) = _damaged_copy(archive64, tmp_path, 5)
    with NodeProcess(tmp_path / "t", vbuckets=64) as target:
        _refused(capsys, archive, target, str(data))
        assert _rest(target).manifest().scope("s1") is None
        assert not any(_highs(target).values())
