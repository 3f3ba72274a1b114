"""`dcptool bucket create|edit|list|drop` against a real node process: the settings reach
the node and come back in `list --json`, the node's refusals are one line and exit 1."""
from __future__ import annotations

import json

import pytest

from client.nodeutil import run_cli
from nodeprocutil import NodeProcess


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    with NodeProcess(tmp_path_factory.mktemp("bucketcli") / "node", vbuckets=8) as n:
        yield n


def listed(node) -> dict[str, dict]:
    r = run_cli("bucket", "list", "--json", node=node)
    assert r.returncode == 0, r.stderr
    return {b["name"]: b for b in json.loads(r.stdout)}


def test_list_json_has_the_documented_fields(node):
    from pathlib import Path

    from cliutil import documented_examples

    doc = documented_examples(Path(__file__).resolve().parents[2] / "docs" / "json-output.md")
    row = listed(node)["default"]
    assert set(row) == set(doc["dcptool bucket list"][0])
    assert row["numVBuckets"] == 8 and row["evictionPolicy"] == "valueOnly"


def test_create_edit_list_drop(node):
    r = run_cli("bucket", "create", "travel", "--ram-quota", "256", "--eviction-policy",
                "fullEviction", "--max-ttl", "600", "--num-vbuckets", "64",
                "--conflict-resolution", "lww", "--flush", node=node)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "created bucket travel"
    b = listed(node)["travel"]
    assert (b["ramQuotaMB"], b["evictionPolicy"], b["maxTTL"], b["numVBuckets"],
            b["conflictResolutionType"], b["flushEnabled"]) == (256, "fullEviction", 600, 64,
                                                                "lww", True)
    r = run_cli("bucket", "edit", "travel", "--max-ttl", "60", "--compression-mode", "active",
                "--json", node=node)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"edited": "travel"}
    b = listed(node)["travel"]
    assert b["maxTTL"] == 60 and b["compressionMode"] == "active"
    r = run_cli("bucket", "list", node=node)
    assert r.returncode == 0 and "travel: 64 vbuckets, 256 MiB, fullEviction" in r.stdout
    r = run_cli("bucket", "drop", "travel", node=node)
    assert r.returncode == 0, r.stderr
    assert set(listed(node)) == {"default"}
    assert not (node.data_dir / "buckets" / "travel").exists()


@pytest.mark.parametrize("args, words", [
    (("create", "bad name"), "name"),
    (("create", "default"), "already exists"),
    (("create", "x", "--ram-quota", "10"), "ramQuota"),
    (("edit", "nosuch", "--max-ttl", "5"), "404"),
    (("drop", "nosuch"), "404"),
])
def test_refusals_are_one_line(node, args, words):
    r = run_cli("bucket", *args, node=node)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert words in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("dcptool: error:")


def test_edit_without_a_setting_is_a_usage_error(node):
    r = run_cli("bucket", "edit", "default", node=node)
    assert r.returncode == 2 and "nothing to change" in r.stderr
