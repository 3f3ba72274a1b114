"""The reading commands on a cluster archive (`backup --all-buckets`): info, verify
(alone and --against the node), examine, export and the Spark data source work on its
buckets. One node of three buckets (one of 64 vbuckets, one with two collections), one
cluster archive of a full and an incremental run, made once for the module and only read
by its tests (a test that damages the archive works on a copy)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from cliutil import run_dcptool
from nodeprocutil import NodeProcess

PASSWORD = "password"
JSON_DOC = Path(__file__).resolve().parents[2] / "docs" / "json-output.md"
BUCKETS = ["big", "default", "travel"]
#: documents per bucket after the incremental run
ITEMS = {"default": 10, "travel": 20 + 12 + 4, "big": 30}


def documented(title: str) -> dict:
    """docs/json-output.md's example under `title`."""
    text = JSON_DOC.read_text()
    at = text.index(title)
    block = text[text.index("```json\n", at) + 8:]
    return json.loads(block[:block.index("```")])


@pytest.fixture(scope="module")
def env(warm_engine):
    """The commands' environment: the node's password, Spark jobs on the run's warm
    engine."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("DCPTOOL_ARCHIVE_PASS")}
    e["DCPTOOL_PASSWORD"] = PASSWORD
    e["DCPTOOL_ENGINE_DIR"] = warm_engine
    e.pop("DCPTOOL_ENGINE", None)
    e.pop("DCPTOOL_BUCKET", None)
    return e


def run(env: dict[str, str], *args: str, ok: bool = True, extra: dict[str, str] | None = None,
        timeout: float = 240) -> subprocess.CompletedProcess:
    r = run_dcptool({**env, **(extra or {})}, *args, timeout=timeout)  # from the warm zygote
    if ok:
        assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r


@pytest.fixture(scope="module")
def made(tmp_path_factory, env):
    """(node, its address, a cluster archive of a full and an incremental run, the
    runs' JSON): default (8 vbuckets, 10 documents), travel (8 vbuckets, 20 in the
    default collection and 12 in inventory.hotels, 4 more in the incremental run) and big
    (64 vbuckets, 30)."""
    root = tmp_path_factory.mktemp("clread")
    with NodeProcess(root / "node", vbuckets=8) as n:
        c = f"{n.host}:{n.port}"
        run(env, "bucket", "create", "travel", "-c", c)
        run(env, "bucket", "create", "big", "-c", c, "--num-vbuckets", "64")
        run(env, "collection", "create", "inventory", "-c", c, "-b", "travel")
        run(env, "collection", "create", "inventory.hotels", "-c", c, "-b", "travel")
        run(env, "doc", "load", "--count", "20", "-c", c, "-b", "travel", "-q")
        run(env, "doc", "load", "--count", "12", "-c", c, "-b", "travel", "-q",
            "--collection", "inventory.hotels", "--prefix", "hotel::")
        run(env, "doc", "load", "--count", "30", "-c", c, "-b", "big", "-q")
        run(env, "doc", "load", "--count", "10", "-c", c, "-q")
        archive = root / "cluster"
        first = json.loads(run(env, "backup", "-c", c, str(archive), "--all-buckets",
                               "--json", "--no-watermark").stdout)
        run(env, "doc", "load", "--count", "4", "--prefix", "more::", "-c", c, "-b",
            "travel", "-q")
        second = json.loads(run(env, "backup", "-c", c, str(archive), "--json",
                                "--no-watermark").stdout)
        yield n, c, archive, [first, second]


# -- info ------------------------------------------------------------------------------------


def test_info_shows_a_row_per_bucket_totals_and_runs(made, env):
    _n, _c, archive, runs = made
    out = run(env, "info", str(archive)).stdout
    assert "cluster archive" in out and "3 buckets" in out and "2 runs" in out
    for name in BUCKETS:
        assert name in out
    assert f"{sum(ITEMS.values())}" in out  # the total of items
    assert runs[0]["run_id"] in out and runs[1]["run_id"] in out
    assert "incremental" in out  # the latest run's status of the buckets


def test_info_json_is_the_documented_cluster_shape(made, env):
    _n, _c, archive, runs = made
    d = json.loads(run(env, "info", str(archive), "--json").stdout)
    doc = documented("### dcptool info of a cluster archive")
    assert set(d) == set(doc)
    assert d["kind"] == "cluster" and not d["encrypted"]
    assert sorted(d["buckets"]) == BUCKETS
    # each bucket's entry is the bucket-archive info JSON (and its summary)
    bucket_doc = json.loads(run(env, "info", str(archive / "buckets" / "travel"),
                                "--json").stdout)
    travel = d["buckets"]["travel"]
    assert set(travel) == set(bucket_doc) | {"summary"}
    assert travel["archive"]["bucket"] == "travel" and len(travel["backups"]) == 2
    assert set(travel["summary"]) == set(doc["buckets"]["travel-sample"]["summary"])
    assert {n: b["summary"]["items"] for n, b in d["buckets"].items()} == ITEMS
    assert d["buckets"]["big"]["archive"]["vbuckets"] == 64
    assert d["totals"]["items"] == sum(ITEMS.values()) and d["totals"]["buckets"] == 3
    assert d["totals"]["backups"] == 6
    assert [r["id"] for r in d["runs"]] == [r["run_id"] for r in runs]
    assert d["runs"][0]["backed_up"] == BUCKETS
    assert d["runs"][1]["buckets"]["travel"]["status"] == "incremental"
    assert isinstance(d["runs"][0]["users"], int)
    assert set(d["runs"][0]) == set(doc["runs"][0])


def test_info_bucket_shows_that_buckets_full_info(made, env):
    _n, _c, archive, _runs = made
    out = run(env, "info", str(archive), "-b", "travel").stdout
    assert "bucket travel" in out and "mutations" in out and "big" not in out
    d = json.loads(run(env, "info", str(archive), "--bucket", "travel,big", "--json").stdout)
    assert sorted(d["buckets"]) == ["big", "travel"]
    # -c: each bucket checked against the node's bucket of the same name
    d = json.loads(run(env, "info", str(archive), "-c", made[1], "--json").stdout)
    for name in BUCKETS:
        check = d["buckets"][name]["node_check"]
        assert check["warnings"] == [] and check["watermark"]["state"] is None, name
    out = run(env, "info", str(archive), "-c", made[1], "-b", "big").stdout
    assert "no deletion the archive still needs was purged" in out
    r = run(env, "info", str(archive), "-b", "nosuch", ok=False)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "nosuch" in r.stderr and "big, default, travel" in r.stderr
    r = run(env, "info", str(archive), "--keep-last", "1", ok=False)
    assert r.returncode == 2 and "cluster archive" in r.stderr


# -- verify ------------------------------------------------------------------------------------


def test_verify_checks_every_bucket_and_run(made, env):
    _n, _c, archive, _runs = made
    out = run(env, "verify", str(archive)).stdout
    for name in BUCKETS:
        assert f"bucket {name}: OK" in out
    assert out.strip().splitlines()[-1] == "OK: 3 buckets and 2 runs verified"
    d = json.loads(run(env, "verify", str(archive), "--json", "-b", "big").stdout)
    assert set(d) == set(documented("### dcptool verify of a cluster archive"))
    assert d["ok"] and d["kind"] == "cluster" and list(d["buckets"]) == ["big"]
    assert d["runs_checked"] == 2 and d["problems"] == []
    # each bucket's report is the bucket-archive verify JSON
    assert set(d["buckets"]["big"]) == set(documented("## dcptool verify"))
    assert d["buckets"]["big"]["backups_checked"] == 2


def test_verify_names_the_damaged_bucket(made, env, tmp_path):
    _n, _c, archive, _runs = made
    copy = tmp_path / "copy"
    shutil.copytree(archive, copy)
    data = sorted(p for p in (copy / "buckets" / "travel" / "backups").rglob("*")
                  if p.is_file() and not p.name.endswith(".json") and p.stat().st_size > 64)
    victim = data[0]
    raw = bytearray(victim.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    victim.write_bytes(bytes(raw))
    r = run(env, "verify", str(copy), ok=False)
    assert r.returncode == 1
    assert "bucket travel: FAILED" in r.stdout and "bucket big: OK" in r.stdout
    assert str(victim) in r.stdout
    assert r.stdout.strip().splitlines()[-1].startswith("FAILED: bucket travel")
    d = json.loads(run(env, "verify", str(copy), "--json", ok=False).stdout)
    assert not d["ok"] and not d["buckets"]["travel"]["ok"] and d["buckets"]["default"]["ok"]
    # a run file that names a backup the bucket archive does not hold
    runs = sorted((copy / "runs").iterdir())
    rec = json.loads(runs[0].read_text())
    rec["buckets"]["big"]["backup"] = "20200101T000000.000000Z"
    runs[0].write_text(json.dumps(rec))
    d = json.loads(run(env, "verify", str(copy), "-b", "big", "--json", ok=False).stdout)
    assert d["buckets"]["big"]["ok"] and not d["ok"]
    assert [p["path"] for p in d["problems"]] == [str(runs[0])]
    assert "bucket big: backup 20200101T000000.000000Z" in d["problems"][0]["message"]


def test_verify_accepts_runs_naming_merged_backups(made, env, tmp_path):
    """A bucket archive's backups merged (merge of ARCHIVE/buckets/NAME): the runs name
    backups the merged one replaced, and the cluster archive verifies."""
    _n, _c, archive, runs = made
    copy = tmp_path / "copy"
    shutil.copytree(archive, copy)
    run(env, "merge", str(copy / "buckets" / "default"), "-q")
    d = json.loads(run(env, "info", str(copy / "buckets" / "default"), "--json").stdout)
    assert [b["merged_from"] for b in d["backups"]] == \
        [[r["buckets"]["default"]["backup"]["backup_id"] for r in runs]]
    out = run(env, "verify", str(copy), "-b", "default").stdout
    assert out.strip().splitlines()[-1] == "OK: 1 bucket and 2 runs verified"


def test_verify_against_the_node_compares_each_bucket(made, env):
    _n, c, archive, _runs = made
    out = run(env, "verify", str(archive), "--against", "-c", c).stdout
    for name in BUCKETS:
        assert f"bucket {name}: OK" in out
    assert out.strip().splitlines()[-1] == "OK: 3 buckets match the node"
    # a document changed on the node since the backup: its bucket differs, the others match
    # (the node no longer holds what the archive does: later tests only read the archive)
    run(env, "doc", "set", "doc::1", '{"changed": true}', "-c", c, "-b", "big")
    r = run(env, "verify", str(archive), "--against", "-c", c, ok=False)
    assert r.returncode == 1 and "bucket big:   doc::1: archive live" in r.stdout
    assert r.stdout.strip().splitlines()[-1] == \
        "FAILED: 1 of 3 buckets differs from the node: big"
    r = run(env, "verify", str(archive), "--against", "-c", c, "--json", ok=False)
    assert r.returncode == 1
    d = json.loads(r.stdout)
    assert not d["ok"] and not d["buckets"]["big"]["ok"] and d["buckets"]["travel"]["ok"]
    assert set(d["buckets"]["travel"]) == set(documented("With `--against -c CLUSTER`"))


# -- examine and export --------------------------------------------------------------------------


def test_examine_needs_the_bucket_of_a_cluster_archive(made, env):
    _n, _c, archive, runs = made
    r = run(env, "examine", str(archive), "more::1", ok=False)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "3 buckets (big, default, travel)" in r.stderr and "--bucket" in r.stderr
    d = json.loads(run(env, "examine", str(archive), "more::1", "-b", "travel",
                       "--json").stdout)
    assert [v["backup"] for v in d["versions"]] == \
        [runs[1]["buckets"]["travel"]["backup"]["backup_id"]]
    out = run(env, "examine", str(archive), "hotel::3", "--bucket", "travel").stdout
    assert "hotels" in out and "would restore" in out
    r = run(env, "examine", str(archive), "doc::1", "-b", "nosuch", ok=False)
    assert r.returncode == 2 and "nosuch" in r.stderr and r.stderr.count("\n") == 1
    # a bucket archive: -b names its own bucket or nothing
    run(env, "examine", str(archive / "buckets" / "big"), "doc::1", "-b", "big")
    r = run(env, "examine", str(archive / "buckets" / "big"), "doc::1", "-b", "travel",
            ok=False)
    assert r.returncode == 2 and "'big' only" in r.stderr


def _jsonl(out: Path) -> list[dict]:
    return [json.loads(line) for f in sorted(out.glob("part-*.jsonl"))
            for line in f.read_text().splitlines()]


def test_export_writes_every_bucket_with_a_bucket_field(made, env, tmp_path):
    _n, _c, archive, _runs = made
    d = json.loads(run(env, "export", str(archive), str(tmp_path / "all"), "--format",
                       "jsonl", "--resolved", "--json").stdout)
    rows = _jsonl(tmp_path / "all")
    assert d["rows"] == len(rows) == sum(ITEMS.values())
    per = {}
    for r in rows:
        per[r["bucket"]] = per.get(r["bucket"], 0) + 1
    assert per == ITEMS
    hotels = {r["key"] for r in rows if r["collection"] == "hotels"}
    assert len(hotels) == 12 and all(r["bucket"] == "travel" for r in rows
                                     if r["collection"] == "hotels")
    # one bucket, as Parquet: the same column
    run(env, "export", str(archive), str(tmp_path / "big"), "-b", "big")
    import pyarrow.parquet as pq

    t = pq.read_table(tmp_path / "big")
    assert t.num_rows == ITEMS["big"] and set(t.column("bucket").to_pylist()) == {"big"}
    # --backup is one bucket's
    r = run(env, "export", str(archive), str(tmp_path / "x"), "--backup", "2026", ok=False)
    assert r.returncode == 2 and "-b NAME" in r.stderr and r.stderr.count("\n") == 1


# -- the Spark data source -------------------------------------------------------------------------


def test_data_source_reads_every_bucket_with_a_bucket_column(made, spark):
    from dcptool.pipeline.datasource import CLUSTER_COLUMNS, COLUMNS
    from dcptool.spark import read_archive

    _n, _c, archive, _runs = made
    df = read_archive(spark, archive, resolved=True, values=False)
    assert [(f.name, f.dataType.simpleString()) for f in df.schema.fields] == \
        list(CLUSTER_COLUMNS)
    assert {r["bucket"]: r["count"] for r in df.groupBy("bucket").count().collect()} == ITEMS
    # option bucket: one, or a comma list; on the format itself too
    two = read_archive(spark, str(archive), resolved=True, bucket="travel,big")
    assert sorted(r["bucket"] for r in two.select("bucket").distinct().collect()) == \
        ["big", "travel"]
    assert two.count() == ITEMS["travel"] + ITEMS["big"]
    one = spark.read.format("dcptool").option("bucket", "default").load(str(archive))
    assert one.filter("type = 'mutation'").count() == ITEMS["default"]
    with pytest.raises(Exception, match="nosuch"):
        read_archive(spark, archive, bucket="nosuch")
    # a bucket archive read alone keeps its documented columns: no bucket column
    alone = read_archive(spark, archive / "buckets" / "big")
    assert [f.name for f in alone.schema.fields] == [n for n, _t in COLUMNS]
    assert alone.filter("type = 'mutation'").count() == ITEMS["big"]


# -- an encrypted cluster archive -----------------------------------------------------------------


def test_encrypted_cluster_archive_opens_with_the_passphrase_variable(made, env, spark,
                                                                      tmp_path, monkeypatch):
    from dcptool.spark import read_archive

    _n, c, _archive, _runs = made
    archive = tmp_path / "sealed"
    secret = {"DCPTOOL_ARCHIVE_PASSPHRASE": "cluster secret"}
    run(env, "backup", "-c", c, str(archive), "--all-buckets", "--encrypt", "-q",
        "--no-watermark", "--include-data", "travel,default", extra=secret)
    d = json.loads(run(env, "info", str(archive), "--json", extra=secret).stdout)
    assert d["encrypted"] and sorted(d["buckets"]) == ["default", "travel"]
    assert d["buckets"]["travel"]["archive"]["encrypted"]
    assert d["buckets"]["travel"]["summary"]["items"] == ITEMS["travel"]
    assert isinstance(d["runs"][0]["users"], int)  # the sealed run file opened
    out = run(env, "verify", str(archive), extra=secret).stdout
    assert out.strip().splitlines()[-1] == "OK: 2 buckets and 1 run verified"
    run(env, "examine", str(archive), "hotel::1", "-b", "travel", extra=secret)
    # a sealed run file changed: verify names it
    runfile = next((archive / "runs").iterdir())
    raw = bytearray(runfile.read_bytes())
    raw[-5] ^= 0x01
    runfile.write_bytes(bytes(raw))
    r = run(env, "verify", str(archive), "--json", extra=secret, ok=False)
    d = json.loads(r.stdout)
    assert r.returncode == 1 and not d["ok"] and all(b["ok"] for b in d["buckets"].values())
    assert [p["path"] for p in d["problems"]] == [str(runfile)]
    runfile.write_bytes(bytes(raw[:-5]) + bytes([raw[-5] ^ 0x01]) + bytes(raw[-4:]))
    r = run(env, "info", str(archive), extra={"DCPTOOL_ARCHIVE_PASSPHRASE": "wrong"}, ok=False)
    assert r.returncode != 0 and r.stderr.count("\n") == 1 and "passphrase" in r.stderr
    monkeypatch.setenv("DCPTOOL_ARCHIVE_PASSPHRASE", "cluster secret")
    df = read_archive(spark, archive, resolved=True, values=False)
    assert {r["bucket"]: r["count"] for r in df.groupBy("bucket").count().collect()} == \
        {"default": ITEMS["default"], "travel": ITEMS["travel"]}
