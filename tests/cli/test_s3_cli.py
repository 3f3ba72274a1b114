"""Backups to S3 as a user runs them: `dcptool backup|info|verify|restore s3://BUCKET/PREFIX`
as processes, against a real node process and a real S3 server process (SeaweedFS).

Each command runs as its own process, with the S3 server's endpoint and credentials in its
environment as a user would set them (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY). A first backup, a killed one and racing ones start their own Spark;
the commands after them run their Spark jobs on the test run's warm `dcptool engine`, whose
executors have the same server's credentials (tests/conftest.py)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from cliutil import one_error_line as one_line
from cliutil import run_dcptool as run
from docutil import delete, load, node_documents, opts_for, wait_persisted
from noiseutil import assert_no_noise
from nodeprocutil import NodeProcess

VBS = 8
N = 1200


def start(env: dict[str, str], *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "dcptool", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, start_new_session=True)




@pytest.fixture
def env(s3):
    server, bucket = s3
    e = server.env(DCPTOOL_PASSWORD="password")
    for k in ("DCPTOOL_SPARK_MASTER", "DCPTOOL_FAULT", "NO_COLOR"):
        e.pop(k, None)
    return e


@pytest.fixture
def engine_env(env, warm_engine):
    """`env`, with the commands' Spark jobs on the warm engine."""
    return dict(env, DCPTOOL_ENGINE_DIR=warm_engine)


def docs(n: int, tag: str) -> dict[str, dict]:
    return {f"doc::{i:05d}": {"i": i, "tag": tag, "name": f"hotel {i}", "city": "Lyon"}
            for i in range(n)}


def test_full_incremental_verify_restore_on_s3(s3, env, engine_env, tmp_path):
    server, bucket = s3
    url = f"s3://{bucket}/backups/travel"
    with NodeProcess(tmp_path / "src", vbuckets=VBS) as node:
        opts = opts_for(node)
        with opts.connect() as conn:
            load(conn, docs(N, "one"), VBS)
        r = run(env, "backup", "-c", f"{node.host}:{node.port}", url, "--json")
        assert r.returncode == 0, r.stderr
        assert_no_noise(r.stdout, r.stderr)
        full = json.loads(r.stdout)
        assert full["type"] == "full" and full["mutations"] == N
        with opts.connect() as conn:
            load(conn, {k: v for k, v in list(docs(N, "two").items())[:100]}, VBS)
            delete(conn, [f"doc::{i:05d}" for i in range(200, 220)], VBS)
        r = run(engine_env, "backup", "-c", f"{node.host}:{node.port}", url, "--json")
        assert r.returncode == 0, r.stderr
        inc = json.loads(r.stdout)
        assert inc["type"] == "incremental"
        assert (inc["mutations"], inc["deletions"]) == (100, 20)
        expected = node_documents(opts)

    # the objects: archive.json, two committed backups, no lock left, nothing local
    keys = [o["Key"] for o in server.client().list_objects_v2(
        Bucket=bucket, Prefix="backups/travel/")["Contents"]]
    assert "backups/travel/archive.json" in keys
    assert sum(k.endswith("/manifest.json") for k in keys) == 2
    assert "backups/travel/lock" not in keys
    assert not (tmp_path / "s3:").exists()
    # packed (docs/archive-format.md, "Packs"): the vbuckets' small segments share pack
    # objects and their summaries share done batches, a few of each per backup task
    full_keys = [k for k in keys if f"/{full['backup_id']}/" in k]
    names = sorted(k.rsplit("/", 1)[1] for k in full_keys)
    packs = [n for n in names if n.startswith("pack-") and n.endswith(".mpk.zst")]
    batches = [n for n in names if n.startswith("done-") and n.endswith(".json")]
    assert packs and batches and not [n for n in names if n.startswith("vb-")], names
    assert len(names) == len(packs) + len(batches) + 2  # backup.json, manifest.json

    r = run(engine_env, "info", url, "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert [b["type"] for b in info["backups"]] == ["full", "incremental"]
    r = run(engine_env, "verify", url)
    assert r.returncode == 0, r.stdout + r.stderr

    with NodeProcess(tmp_path / "dst", vbuckets=VBS) as dst:
        r = run(engine_env, "restore", url, "-c", f"{dst.host}:{dst.port}", "--json")
        assert r.returncode == 0, r.stderr
        assert_no_noise(r.stdout, r.stderr)
        assert node_documents(opts_for(dst)) == expected

    # the other readers and writers of an archive, on the same objects
    r = run(engine_env, "examine", url, "doc::00201", "--json")
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["versions"]) == 2  # written, then deleted
    r = run(engine_env, "export", url, str(tmp_path / "out"), "--format", "jsonl", "--resolved")
    assert r.returncode == 0, r.stderr
    exported = [json.loads(line) for f in (tmp_path / "out").glob("*.jsonl")
                for line in f.read_text().splitlines()]
    assert len([d for d in exported if not d.get("deleted")]) == N - 20
    r = run(engine_env, "merge", url, "--json")
    assert r.returncode == 0, r.stderr
    r = run(engine_env, "info", url, "--json")
    assert [b["type"] for b in json.loads(r.stdout)["backups"]] == ["full"]
    assert not [o["Key"] for o in server.client().list_objects_v2(
        Bucket=bucket, Prefix="backups/travel/.merge-staging/").get("Contents", [])]
    assert run(engine_env, "verify", url).returncode == 0
    with NodeProcess(tmp_path / "dst2", vbuckets=VBS) as dst:
        r = run(engine_env, "restore", url, "-c", f"{dst.host}:{dst.port}", "--json")
        assert r.returncode == 0, r.stderr
        assert node_documents(opts_for(dst)) == expected


