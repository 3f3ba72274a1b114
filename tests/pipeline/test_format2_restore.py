"""An archive written in format 2 (tests/archive/fixtures/archive-v2, made by the format 2
code) verifies and restores into a node of today: its keys land in the default collection,
the rolled-back branch stays dead, --filter-keys matches the keys as they were written."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from docutil import node_documents, opts_for

from dcptool.archive.verify import verify_archive
from dcptool.pipeline.restore import run_restore

FIXTURE_V2 = Path(__file__).parents[1] / "archive" / "fixtures" / "archive-v2"


def _live(opts) -> dict[bytes, bytes]:
    return {k: v[1] for k, v in node_documents(opts).items() if v[0] == "live"}


def test_format_2_archive_restores(spark, node_factory, tmp_path):
    arc = tmp_path / "archive-v2"
    shutil.copytree(FIXTURE_V2, arc)
    assert verify_archive(arc).ok
    node = node_factory(vbuckets=4)
    opts = opts_for(node)
    # key-1-1's record keeps its xattr section apart from the value (format 2 allows it):
    # restore joins them, else the node would refuse the value with XATTR_EINVAL
    result = run_restore(str(arc), opts, spark=spark, key_filter="^key-(0-.|1-.)$")
    assert sum(result.as_dict()["failed"].values()) == 0
    live = _live(opts)
    # vbucket 0 rolled back to seqno 4: the full backup's 5 and 6 are dead, then 5 and 6
    # of the new branch (an update of key-0-3, key-0-4 expired)
    assert {k: json.loads(v) for k, v in live.items() if k.startswith(b"key-0-")} == {
        b"key-0-1": {"n": 1}, b"key-0-2": {"n": 2}, b"key-0-3": {"n": "x"}}
    assert {k for k in live if k.startswith(b"key-1-")} == {b"key-1-1", b"key-1-3",
                                                          b"key-1-4"}  # 2 deleted
    assert live[b"key-1-1"] == b'{"body":1}'  # the body; the xattr section went in before it
    assert live[b"key-1-3"] == b'{"n":3}'
    # --filter-keys on the keys as written (no collection prefix to match)
    other = node_factory("other", vbuckets=4)
    run_restore(str(arc), opts_for(other), spark=spark, key_filter="^key-1-[34]$")
    assert set(_live(opts_for(other))) == {b"key-1-3", b"key-1-4"}
