"""`dcptool backup --all-buckets`: every bucket of a node into a cluster archive, with the
buckets' settings, scopes and collections, users and groups (docs/archive-format.md,
"Cluster archives"). Real node processes, real commands; Spark jobs on the run's warm
engine (`on_engine`)."""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from cliutil import documented_under, run_as_cluster_user
from nodeprocutil import NodeProcess

from dcptool.archive import Archive
from dcptool.archive.cluster import ClusterArchive

PASSWORD = "password"


def documented_run(title: str = "### dcptool backup --all-buckets") -> dict:
    """docs/json-output.md's example under `title` (`dcptool backup --all-buckets --json`)."""
    return documented_under(title)


def run(*args: str, **kw) -> subprocess.CompletedProcess:
    return run_as_cluster_user(*args, password=PASSWORD, **kw)


def add_user(node, user: str, roles: str, password: str, tmp_path: Path) -> None:
    """`dcptool node user add` on the running node's directory, then wait until the node
    has read its users file again (it looks every quarter second): the user logs in."""
    from dcptool.client.errors import ClientError
    from dcptool.client.options import ConnOptions

    pw = tmp_path / f"{user}-{node.port}.pw"
    pw.write_text(password + "\n")
    run("node", "user", "add", user, "--role", roles, "--data", str(node.data_dir),
        "--password-file", str(pw))
    deadline = time.monotonic() + 15
    while True:
        try:
            with ConnOptions(node.host, node.port, user, password).connect(bucket=None):
                return
        except ClientError:
            assert time.monotonic() < deadline, f"{user} never logged in"
            time.sleep(0.1)


@pytest.fixture
def node(tmp_path, on_engine):
    """A node of three buckets with different settings, data in several collections, and
    two users with roles in one bucket each."""
    with NodeProcess(tmp_path / "node", vbuckets=8) as n:
        c = f"{n.host}:{n.port}"
        run("bucket", "create", "travel", "-c", c, "--eviction-policy", "fullEviction")
        run("bucket", "create", "ttl", "-c", c, "--max-ttl", "3600")
        run("bucket", "create", "big", "-c", c, "--num-vbuckets", "64")
        run("collection", "create", "inventory", "-c", c, "-b", "travel")
        run("collection", "create", "inventory.hotels", "-c", c, "-b", "travel")
        run("doc", "load", "--count", "40", "-c", c, "-b", "travel", "-q")
        run("doc", "load", "--count", "25", "-c", c, "-b", "travel", "-q",
            "--collection", "inventory.hotels")
        run("doc", "load", "--count", "30", "-c", c, "-b", "ttl", "-q")
        run("doc", "load", "--count", "50", "-c", c, "-b", "big", "-q")
        run("doc", "load", "--count", "10", "-c", c, "-q")  # the node's first bucket, default
        n.cluster = c
        yield n


