"""`dcptool export`: Parquet and JSON lines that read back with the data source's rows."""
from __future__ import annotations

import base64
import json

import pytest
from cliutil import cli
from docutil import delete, load, opts_for
from nodeprocutil import NodeProcess

from dcptool.archive import Archive
from dcptool.pipeline.backup import run_backup
from dcptool.spark import read_archive

VBS = 16


@pytest.fixture(scope="module")
def archive(tmp_path_factory, spark):
    base = tmp_path_factory.mktemp("export")
    path = base / "archive"
    with NodeProcess(base / "src", vbuckets=VBS) as node:
        opts = opts_for(node)
        with opts.connect() as conn:
            load(conn, {f"item::{i}": {"i": i, "text": "é" * (i % 7)} for i in range(800)}, VBS)
            load(conn, {f"bin::{i}": bytes(range(i % 256)) for i in range(20)}, VBS)
        run_backup(opts, path, spark=spark)
        with opts.connect() as conn:
            load(conn, {f"item::{i}": {"i": i, "v": 2} for i in range(100)}, VBS)
            delete(conn, [f"item::{i}" for i in range(700, 750)], VBS)
        run_backup(opts, path, spark=spark)
    return path


def _rows(df):
    return sorted(tuple(r) for r in df.collect())


def test_export_parquet_reads_back_the_same_rows(archive, spark, tmp_path, capsys):
    out = tmp_path / "all"
    rc, text, err = cli(capsys, "export", archive, out, "--format", "parquet", "--json")
    assert rc == 0, err
    d = json.loads(text)
    source = read_archive(spark, archive)
    assert d["rows"] == source.count() == 820 + 150
    back = spark.read.parquet(str(out))
    assert back.schema == source.schema
    assert _rows(back) == _rows(source)

    # resolved, as of the first backup
    first = Archive.open(archive).committed_ids()[0]
    out1 = tmp_path / "first"
    rc, text, err = cli(capsys, "export", archive, out1, "--resolved", "--backup", first)
    assert rc == 0, err
    assert "820 resolved documents" in text
    back1 = spark.read.parquet(str(out1))
    assert _rows(back1) == _rows(read_archive(spark, archive, resolved=True, backup=first))


def test_export_jsonl(archive, spark, tmp_path, capsys):
    out = tmp_path / "docs"
    rc, text, err = cli(capsys, "export", archive, out, "--format", "jsonl", "--resolved", "--json")
    assert rc == 0, err
    assert json.loads(text)["rows"] == 820
    # JSON lines files are named so (Spark's writer names them .json)
    assert not list(out.glob("part-*.json")) and list(out.glob("part-*.jsonl"))
    lines = [json.loads(line) for f in sorted(out.glob("part-*.jsonl"))
             for line in f.read_text().splitlines()]
    assert len(lines) == 820
    by_key = {r["key"]: r for r in lines}
    assert by_key["item::700"]["deleted"] is True and by_key["item::700"]["type"] == "deletion"
    assert json.loads(base64.b64decode(by_key["item::5"]["value"]))["v"] == 2
    assert base64.b64decode(by_key["bin::9"]["value"]) == bytes(range(9))
    assert set(by_key["item::1"]) >= {"backup_id", "vbucket", "seqno", "rev_seqno", "cas", "flags",
                                      "expiry", "datatype", "key", "value", "deleted"}


def test_export_user_errors(archive, tmp_path, capsys):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "x").write_text("x")
    rc, _text, err = cli(capsys, "export", archive, out)
    assert rc == 2 and "already exists" in err and len(err.splitlines()) == 1
    rc, _text, err = cli(capsys, "export", archive, tmp_path / "o", "--format", "csv")
    assert rc == 2 and "parquet or jsonl" in err
    rc, _text, err = cli(capsys, "export", archive, tmp_path / "o", "--backup", "20200101T000000.000000Z")
    assert rc != 0 and err.startswith("dcptool: error: ") and "Traceback" not in err
