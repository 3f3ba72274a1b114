"""A short soak (`benchmarks/soak.py`): a 2-node cluster with 1 replica under a steady
writer, a `dcptool tail --state` process, incremental backups every few seconds,
COMPACT_DB with a purge age of 0, and one failover (SIGKILL of the node active for half
the vbuckets, then `dcptool cluster failover`) in the middle; the surviving copies of
those vbuckets are held a few seconds behind first, so readers must roll back.

At the end the archive restored into a fresh node equals the surviving node, the tail's
output (rollbacks applied) equals it too, every acknowledged write is there, and the
backups' high watermarks kept the purger from taking deletions the archive had not seen.
Only writes B acknowledged above the hold are gone (asynchronous replication: expected).

DCPTOOL_SOAK_SECONDS sets the length (default 60 s).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.soak import run_soak  # noqa: E402

SECONDS = float(os.environ.get("DCPTOOL_SOAK_SECONDS", "60"))
RATE = 150


def test_soak_backups_tail_compaction_and_a_failover(spark, tmp_path):
    rep = run_soak(seconds=SECONDS, rate=RATE, backup_every=6, compact_every=5,
                   failover_at=0.5, spark=spark, workdir=tmp_path, log=lambda *_: None)
    summary = {k: v for k, v in rep.items() if k != "backup_runs"}

    # nothing lost: the restore, the tail and the writer's acknowledged writes agree
    assert rep["data_lost"] == 0, summary
    assert rep["restore_differences"] == 0 and rep["tail_differences"] == 0, rep["examples"]
    assert rep["writer_lost"] == 0 and rep["tail_out_of_order"] == 0, summary
    assert rep["restored_failed"] == {"mutation": 0, "deletion": 0, "expiration": 0}

    # the load held: a steady rate, every kind of write, documents and tombstones left
    assert rep["ops_per_s"] >= 0.8 * RATE, summary
    assert all(n > 0 for n in rep["op_kinds"].values()), rep["op_kinds"]
    assert rep["node_documents"] > 100 and rep["node_tombstones"] > 0, summary

    # the failover happened: B's half of the vbuckets promoted on A; A's copies had been
    # held back, so the backup and the tail had read beyond them and rolled back
    assert rep["failover"] is not None
    assert len(rep["failover"]["promoted"]) == rep["b_active_vbuckets"] == 8
    assert rep["held_replicas"] == 8
    assert 1 <= rep["backup_rollbacks"] <= 8 and 1 <= rep["tail_rollbacks"], summary
    assert rep["lost_in_failover_unreplicated"] > 0  # B's writes above the hold: gone

    # backups ran throughout, incrementally, each registering the archive's watermark;
    # compaction purged tombstones, but never one the archive had not seen yet
    runs = rep["backup_runs"]
    assert len(runs) >= max(3, int(SECONDS / 6) // 2), summary
    assert runs[0]["type"] == "full" and all(r["type"] == "incremental" for r in runs[1:])
    assert all(r["watermark_registered"] for r in runs), runs
    assert all(r["behind_purge_seqno"] == 0 for r in runs), runs
    assert rep["compactions"] > 0 and rep["tombstones_purged"] > 0, summary
    # the tail followed the cluster map across the failover and saw every change
    assert rep["tail_records"] >= rep["ops_acknowledged"] * 0.5, summary
