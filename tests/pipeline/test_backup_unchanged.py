"""An incremental backup keeps no file for a vbucket with nothing new since the backup
before it (the manifest lists it as unchanged), locally and on S3; every reader sees the
chain through such a backup as before: info, verify, restore, examine, export, the Spark
data source, merge, remove, and the next incremental backup's plan."""
from __future__ import annotations

import json
import shutil

import pytest
from cliutil import cli, run_dcptool
from docutil import load, node_documents, opts_for
from nodeprocutil import NodeProcess

from dcptool.archive import Archive
from dcptool.archive.verify import verify_archive
from dcptool.pipeline.backup import run_backup
from dcptool.pipeline.dataframes import read_archive
from dcptool.pipeline.merge import run_merge
from dcptool.pipeline.restore import run_restore
from dcptool.protocol import vbucket_of

VBS = 16


def _key_in(vb: int, avoid: int | None = None) -> str:
    return next(k for k in (f"solo::{i}" for i in range(10_000))
                if vbucket_of(k.encode(), VBS) == vb)


def _state(archive: Archive, bid: str) -> dict[bytes, bytes]:
    out = {}
    for vb in range(VBS):
        for k, r in archive.resolve_vbucket(vb, backup=bid).items():
            if r[0] == 3:
                out[bytes(k)[1:]] = bytes(r[8])  # doc key: the default collection
    return out


@pytest.fixture(scope="module")
def chain(tmp_path_factory, spark):
    """full F; I1 changes vbucket 3; I2 changes nothing; I3 changes vbucket 9."""
    base = tmp_path_factory.mktemp("unchanged")
    node = NodeProcess(base / "node", vbuckets=VBS).start()
    opts = opts_for(node)
    with opts.connect() as conn:
        load(conn, {f"doc::{i:03d}": {"i": i} for i in range(40)}, VBS)
    archive = base / "arch"
    res = [run_backup(opts, archive, spark=spark, watermark=False)]
    states = [node_documents(opts)]
    for change in ({_key_in(3): {"v": "x"}}, {}, {_key_in(9): {"v": "y"}}):
        if change:
            with opts.connect() as conn:
                load(conn, change, VBS)
        res.append(run_backup(opts, archive, spark=spark, watermark=False))
        states.append(node_documents(opts))
    yield node, Archive.open(archive), [r.backup_id for r in res], res, states
    node.stop()


def test_unchanged_vbuckets_cost_no_files(chain):
    _node, archive, ids, res, _states = chain
    full, i1, i2, i3 = res
    assert full.unchanged_vbuckets == 0 and full.vbuckets == VBS
    assert (i1.unchanged_vbuckets, i2.unchanged_vbuckets, i3.unchanged_vbuckets) == (15, 16, 15)
    assert all(r.vbuckets == VBS and r.rollbacks == 0 for r in res)
    # the no-change backup is its intent and its manifest, nothing else
    assert sorted(p.name for p in archive.backup_dir(ids[2]).iterdir()) == \
        ["backup.json", "manifest.json"]
    m2 = archive.manifest(ids[2])
    assert m2["vbuckets"] == [] and m2["unchanged"] == [[0, VBS - 1]]
    m3 = archive.manifest(ids[3])
    assert [e["vbucket"] for e in m3["vbuckets"]] == [9]
    assert m3["unchanged"] == [[0, 8], [10, VBS - 1]]
    assert {p.name for p in archive.backup_dir(ids[3]).iterdir()} == {
        "backup.json", "manifest.json", "vb-0009-000.mpk.zst", "vb-0009.done.json"}


