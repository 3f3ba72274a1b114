"""`dcptool remove`, `dcptool prune` and `dcptool info --keep-*` on the command line: the
documented JSON, one-line errors, a prune that merges (as Spark tasks) and verifies."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from cliutil import cli

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "archive"))
from test_archive_retention import make_chain, restored, times40  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def documented(title: str) -> dict:
    text = (REPO / "docs" / "json-output.md").read_text()
    section = text.split(f"\n## {title}\n", 1)[1]
    return json.loads(section.split("```json\n", 1)[1].split("```", 1)[0])


@pytest.fixture
def chain(tmp_path):
    """8 backups, one a month from 2025-06 (full at 0 and 3)."""
    return make_chain(tmp_path / "a", times40()[:8], fulls={0, 3})


def test_prune_dry_run_json_has_the_documented_fields_and_changes_nothing(chain, capsys):
    archive, ids, _ = chain
    rc, out, err = cli(capsys, "prune", archive.path, "--keep-last", 1, "--keep-monthly", 3,
                       "--dry-run", "--json")
    assert rc == 0, err
    d = json.loads(out)
    doc = documented("dcptool prune")
    assert set(d) == set(doc)
    assert set(d["backups"][0]) == set(doc["backups"][0])
    assert d["dry_run"] is True and d["log"] is None
    assert d["kept"] == ids[5:] and d["removed"] == ids[:5]
    assert d["deleted"] == [ids[2], ids[1], ids[0]]
    assert d["merges"] == [{"replaced": ids[3:6], "kept": ids[5], "merged_id": None,
                            "type": "full"}]
    assert [r["action"] for r in d["backups"]] == ["delete"] * 3 + ["merge"] * 2 + \
        ["merge-into", "keep", "keep"]
    assert d["backups"][7]["reasons"] == ["last", "monthly 2026-01", "newest"]
    assert archive.committed_ids() == ids


def test_info_shows_what_a_policy_keeps(chain, capsys):
    archive, ids, _ = chain
    rc, out, _ = cli(capsys, "info", archive.path, "--keep-monthly", 2, "--json")
    assert rc == 0
    ret = json.loads(out)["retention"]
    assert ret["policy"] == {"last": 0, "hourly": 0, "daily": 0, "weekly": 0, "monthly": 2}
    assert [r["action"] for r in ret["backups"]][3:] == ["merge", "merge", "merge",
                                                         "merge-into", "keep"]
    rc, out, _ = cli(capsys, "info", archive.path, "--json")
    assert "retention" not in json.loads(out)
    rc, out, _ = cli(capsys, "info", archive.path, "--keep-monthly", 2)
    assert "prune --keep-monthly 2 would:" in out
    assert re.search(rf"{ids[4]}\s.*merge\s.*merged into {ids[6]}", out)
    assert archive.committed_ids() == ids


def test_remove_deletes_what_nothing_depends_on(chain, capsys):
    archive, ids, model = chain
    rc, out, err = cli(capsys, "remove", archive.path, "--backup", ids[2], "--backup", ids[1],
                       "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert set(d) == set(documented("dcptool remove"))
    assert d["selection"] == {"backups": [ids[2], ids[1]], "older_than": None}
    assert d["deleted"] == [ids[2], ids[1]] and d["merges"] == [] and d["dry_run"] is False
    assert d["log"] and Path(d["log"]).is_file()
    assert archive.committed_ids() == [ids[0], *ids[3:]]
    assert restored(archive, ids[0]) == model.states[ids[0]]
    rc, out, err = cli(capsys, "verify", archive.path)
    assert rc == 0, out + err


@pytest.mark.parametrize("args,message", [
    (["--backup", "NEWEST"], "is the newest: it is never removed"),
    (["--backup", "20200101T000000.000000Z"], "has no backup 20200101T000000.000000Z"),
    ([], "give --backup ID (one or more) or --older-than DURATION"),
    (["--backup", "NEWEST", "--older-than", "3d"], "give --backup ID"),
    (["--older-than", "3 days"], "duration '3 days' is not understood"),
])
def test_remove_errors_are_one_line(chain, capsys, args, message):
    archive, ids, _ = chain
    args = [ids[-1] if a == "NEWEST" else a for a in args]
    rc, out, err = cli(capsys, "remove", archive.path, *args)
    assert rc in (1, 2), err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert archive.committed_ids() == ids


def test_prune_needs_a_policy(chain, capsys):
    archive, ids, _ = chain
    rc, _, err = cli(capsys, "prune", archive.path)
    assert rc == 2 and "give at least one --keep-* option" in err


def test_remove_older_than_merges_forward_as_spark_tasks(chain, capsys, spark, monkeypatch):
    import dcptool.archive.retention as retention

    archive, ids, model = chain
    # from a clock of 2026-01-05, 60 days back is 2025-11-06: ids 0..4 (June..October) are
    # older; 0..2 are deleted, 3..4 merged into 5, which becomes full
    monkeypatch.setattr(retention, "utc_now", lambda: times40()[7])
    days = 60
    rc, out, err = cli(capsys, "remove", archive.path, "--older-than", f"{days}d", "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert d["deleted"] == [ids[2], ids[1], ids[0]]
    (m,) = d["merges"]
    assert m["replaced"] == ids[3:6] and m["type"] == "full"
    assert archive.committed_ids() == [m["merged_id"], ids[6], ids[7]]
    for orig in ids[5:]:
        now = d["renamed"].get(orig, orig)
        assert restored(archive, now) == model.states[orig]
    rc, out, err = cli(capsys, "verify", archive.path, "--json")
    assert rc == 0 and json.loads(out)["ok"], out + err


def test_remove_and_info_on_object_storage(s3, capsys):
    server, bucket = s3
    loc = f"s3://{bucket}/arch"
    archive, ids, model = make_chain(loc, times40()[:5], fulls={0, 2})
    rc, out, err = cli(capsys, "info", loc, "--keep-last", 2, "--json")
    assert rc == 0, err
    assert [r["action"] for r in json.loads(out)["retention"]["backups"]] == \
        ["delete", "delete", "merge", "merge-into", "keep"]
    rc, out, err = cli(capsys, "remove", loc, "--backup", ids[0], "--backup", ids[1], "--json")
    assert rc == 0, err
    assert json.loads(out)["deleted"] == [ids[1], ids[0]]
    assert archive.committed_ids() == ids[2:] and archive.backup_ids() == ids[2:]
    assert restored(archive, ids[4]) == model.states[ids[4]]
    rc, out, err = cli(capsys, "verify", loc)
    assert rc == 0, out + err