def test_all_buckets_full_incremental_recreated_and_dropped(node, tmp_path):
    c = node.cluster
    for user, role in (("ann", "data_backup[travel]"), ("bob", "data_reader[big]")):
        add_user(node, user, role, f"{user}-pw", tmp_path)
    archive = tmp_path / "cluster"
    # without -b a new archive is a cluster archive of every bucket
    r = run("backup", "-c", c, str(archive), "--json", "--no-watermark")
    first = json.loads(r.stdout)
    assert sorted(first["buckets"]) == ["big", "default", "travel", "ttl"]
    assert {b["status"] for b in first["buckets"].values()} == {"full"}
    items = {n: b["backup"]["mutations"] for n, b in first["buckets"].items()}
    assert items == {"big": 50, "default": 10, "travel": 65, "ttl": 30}
    assert first["totals"]["mutations"] == 155
    assert first["dropped"] == [] and first["users"] >= 2
    assert set(first) == set(documented_run()), "docs/json-output.md"

    cluster = ClusterArchive.open(archive)
    assert cluster.bucket_names() == ["big", "default", "travel", "ttl"]
    rec = cluster.run()
    assert rec["id"] == first["run_id"]
    assert rec["buckets"]["travel"]["settings"]["evictionPolicy"] == "fullEviction"
    assert rec["buckets"]["ttl"]["settings"]["maxTTL"] == 3600
    assert rec["buckets"]["big"]["settings"]["numVBuckets"] == 64
    scopes = {s["name"]: [c["name"] for c in s["collections"]]
              for s in rec["buckets"]["travel"]["scopes"]["scopes"]}
    assert scopes["inventory"] == ["hotels"]
    users = {u["id"]: u for u in rec["users"]}
    assert {"ann", "bob"} <= set(users)
    # password hashes as the node exports them for backup, never a password
    text = json.dumps(rec)
    assert "ann-pw" not in text and "bob-pw" not in text
    # each bucket archive is a whole archive, readable alone
    big = Archive.open(cluster.bucket_path("big"))
    assert big.bucket == "big" and big.meta["vbuckets"] == 64

    # an incremental run: one bucket changed, one dropped and created again, one dropped
    run("doc", "load", "--count", "5", "--prefix", "more::", "-c", c, "-b", "travel", "-q")
    run("bucket", "drop", "ttl", "-c", c)
    run("bucket", "create", "ttl", "-c", c)
    run("doc", "load", "--count", "3", "-c", c, "-b", "ttl", "-q")
    run("bucket", "drop", "big", "-c", c)
    r = run("backup", "-c", c, str(archive), "--json", "--no-watermark")  # a cluster archive
    second = json.loads(r.stdout)
    assert second["run_id"] > first["run_id"]
    assert second["buckets"]["travel"]["status"] == "incremental"
    assert second["buckets"]["travel"]["backup"]["mutations"] == 5
    assert second["buckets"]["default"]["status"] == "incremental"
    assert second["buckets"]["ttl"]["status"] == "recreated"
    assert second["buckets"]["ttl"]["backup"]["type"] == "full"
    assert second["buckets"]["ttl"]["backup"]["mutations"] == 3
    assert second["dropped"] == ["big"]
    assert "big" in r.stderr and "kept" in r.stderr
    cluster = ClusterArchive.open(archive)
    assert cluster.run_ids() == [first["run_id"], second["run_id"]]
    assert cluster.run()["buckets"]["big"] == {"status": "dropped"}
    # the first run still names the backups it made
    assert cluster.run(first["run_id"])["buckets"]["big"]["backup"] == \
        first["buckets"]["big"]["backup"]["backup_id"]