def test_readers_see_the_chain_through_unchanged_vbuckets(chain, spark, capsys, tmp_path,
                                                        node_factory):
    node, archive, ids, _res, states = chain
    assert verify_archive(archive.path).ok
    rc, out, _ = cli(capsys, "info", archive.path, "--json")
    assert rc == 0
    rows = json.loads(out)["backups"]
    assert [(b["vbuckets"], b["unchanged_vbuckets"]) for b in rows] == \
        [(VBS, 0), (VBS, 15), (VBS, 16), (VBS, 15)]
    # every backup's state is the node's at that time
    live = [{k: v[1] for k, v in s.items() if v[0] == "live"} for s in states]
    for bid, want in zip(ids, live):
        assert _state(archive, bid) == want
    # restore as of the no-change backup: the state the node had then
    dst = node_factory("dst", vbuckets=VBS)
    run_restore(str(archive.path), opts_for(dst), backup=ids[2], spark=spark)
    assert {k: v[1] for k, v in node_documents(opts_for(dst)).items() if v[0] == "live"} == live[2]
    # examine: vbucket 3's key as of the no-change backup comes from I1
    key3 = _key_in(3)
    rc, out, err = cli(capsys, "examine", archive.path, key3, "--backup", ids[2], "--json")
    assert rc == 0, err
    assert ids[1] in out
    # the Spark data source and export, resolved as of the no-change backup
    df = read_archive(spark, str(archive.path), backup=ids[2], resolved=True)
    assert df.filter("not deleted").count() == len(live[2])
    rc, out, err = cli(capsys, "export", archive.path, tmp_path / "out", "--format", "jsonl",
                       "--backup", ids[2], "--resolved", "--json")
    assert rc == 0, err
    rows = [json.loads(ln) for p in sorted((tmp_path / "out").glob("part-*"))
            for ln in p.read_text().splitlines() if ln.strip()]
    assert len(rows) == len(live[2])


def test_merge_and_remove_through_unchanged_vbuckets(chain, spark, tmp_path, capsys):
    _node, archive, ids, _res, states = chain
    live = [{k: v[1] for k, v in s.items() if v[0] == "live"} for s in states]
    # remove I1: it merges forward into I2, which holds no file of vbucket 3
    copy = tmp_path / "copy"
    shutil.copytree(archive.path, copy)
    rc, out, err = cli(capsys, "remove", copy, "--backup", ids[1], "--json")
    assert rc == 0, err
    a = Archive.open(copy)
    assert verify_archive(copy).ok
    assert _state(a, a.committed_ids()[1]) == live[2]
    assert _state(a, a.latest_id()) == live[3]
    # merge I1..I3: the merged backup holds what the three held
    copy2 = tmp_path / "copy2"
    shutil.copytree(archive.path, copy2)
    run_merge(copy2, first=ids[1], last=ids[3], spark=spark)
    b = Archive.open(copy2)
    assert verify_archive(copy2).ok and len(b.committed_ids()) == 2
    assert _state(b, b.latest_id()) == live[3]


def test_no_change_incremental_on_s3_is_two_objects(s3, tmp_path):
    server, bucket = s3
    env = server.env(DCPTOOL_PASSWORD="password")
    for k in ("DCPTOOL_SPARK_MASTER", "DCPTOOL_FAULT"):
        env.pop(k, None)
    url = f"s3://{bucket}/nochange"
    with NodeProcess(tmp_path / "src", vbuckets=VBS) as node:
        with opts_for(node).connect() as conn:
            load(conn, {f"doc::{i:03d}": {"i": i} for i in range(40)}, VBS)
        ids = []
        for _ in range(2):
            r = run_dcptool(env, "backup", "-c", f"{node.host}:{node.port}", url, "--json",
                            "--no-watermark")
            assert r.returncode == 0, r.stderr
            ids.append(json.loads(r.stdout))
    assert ids[1]["type"] == "incremental" and ids[1]["unchanged_vbuckets"] == VBS
    keys = [o["Key"] for o in server.client().list_objects_v2(
        Bucket=bucket, Prefix=f"nochange/backups/{ids[1]['backup_id']}/")["Contents"]]
    assert sorted(k.rsplit("/", 1)[1] for k in keys) == ["backup.json", "manifest.json"]
    r = run_dcptool(env, "verify", url)
    assert r.returncode == 0, r.stdout + r.stderr
