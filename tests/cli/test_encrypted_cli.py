"""Encrypted archives as a user runs them: `dcptool backup --encrypt`, an incremental, the
readers (info, verify, examine, export), merge, restore into a fresh node, `key`; a wrong
passphrase, a changed passphrase and changed bytes. Each command is a process of its own,
against a real node process; their Spark jobs run on the test run's warm `dcptool engine`
(tests/conftest.py), on local files and on S3 alike: the data keys go with the tasks."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from cliutil import documented_examples
from cliutil import one_error_line as one_line
from cliutil import run_dcptool as run
from docutil import delete, load, node_documents, opts_for
from fileutil import tree_bytes
from noiseutil import assert_no_noise
from nodeprocutil import NodeProcess

VBS = 8
N = 600
PASS = "pass phrase of the encrypted archive"




@pytest.fixture
def env(on_engine):
    # the commands' Spark jobs run on the test run's warm engine (tests/conftest.py): the
    # data keys go with the tasks, whichever Spark runs them
    e = dict(os.environ, DCPTOOL_PASSWORD="password", DCPTOOL_ARCHIVE_PASSPHRASE=PASS)
    for k in ("DCPTOOL_SPARK_MASTER", "DCPTOOL_FAULT", "NO_COLOR",
              "DCPTOOL_ARCHIVE_PASSPHRASE_FILE"):
        e.pop(k, None)
    return e


def docs(n: int, tag: str) -> dict[str, dict]:
    return {f"doc::{i:05d}": {"i": i, "tag": tag, "name": f"secret hotel {i}", "city": "Lyon"}
            for i in range(n)}


def test_encrypted_full_incremental_merge_restore_and_tampering(env, tmp_path):
    archive = str(tmp_path / "secret")
    pfile = tmp_path / "pass.txt"
    pfile.write_text(PASS + "\n")
    with NodeProcess(tmp_path / "src", vbuckets=VBS) as node:
        opts = opts_for(node)
        with opts.connect() as conn:
            load(conn, docs(N, "one"), VBS)
        r = run(env, "backup", "-c", f"{node.host}:{node.port}", archive, "--encrypt", "--json")
        assert r.returncode == 0, r.stderr
        assert_no_noise(r.stdout, r.stderr)
        assert json.loads(r.stdout)["mutations"] == N
        with opts.connect() as conn:
            load(conn, dict(list(docs(N, "two").items())[:100]), VBS)
            delete(conn, [f"doc::{i:05d}" for i in range(200, 220)], VBS)
        # the passphrase from a file this time; no --encrypt needed for an encrypted archive
        penv = {k: v for k, v in env.items() if k != "DCPTOOL_ARCHIVE_PASSPHRASE"}
        r = run(penv, "backup", "-c", f"{node.host}:{node.port}", archive, "--json",
                "--passphrase-file", str(pfile))
        assert r.returncode == 0, r.stderr
        inc = json.loads(r.stdout)
        assert inc["type"] == "incremental" and (inc["mutations"], inc["deletions"]) == (100, 20)
        expected = node_documents(opts)
        # a wrong passphrase: one line, exit 1, before connecting or writing anything
        before = tree_bytes(archive)
        bad = dict(env, DCPTOOL_ARCHIVE_PASSPHRASE="not the passphrase")
        r = run(bad, "backup", "-c", f"{node.host}:{node.port}", archive)
        assert r.returncode == 1 and "wrong passphrase" in one_line(r)
        assert PASS not in r.stderr and "not the passphrase" not in r.stderr
        assert tree_bytes(archive) == before

    # nothing of the documents in the clear, in any file of the archive (the run logs in
    # logs/ hold counts and times, as docs/archive-format.md says)
    for name, data in tree_bytes(archive).items():
        for needle in (b"doc::", b"secret hotel", b"Lyon") + \
                (() if name.startswith("logs/") else (b"mutations",)):
            assert needle not in data, (name, needle)
        assert PASS.encode() not in data, name

    r = run(env, "info", archive, "--json")
    assert r.returncode == 0, r.stderr
    assert [b["type"] for b in json.loads(r.stdout)["backups"]] == ["full", "incremental"]
    r = run(env, "verify", archive)
    assert r.returncode == 0, r.stdout + r.stderr
    r = run(env, "examine", archive, "doc::00201", "--json")
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["versions"]) == 2
    r = run(env, "export", archive, str(tmp_path / "out"), "--format", "jsonl", "--resolved")
    assert r.returncode == 0, r.stderr
    exported = [json.loads(line) for f in (tmp_path / "out").glob("*.jsonl")
                for line in f.read_text().splitlines()]
    assert len([d for d in exported if not d.get("deleted")]) == N - 20
    r = run(env, "merge", archive, "--json")
    assert r.returncode == 0, r.stderr
    r = run(env, "info", archive, "--json")
    assert [b["type"] for b in json.loads(r.stdout)["backups"]] == ["full"]

    # the passphrase changed: a new key, the old one removed; the data untouched
    data_before = {n: d for n, d in tree_bytes(archive).items() if n.startswith("backups/")}
    nenv = dict(env, DCPTOOL_ARCHIVE_NEW_PASSPHRASE="the new one")
    documented = documented_examples(Path(__file__).resolve().parents[2] / "docs"
                                     / "json-output.md")
    r = run(nenv, "key", "add", archive, "--json")
    assert r.returncode == 0, r.stderr
    assert set(json.loads(r.stdout)) == set(documented["dcptool key add"])
    added = json.loads(r.stdout)["added"]["id"]
    r = run(env, "key", "list", archive, "--json")
    assert set(json.loads(r.stdout)) == set(documented["dcptool key list"])
    keys = json.loads(r.stdout)["keys"]
    old = next(k["id"] for k in keys if k["current"])
    assert {k["id"] for k in keys} == {old, added}
    r = run(env, "key", "remove", archive, old, "--json")
    assert r.returncode == 0, r.stderr
    assert set(json.loads(r.stdout)) == set(documented["dcptool key remove"])
    r = run(env, "key", "remove", archive, added)
    assert r.returncode == 1 and "wrong passphrase" in one_line(r)
    env = dict(env, DCPTOOL_ARCHIVE_PASSPHRASE="the new one")
    r = run(env, "key", "remove", archive, added)
    assert r.returncode == 1 and "last key" in one_line(r)
    assert {n: d for n, d in tree_bytes(archive).items() if n.startswith("backups/")} == data_before

    with NodeProcess(tmp_path / "dst", vbuckets=VBS) as dst:
        r = run(bad, "restore", archive, "-c", f"{dst.host}:{dst.port}")
        assert r.returncode == 1 and "wrong passphrase" in one_line(r)
        assert node_documents(opts_for(dst)) == {}
        r = run(env, "restore", archive, "-c", f"{dst.host}:{dst.port}", "--json")
        assert r.returncode == 0, r.stderr
        assert_no_noise(r.stdout, r.stderr)
        assert node_documents(opts_for(dst)) == expected

    # one changed byte in a data file: verify names the file, restore writes nothing
    [bid] = os.listdir(os.path.join(archive, "backups"))
    victim = os.path.join(archive, "backups", bid, "vb-0003-000.mpk.zst")
    with open(victim, "r+b") as f:
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 0x40]))
    r = run(env, "verify", archive, "--json")
    assert r.returncode == 1
    problems = json.loads(r.stdout)["problems"]
    assert problems and {p["path"] for p in problems} == {victim}
    assert all("tampered" in p["message"] for p in problems)
    with NodeProcess(tmp_path / "dst2", vbuckets=VBS) as dst:
        r = run(env, "restore", archive, "-c", f"{dst.host}:{dst.port}")
        assert r.returncode == 1
        line = one_line(r)
        assert victim in line and "tampered" in line
        assert node_documents(opts_for(dst)) == {}


def test_encrypted_archive_on_s3_backup_incremental_restore(s3, warm_engine, tmp_path):
    server, bucket = s3
    env = server.env(DCPTOOL_PASSWORD="password", DCPTOOL_ARCHIVE_PASSPHRASE=PASS,
                     DCPTOOL_ENGINE_DIR=warm_engine)
    for k in ("DCPTOOL_SPARK_MASTER", "DCPTOOL_FAULT", "NO_COLOR",
              "DCPTOOL_ARCHIVE_PASSPHRASE_FILE"):
        env.pop(k, None)
    url = f"s3://{bucket}/secret"
    with NodeProcess(tmp_path / "src", vbuckets=VBS) as node:
        opts = opts_for(node)
        with opts.connect() as conn:
            load(conn, docs(N, "one"), VBS)
        r = run(env, "backup", "-c", f"{node.host}:{node.port}", url, "--encrypt", "--json")
        assert r.returncode == 0, r.stderr
        with opts.connect() as conn:
            load(conn, dict(list(docs(N, "two").items())[:50]), VBS)
            delete(conn, [f"doc::{i:05d}" for i in range(10, 15)], VBS)
        r = run(env, "backup", "-c", f"{node.host}:{node.port}", url, "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["type"] == "incremental"
        expected = node_documents(opts)
    client = server.client()
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix="secret/")["Contents"]]
    assert any(k.startswith("secret/keys/") for k in keys)
    for k in keys:
        body = client.get_object(Bucket=bucket, Key=k)["Body"].read()
        assert b"doc::" not in body and b"secret hotel" not in body, k
    r = run(env, "verify", url)
    assert r.returncode == 0, r.stdout + r.stderr
    with NodeProcess(tmp_path / "dst", vbuckets=VBS) as dst:
        bad = dict(env, DCPTOOL_ARCHIVE_PASSPHRASE="wrong")
        r = run(bad, "restore", url, "-c", f"{dst.host}:{dst.port}")
        assert r.returncode == 1 and "wrong passphrase" in one_line(r)
        assert node_documents(opts_for(dst)) == {}
        r = run(env, "restore", url, "-c", f"{dst.host}:{dst.port}", "--json")
        assert r.returncode == 0, r.stderr
        assert node_documents(opts_for(dst)) == expected


def test_prune_and_remove_of_an_encrypted_archive(env, tmp_path):
    """The retention commands run their merges in Spark tasks: the data key goes with them."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "archive"))
    from test_archive_retention import make_chain, times40

    from dcptool.archive import Archive, crypto
    from dcptool.archive.verify import verify_archive

    root = tmp_path / "enc"
    _archive, ids, _model = make_chain(root, times40()[:8], fulls={0, 5}, passphrase=PASS)
    r = run(dict(env, DCPTOOL_ARCHIVE_PASSPHRASE="nope"), "prune", str(root),
            "--keep-last", "2")
    assert r.returncode == 1 and "wrong passphrase" in one_line(r)
    r = run(env, "remove", str(root), "--backup", ids[3], "--json")
    assert r.returncode == 0, r.stderr
    r = run(env, "prune", str(root), "--keep-last", "2", "--json")
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["kept"]) == 2
    os.environ[crypto.PASSPHRASE_ENV] = PASS
    try:
        assert verify_archive(root).ok
        assert len(Archive.open(root).committed_ids()) == 2
    finally:
        del os.environ[crypto.PASSPHRASE_ENV]