def test_selection_encryption_and_errors(node, tmp_path):
    c = node.cluster
    archive = tmp_path / "sel"
    env = {**os.environ, "DCPTOOL_ARCHIVE_PASSPHRASE": "cluster secret"}
    r = run("backup", "-c", c, str(archive), "--all-buckets", "--encrypt", "--json",
            "--no-watermark", "--include-data", "travel.inventory", "--exclude-data", "big",
            "--disable-users", env=env)
    d = json.loads(r.stdout)
    assert sorted(d["buckets"]) == ["travel"]
    assert d["buckets"]["travel"]["backup"]["mutations"] == 25
    assert d["users"] is None
    cluster = ClusterArchive.open(archive, passphrase="cluster secret")
    assert cluster.encrypted and "users" not in cluster.run()
    assert Archive.open(cluster.bucket_path("travel"), passphrase="cluster secret").encrypted
    # errors: one line each, nothing left behind
    r = run("backup", "-c", c, str(archive), "--json", env={**os.environ,
            "DCPTOOL_ARCHIVE_PASSPHRASE": "wrong"}, ok=False)
    assert r.returncode != 0 and r.stderr.count("\n") == 1 and "wrong passphrase" in r.stderr
    r = run("backup", "-c", c, "-b", "travel", str(tmp_path / "one"), "--disable-users",
            ok=False)
    assert r.returncode == 2 and "cluster archives" in r.stderr
    r = run("backup", "-c", c, str(tmp_path / "none"), "--all-buckets", "-b", "nosuch",
            ok=False)
    assert r.returncode == 2 and "no bucket nosuch" in r.stderr
    # commands that work on one bucket's archive name the bucket archives to give instead
    # (info, verify, examine and export read cluster archives: test_cluster_read_cli.py)
    for args in (["key", "list", str(archive)],):
        r = run(*args, ok=False, env=env)
        assert r.returncode == 2, (args, r.stderr)
        assert r.stderr.count("\n") == 1 and "is a cluster archive" in r.stderr
        assert str(archive / "buckets") in r.stderr
    # a bucket the user may see but not back up is left out, before any data moves, or
    # refused when named
    add_user(node, "carl", "data_backup[ttl],data_reader[big]", PASSWORD, tmp_path)
    r = run("backup", "-c", c, "-u", "carl", str(tmp_path / "carl"), "--all-buckets",
            "--json", "--disable-users")
    d = json.loads(r.stdout)
    assert sorted(d["buckets"]) == ["ttl"] and d["left_out"] == ["big"]
    assert "bucket big left out" in r.stderr and "DcpProducer" in r.stderr
    assert ClusterArchive.open(tmp_path / "carl").bucket_names() == ["ttl"]
    r = run("backup", "-c", c, "-u", "carl", str(tmp_path / "carl2"), "--all-buckets",
            "-b", "big", "--disable-users", ok=False)
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "DcpProducer" in r.stderr
    assert not (tmp_path / "carl2" / "buckets" / "big").exists()
    # a bucket archive is not a cluster archive
    run("backup", "-c", c, "-b", "travel", str(tmp_path / "bucket"), "--no-watermark")
    # without -b an archive of one bucket goes on with its bucket
    r = run("backup", "-c", c, str(tmp_path / "bucket"), "--no-watermark", "--json")
    d = json.loads(r.stdout)
    assert d["type"] == "incremental" and d["watermark"] is None
    assert Archive.open(tmp_path / "bucket").bucket == "travel"
    r = run("backup", "-c", c, str(tmp_path / "bucket"), "--all-buckets", ok=False)
    assert r.returncode == 2 and "archive of one bucket" in r.stderr


def test_restore_builds_the_cluster_again(node, tmp_path):
    """A run restored into a node that has only its first bucket: --dry-run reports what
    it would build and builds nothing; then --auto-create-buckets --enable-users gives the
    same buckets with their settings, collections, documents with their metadata, and
    users who log in with their passwords."""
    from docutil import node_documents, opts_for

    from dcptool.client.options import ConnOptions

    c = node.cluster
    add_user(node, "ann", "data_reader[travel]", "ann-pw", tmp_path)
    archive = tmp_path / "cluster"
    run("backup", "-c", c, str(archive), "--all-buckets", "--no-watermark", "-q")
    source = {b: node_documents(opts_for(node, b)) for b in ("default", "travel", "ttl", "big")}
    with NodeProcess(tmp_path / "target", vbuckets=8) as target:
        t = f"{target.host}:{target.port}"
        r = run("restore", str(archive), "-c", t, "--dry-run", "--auto-create-buckets",
                "--enable-users", "--json")
        plan = json.loads(r.stdout)
        assert plan["dry_run"] and sorted(plan["created_buckets"]) == ["big", "travel", "ttl"]
        assert set(plan) == set(documented_run("### dcptool restore of a cluster archive"))
        assert "ann" in plan["users"]["users"]
        listed = json.loads(run("bucket", "list", "-c", t, "--json").stdout)
        assert [b["name"] for b in listed] == ["default"]  # nothing built
        # without --auto-create-buckets: one line, nothing written
        r = run("restore", str(archive), "-c", t, ok=False)
        assert r.returncode == 2 and "--auto-create-buckets" in r.stderr
        assert r.stderr.strip().count("\n") == 0
        r = run("restore", str(archive), "-c", t, "--auto-create-buckets", "--enable-users",
                "--json")
        done = json.loads(r.stdout)
        assert sorted(done["buckets"]) == ["big", "default", "travel", "ttl"]
        assert done["buckets"]["travel"]["restore"]["restored"]["mutation"] == 65
        got = {b["name"]: b for b in json.loads(run("bucket", "list", "-c", t,
                                                      "--json").stdout)}
        assert sorted(got) == ["big", "default", "travel", "ttl"]
        assert got["travel"]["evictionPolicy"] == "fullEviction"
        assert got["ttl"]["maxTTL"] == 3600
        assert got["big"]["numVBuckets"] == 64
        for b, docs in source.items():
            assert node_documents(opts_for(target, b)) == docs, b
        hotel = run("doc", "get", "doc::3", "-c", t, "-b", "travel", "--collection",
                    "inventory.hotels", "--json")
        assert json.loads(hotel.stdout)["key"] == "doc::3"
        # the user logs in on the target with the password it had
        ann = ConnOptions(target.host, target.port, "ann", "ann-pw", bucket="travel")
        with ann.connect():
            pass
        # again: the buckets are there now, the user kept
        r = run("restore", str(archive), "-c", t, "--enable-users", "--json")
        again = json.loads(r.stdout)
        assert again["created_buckets"] == [] and "ann" in again["users"]["kept_users"]