def test_executors_that_cannot_reach_the_archive_are_told_in_one_line(spark, s3):
    """This test process's Spark started before the S3 credentials were in its environment:
    its executors have none, as on a cluster whose machines were not given any."""
    from dcptool.archive import Archive
    from dcptool.errors import DcptoolError
    from dcptool.pipeline.runtime import check_executors_see

    _server, bucket = s3
    Archive.create(f"s3://{bucket}/p", bucket="default", vbuckets=2)
    with pytest.raises(DcptoolError) as exc:
        check_executors_see(spark, f"s3://{bucket}/p", name="archive.json", always=True)
    msg = exc.value.message
    assert msg.startswith(f"the Spark executors cannot reach s3://{bucket}/p ("), msg
    assert "credentials" in msg and "\n" not in msg


def test_backup_killed_mid_upload_resumes_with_nothing_lost(s3, env, engine_env, tmp_path):
    server, bucket = s3
    url = f"s3://{bucket}/k"
    with NodeProcess(tmp_path / "src", vbuckets=VBS) as node:
        opts = opts_for(node)
        with opts.connect() as conn:
            load(conn, docs(N, "one"), VBS)
        wait_persisted(opts)
        proc = start(dict(env, DCPTOOL_FAULT="kill-mid-file:3"), "backup", "-c",
                     f"{node.host}:{node.port}", url, "--no-progress", "--no-watermark",
                     "--partitions", "2", "--master", "local[2]")
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == -9, err[-2000:]
        r = run(engine_env, "info", url, "--json")
        info = json.loads(r.stdout)
        assert [b["state"] for b in info["backups"]] == ["partial"], info
        r = run(engine_env, "backup", "-c", f"{node.host}:{node.port}", url, "--json",
                "--no-watermark")
        assert r.returncode == 0, r.stderr
        res = json.loads(r.stdout)
        assert res["resumed"] is True
        r = run(engine_env, "verify", url)
        assert r.returncode == 0, r.stdout + r.stderr
        # no upload left open by the killed run
        assert server.client().list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
        expected = node_documents(opts)
    with NodeProcess(tmp_path / "dst", vbuckets=VBS) as dst:
        r = run(engine_env, "restore", url, "-c", f"{dst.host}:{dst.port}", "--json")
        assert r.returncode == 0, r.stderr
        assert node_documents(opts_for(dst)) == expected


def test_two_backups_race_for_the_lock(s3, env, tmp_path):
    _server, bucket = s3
    url = f"s3://{bucket}/race"
    with NodeProcess(tmp_path / "src", vbuckets=VBS) as node:
        with opts_for(node).connect() as conn:
            load(conn, docs(200, "one"), VBS)
        # both start at once; the winner stalls holding the lock, so the loser meets it
        stall = dict(env, DCPTOOL_FAULT="stall-after-vbuckets:1")
        args = ("backup", "-c", f"{node.host}:{node.port}", url, "--no-progress",
                "--no-watermark")
        procs = [start(stall, *args), start(stall, *args)]
        try:
            deadline = time.monotonic() + 120
            while all(p.poll() is None for p in procs) and time.monotonic() < deadline:
                time.sleep(0.2)
            done = [p for p in procs if p.poll() is not None]
            assert len(done) == 1, "one backup should have been refused the lock"
            loser = done[0]
            out, err = loser.communicate()
            assert loser.returncode == 3, err
            lines = [ln for ln in err.splitlines() if ln.strip()]
            assert len(lines) == 1 and "locked by" in lines[0], err
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.communicate()


def test_wrong_credentials_and_missing_bucket_are_one_line(s3, env, tmp_path):
    _server, bucket = s3
    with NodeProcess(tmp_path / "src", vbuckets=VBS) as node:
        with opts_for(node).connect() as conn:
            load(conn, docs(50, "one"), VBS)
        r = run(dict(env, AWS_SECRET_ACCESS_KEY="not-the-secret"), "backup", "-c",
                f"{node.host}:{node.port}", f"s3://{bucket}/a", "--no-progress")
        assert r.returncode == 1
        line = one_line(r)
        assert "access denied" in line and "not-the-secret" not in r.stderr
        r = run(env, "backup", "-c", f"{node.host}:{node.port}", "s3://no-such-bucket-x/a",
                "--no-progress")
        assert r.returncode == 1
        assert "does not exist" in one_line(r)
        r = run(env, "restore", "s3://no-such-bucket-x/a", "-c", f"{node.host}:{node.port}")
        assert r.returncode != 0
        assert "does not exist" in one_line(r)