def test_restore_selects_renames_configures_and_overwrites_users(node, tmp_path):
    """--include-data by bucket, --map-data OLD=NEW for a bucket, --bucket-ram-quota for
    the buckets it creates, --enable-bucket-config for one that exists, --force-users for
    a user the target has already."""
    from dcptool.client.errors import ClientError
    from dcptool.client.options import ConnOptions

    c = node.cluster
    add_user(node, "ann", "data_reader[travel2]", "ann-pw", tmp_path)
    archive = tmp_path / "cluster"
    run("backup", "-c", c, str(archive), "--all-buckets", "--no-watermark", "-q")
    with NodeProcess(tmp_path / "target", vbuckets=8) as target:
        t = f"{target.host}:{target.port}"
        run("bucket", "create", "ttl", "-c", t)  # exists, without the recorded max TTL
        add_user(target, "ann", "reader", "old-pw", tmp_path)
        r = run("restore", str(archive), "-c", t, "--include-data", "travel,ttl",
                "--map-data", "travel=travel2", "--auto-create-buckets", "--bucket-ram-quota",
                "128", "--enable-bucket-config", "--enable-users", "--force-users", "--json")
        d = json.loads(r.stdout)
        assert sorted(d["buckets"]) == ["travel", "ttl"]
        assert d["buckets"]["travel"]["target"] == "travel2"
        assert d["buckets"]["travel"]["restore"]["restored"]["mutation"] == 65
        assert d["created_buckets"] == ["travel2"]
        assert d["configured_buckets"] == {"ttl": {"maxTTL": 3600}}
        assert "ann" in d["users"]["users"] and d["users"]["kept_users"] == []
        got = {b["name"]: b for b in json.loads(run("bucket", "list", "-c", t,
                                                      "--json").stdout)}
        assert sorted(got) == ["default", "travel2", "ttl"]
        assert got["travel2"]["ramQuotaMB"] == 128
        assert got["travel2"]["evictionPolicy"] == "fullEviction"
        assert got["ttl"]["maxTTL"] == 3600
        # the user is the run's now: its password and its role in travel2
        with ConnOptions(target.host, target.port, "ann", "ann-pw", bucket="travel2").connect():
            pass
        with pytest.raises(ClientError):
            ConnOptions(target.host, target.port, "ann", "old-pw", bucket="travel2").connect()
        r = run("restore", str(archive), "-c", t, "--map-data", "travel=a.b", ok=False)
        assert r.returncode == 2 and "maps to a bucket name" in r.stderr
        r = run("restore", str(archive), "-c", t, "--include-data", "nosuch", ok=False)
        assert r.returncode == 2 and "holds no bucket nosuch" in r.stderr
        r = run("restore", str(archive), "-c", t, "--backup", "x", ok=False)
        assert r.returncode == 2 and "--backup is for an archive of one bucket" in r.stderr
