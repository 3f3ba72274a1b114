"""Soak run: a 2-node cluster under a steady writer, a tail, incremental backups,
compactions and one failover; at the end the archive and the tail must equal the node.

    python benchmarks/soak.py --seconds 300 [--rate 200] [--backup-every 10]
                              [--compact-every 7] [--failover-at 0.5] [--json out.json]

What runs (all real processes on 127.0.0.1):

* two reference nodes (16 vbuckets, --purge-age 0 so compaction really purges tombstones,
  expiry pager every second) made one cluster with 1 replica (`dcptool cluster create`);
* a writer thread at --rate ops/s routed to each vbucket's active node: new documents,
  updates, deletions, updates with a long expiry and some with a 3 s expiry;
* `dcptool tail --from beginning --state FILE --json` writing to a file (restarted with
  the same state file if it exits);
* every --backup-every seconds an incremental backup (in-process Spark) into one archive;
  it registers the archive's high watermark on the nodes;
* every --compact-every seconds COMPACT_DB on every active vbucket;
* at --failover-at (fraction of --seconds) node B, active for half the vbuckets, is killed
  with SIGKILL and failed over with `dcptool cluster failover`. --hold seconds before, A's
  replicas of B's vbuckets are held (REPLICATION_HOLD) at their seqno and a backup runs, so
  the backup and the tail have read changes the promoted copies lack: after the failover
  both must roll back (a replica lagging behind its active, made certain).

At the end: the writer stops, the short expiries lapse, a last backup runs, the archive
is restored into a fresh node and compared with the surviving node (value, cas, rev seqno,
flags, expiry; tombstones the node still holds must be in the restore, and a restored
tombstone the node purged must not be live there); the tail's output (rollbacks applied,
seqnos increasing within each branch) is compared the same way; the writer's own record
of acknowledged writes is compared with the node (only writes acknowledged by B that it had
not replicated when it was killed may be missing: that is the failover's documented loss
with asynchronous replication, reported separately).

Reports: ops/s requested and achieved, backup lag (seconds a backup took and seqnos
written meanwhile), numbers of backups, compactions, tombstones purged, rollbacks, tail
restarts, and data lost (must be 0).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dcptool.client.topology import cluster_map, hold_replication  # noqa: E402
from dcptool.client.ops import get_vbucket_seqnos  # noqa: E402
from dcptool.client.options import ConnOptions  # noqa: E402
from dcptool.node.launcher import LocalNode  # noqa: E402
from docutil import node_documents  # noqa: E402  (tests/docutil.py)
from dcptool.protocol import vbucket_of  # noqa: E402
from dcptool.protocol.constants import Status  # noqa: E402
from dcptool.protocol.messages import CompactDb, Delete, Set  # noqa: E402

PASSWORD = "soak-" + os.urandom(6).hex()
VBUCKETS = 16
SHORT_EXPIRY = 3
NODE_ARGS = ("--purge-age", "0", "--expiry-pager-interval", "1", "--hwt-max-hold", "1h")


def opts_of(node: LocalNode) -> ConnOptions:
    return ConnOptions(node.host, node.port, node.username, node.password, node.bucket,
                       timeout=30.0)


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`dcptool ARGS` as a real process; the password through the environment."""
    env = dict(os.environ, DCPTOOL_PASSWORD=PASSWORD, NO_COLOR="1")
    for k in ("DCPTOOL_CLUSTER", "DCPTOOL_PASSWORD_FILE"):
        env.pop(k, None)
    return subprocess.run([sys.executable, "-m", "dcptool", *args], capture_output=True,
                          text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)


# -- the writer ----------------------------------------------------------------------------


class Writer(threading.Thread):
    """SETs and DELETEs at a steady rate, each to its vbucket's active node.

    `model` holds the last acknowledged write per key: (deleted, value, expiry, ack time,
    vbucket, node address). A write whose answer never came (the node died) makes the key
    uncertain; it is left out of the comparison."""

    def __init__(self, seed_node: ConnOptions, rate: float, *, batch_ms: float = 50) -> None:
        super().__init__(name="soak-writer", daemon=True)
        self.seed = seed_node
        self.rate = rate
        self.batch = batch_ms / 1000
        self.rnd = random.Random(7)
        self.stop_evt = threading.Event()
        self.model: dict[bytes, tuple] = {}
        self.uncertain: set[bytes] = set()
        self.live: list[bytes] = []
        self.next_key = 0
        self.acked = 0
        self.failed = 0
        self.skipped = 0
        self.kinds = {"create": 0, "update": 0, "delete": 0, "expiry": 0, "short_expiry": 0}
        self.conns: dict[str, Any] = {}
        self.view = None
        self.started = self.ended = 0.0
        self.error: BaseException | None = None

    # routing
    def refresh(self) -> None:
        addrs = [self.seed.address] + (list(self.view.nodes) if self.view else [])
        for a in addrs:
            try:
                with self._opts(a).connect() as c:
                    self.view = cluster_map(c)
                return
            except Exception:
                continue

    def _opts(self, address: str) -> ConnOptions:
        host, _, port = address.rpartition(":")
        return ConnOptions(host, int(port), self.seed.username, self.seed.password,
                           self.seed.bucket, timeout=5.0)

    def _conn(self, address: str):
        c = self.conns.get(address)
        if c is None:
            c = self.conns[address] = self._opts(address).connect()
        return c

    def _drop(self, address: str) -> None:
        c = self.conns.pop(address, None)
        if c is not None:
            try:
                c.close()
            except Exception:
                pass

    def _op(self) -> tuple[str, bytes, Any]:
        r = self.rnd.random()
        if not self.live or r < 0.35:
            key = f"soak{self.next_key:07d}".encode()
            self.next_key += 1
            return "create", key, None
        key = self.live[self.rnd.randrange(len(self.live))]
        if r < 0.70:
            return "update", key, None
        if r < 0.85:
            return "delete", key, None
        if r < 0.95:
            return "expiry", key, int(time.time()) + 3600
        return "short_expiry", key, int(time.time()) + SHORT_EXPIRY

    def _send(self, ops: list) -> None:
        by_node: dict[str, list] = {}
        for kind, key, exp in ops:
            vb = vbucket_of(key, VBUCKETS)
            chain = self.view.vbmap[vb] if self.view and vb < len(self.view.vbmap) else ()
            if not chain or chain[0] < 0:
                self.failed += 1
                continue
            by_node.setdefault(self.view.nodes[chain[0]], []).append((kind, key, exp, vb))
        need_refresh = False
        for address, items in by_node.items():
            try:
                conn = self._conn(address)
            except Exception:
                self.failed += len(items)
                need_refresh = True
                continue
            sent = []
            out = bytearray()
            for kind, key, exp, vb in items:
                n = self.acked + self.failed + len(sent)
                if kind == "delete":
                    msg, value = Delete(key=key, vbucket=vb), None
                else:
                    value = json.dumps({"key": key.decode(), "n": n, "kind": kind}).encode()
                    msg = Set(key=key, value=value, vbucket=vb, flags=0x2000000 | (n & 0xff),
                              expiry=exp or 0, datatype=1)
                f = msg.to_frame()
                f.opaque = conn.next_opaque()
                out += f.encode()
                sent.append((f.opaque, kind, key, exp, vb, value))
            answered = 0
            try:
                conn.send_bytes(out)
                for opaque, kind, key, exp, vb, value in sent:
                    rsp = conn.wait_response(opaque, timeout=10)
                    answered += 1
                    if rsp.status == Status.SUCCESS or (kind == "delete"
                                                        and rsp.status == Status.KEY_ENOENT):
                        self.acked += 1
                        self.kinds[kind] += 1
                        self.model[key] = (kind == "delete", value, exp or 0, time.time(), vb,
                                           address)
                        self.uncertain.discard(key)
                        if kind == "create":
                            self.live.append(key)
                    else:
                        self.failed += 1
                        if rsp.status == Status.NOT_MY_VBUCKET:
                            need_refresh = True
            except Exception:
                # the node went away: a write whose answer never came may or may not have
                # been applied, so its key is left out of the comparison
                self._drop(address)
                need_refresh = True
                for _opaque, _kind, key, _exp, _vb, _value in sent[answered:]:
                    self.uncertain.add(key)
                self.failed += len(sent) - answered
        if need_refresh:
            self.refresh()

    def run(self) -> None:
        try:
            self.refresh()
            self.started = time.monotonic()
            done = 0
            while not self.stop_evt.is_set():
                now = time.monotonic()
                due = self.rate * (now - self.started)
                n = int(due) - done
                if n > self.rate:  # more than a second behind: do not burst, skip
                    self.skipped += n - int(self.rate * self.batch)
                    done += n - int(self.rate * self.batch)
                    n = int(self.rate * self.batch)
                if n > 0:
                    self._send([self._op() for _ in range(n)])
                    done += n
                self.stop_evt.wait(self.batch)
            self.ended = time.monotonic()
        except BaseException as exc:  # reported by the run
            self.error = exc
            self.ended = time.monotonic()
        finally:
            for a in list(self.conns):
                self._drop(a)


# -- reading what a node holds ---------------------------------------------------------------


def compare(name: str, want: dict[bytes, tuple], got: dict[bytes, tuple]) -> list[str]:
    """Differences between the node (`want`) and a copy (`got`). Live documents must be equal
    in every field; the node's tombstones must be tombstones in the copy with the same cas
    and rev; a tombstone only the copy holds (the node purged it) must not be live on the
    node."""
    out = []
    for k, w in want.items():
        g = got.get(k)
        if w[0] == "live":
            if g != w:
                out.append(f"{name}: {k!r} node {w[:1] + w[2:]} copy {g[:1] + g[2:] if g else None}")
        elif g is None or g[0] != "deleted" or g[2:4] != w[2:4]:
            out.append(f"{name}: tombstone {k!r} node {w} copy {g}")
    for k, g in got.items():
        if k not in want and g[0] == "live":
            out.append(f"{name}: {k!r} live in the copy, unknown to the node")
    return out


def tail_documents(path: Path) -> tuple[dict[bytes, tuple], dict[str, int]]:
    """The tail's view: the last record per key after applying rollbacks; checks that
    seqnos increase within each branch."""
    per_vb: dict[int, list[dict]] = {}
    stats = {"records": 0, "rollbacks": 0, "out_of_order": 0, "stream_ends": 0}
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        d = json.loads(line)
        t = d["type"]
        if t in ("mutation", "deletion", "expiration"):
            recs = per_vb.setdefault(d["vbucket"], [])
            if recs and d["seqno"] <= recs[-1]["seqno"]:
                stats["out_of_order"] += 1
            recs.append(d)
            stats["records"] += 1
        elif t == "rollback":
            stats["rollbacks"] += 1
            recs = per_vb.setdefault(d["vbucket"], [])
            recs[:] = [r for r in recs if r["seqno"] <= d["to_seqno"]]
        elif t == "stream_end":
            stats["stream_ends"] += 1
    docs: dict[bytes, tuple] = {}
    for recs in per_vb.values():
        for r in recs:
            key = r["key"].encode()
            if r["type"] == "mutation":
                docs[key] = ("live", r["value"].encode(), r["cas"], r["rev_seqno"], r["flags"],
                             r["expiry"])
            else:
                docs[key] = ("deleted", b"", r["cas"], r["rev_seqno"], 0, 0)
    return docs, stats


def tail_high(path: Path) -> dict[int, int]:
    """The highest seqno the tail has shown per vbucket (since its last rollback)."""
    high: dict[int, int] = {}
    try:
        text = path.read_text()
    except FileNotFoundError:
        return high
    for line in text.splitlines():
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if d["type"] in ("mutation", "deletion", "expiration", "seqno_advanced"):
            high[d["vbucket"]] = max(high.get(d["vbucket"], 0), d["seqno"])
        elif d["type"] == "rollback":
            high[d["vbucket"]] = d["to_seqno"]
    return high


class Tail:
    def __init__(self, base: Path) -> None:
        self.state = base / "tail.state"
        self.out = base / "tail.jsonl"
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.exits: list[int] = []

    def start(self, address: str) -> None:
        env = dict(os.environ, DCPTOOL_PASSWORD=PASSWORD, NO_COLOR="1")
        env.pop("DCPTOOL_PASSWORD_FILE", None)
        args = ["--state", str(self.state)]
        if not self.state.exists():
            args += ["--from", "beginning"]
        f = open(self.out, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dcptool", "tail", "-c", address, "--json",
             "--noop-interval", "2", *args], stdout=f, stderr=open(self.out.with_suffix(".err"), "ab"),
            stdin=subprocess.DEVNULL, env=env)
        f.close()
        self.starts += 1

    def check(self, address: str) -> None:
        """Restart the tail (from its state file) if it exited."""
        if self.proc is not None and self.proc.poll() is not None:
            self.exits.append(self.proc.returncode)
            self.start(address)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


# -- the run -----------------------------------------------------------------------------------


def active_highs(opts: ConnOptions) -> dict[int, int]:
    from dcptool.pipeline.nodeinfo import cluster_state

    return cluster_state(opts)[1]


def compact_all(opts: ConnOptions) -> tuple[int, int]:
    """COMPACT_DB on every active vbucket of every member; (vbuckets compacted, purged)."""
    with opts.connect() as c:
        view = cluster_map(c)
    done = purged = 0
    for address in view.nodes:
        host, _, port = address.rpartition(":")
        o = ConnOptions(host, int(port), opts.username, opts.password, opts.bucket, timeout=60)
        try:
            conn = o.connect()
        except Exception:
            continue  # a dead member
        with conn:
            for vb in sorted(get_vbucket_seqnos(conn, state=1)):
                f = CompactDb(vbucket=vb, db_file_id=vb).to_frame()
                f.opaque = conn.next_opaque()
                conn.send_bytes(f.encode())
                rsp = conn.wait_response(f.opaque, timeout=60)
                if rsp.status == Status.SUCCESS:
                    done += 1
                    if rsp.value:
                        purged += int(json.loads(bytes(rsp.value)).get("purged", 0))
    return done, purged


def run_soak(*, seconds: float = 60, rate: float = 200, backup_every: float = 8,
             compact_every: float = 6, failover_at: float = 0.5, hold: float = 3.0, spark=None,
             workdir: str | os.PathLike | None = None, log=print) -> dict[str, Any]:
    from dcptool.pipeline.backup import run_backup
    from dcptool.pipeline.restore import run_restore

    own_tmp = None
    if workdir is None:
        own_tmp = tempfile.TemporaryDirectory(prefix="dcptool-soak-")
        workdir = own_tmp.name
    base = Path(workdir)
    if spark is None:
        from dcptool.pipeline.runtime import get_spark

        spark = get_spark(app_name="dcptool-soak")
    nodes = {n: LocalNode(base / n, password=PASSWORD, vbuckets=VBUCKETS, extra_args=NODE_ARGS)
             for n in ("a", "b")}
    fresh = LocalNode(base / "fresh", password=PASSWORD, vbuckets=VBUCKETS)
    tail = Tail(base)
    writer = None
    report: dict[str, Any] = {"requested_seconds": seconds, "requested_ops_per_s": rate,
                              "backup_every_s": backup_every, "compact_every_s": compact_every,
                              "vbuckets": VBUCKETS}
    try:
        for n in nodes.values():
            n.start()
        a, b = nodes["a"], nodes["b"]
        r = cli("cluster", "create", "-c", a.address, "-c", b.address, "--replicas", "1", "--json")
        if r.returncode != 0:
            raise RuntimeError(f"cluster create failed: {r.stderr.strip()}")
        vbmap = json.loads(r.stdout)["vbmap"]
        report["b_active_vbuckets"] = sum(1 for c in vbmap if c[0] == 1)
        oa = opts_of(a)
        archive = base / "archive"
        tail.start(a.address)
        writer = Writer(oa, rate)
        writer.start()
        t0 = time.monotonic()
        next_backup, next_compact = t0 + backup_every, t0 + compact_every / 2
        fail_t = t0 + seconds * failover_at if failover_at is not None else None
        backups: list[dict] = []
        compactions = purged = 0
        rollbacks = 0
        kill_time = None
        failover_doc = None
        held: dict[int, int] = {}
        hold_t = fail_t - hold if fail_t is not None and hold > 0 else None

        def backup(label: str) -> None:
            nonlocal rollbacks
            before = sum(active_highs(oa).values())
            s = time.monotonic()
            res = run_backup(oa, archive, spark=spark, watermark_ttl=3600)
            took = time.monotonic() - s
            after = sum(active_highs(oa).values())
            rollbacks += res.rollbacks
            wm = res.watermark or {}
            backups.append({"label": label, "type": res.type, "seconds": round(took, 2),
                            "seqnos_behind": after - before, "items": res.mutations
                            + res.deletions + res.expirations, "rollbacks": res.rollbacks,
                            "watermark_registered": bool(wm.get("registered")),
                            "behind_purge_seqno": len(wm.get("behind_purge_seqno") or {})})
            log(f"  backup {len(backups)} ({res.type}): {took:.1f} s, "
                f"{backups[-1]['items']} items, {after - before} seqnos written meanwhile")

        while True:
            now = time.monotonic()
            if now - t0 >= seconds:
                break
            if writer.error is not None:
                raise RuntimeError(f"the writer failed: {writer.error!r}")
            tail.check(a.address)
            if hold_t is not None and not held and now >= hold_t:
                with oa.connect() as c:
                    mine = get_vbucket_seqnos(c)  # A's copies, replicas included
                    for vb, chain in enumerate(vbmap):
                        if chain[0] == 1:
                            held[vb] = mine[vb]
                            hold_replication(c, vb, mine[vb])
                log(f"  t={now - t0:.0f}s: A's replicas of B's vbuckets held at "
                    f"{sum(held.values())} seqnos")
                time.sleep(min(1.0, hold / 2))
                backup("before the failover")  # reads what A's replicas will not have
                continue
            if fail_t is not None and kill_time is None and now >= fail_t:
                b.proc.kill()
                b.proc.wait(10)
                kill_time = time.time()
                log(f"  t={now - t0:.0f}s: node B killed (SIGKILL)")
                r = cli("cluster", "failover", "-c", b.address, "--via", a.address, "--json")
                if r.returncode != 0:
                    raise RuntimeError(f"cluster failover failed: {r.stderr.strip()}")
                failover_doc = json.loads(r.stdout)
                report["failover_seconds_after_kill"] = round(time.time() - kill_time, 2)
                with oa.connect() as c:
                    for vb in held:
                        hold_replication(c, vb, None)
                continue
            if now >= next_backup:
                backup("periodic")
                next_backup = time.monotonic() + backup_every
                continue
            if now >= next_compact:
                d, p = compact_all(oa)
                compactions += d
                purged += p
                next_compact = time.monotonic() + compact_every
                continue
            time.sleep(0.1)

        writer.stop_evt.set()
        writer.join(60)
        elapsed = writer.ended - writer.started
        log(f"  writer stopped: {writer.acked} writes acknowledged in {elapsed:.0f} s")
        time.sleep(SHORT_EXPIRY + 2.5)  # let the short expiries lapse and the pager run
        d, p = compact_all(oa)
        compactions += d
        purged += p
        backup("final")
        highs = active_highs(oa)
        deadline = time.monotonic() + 120
        while True:
            tail.check(a.address)
            th = tail_high(tail.out)
            if all(th.get(vb, 0) >= hi for vb, hi in highs.items()):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the tail did not catch up: {th} vs {highs}")
            time.sleep(0.5)
        tail.stop()

        node_docs = node_documents(oa)
        fresh.start()
        res = run_restore(str(archive), opts_of(fresh), spark=spark)
        restored = node_documents(opts_of(fresh))
        restore_diff = compare("restore", node_docs, restored)
        tail_docs, tail_stats = tail_documents(tail.out)
        tail_diff = compare("tail", node_docs, tail_docs)

        # the writer's acknowledged writes against the node
        b_index = 1
        failed_vbs = {vb for vb, c in enumerate(vbmap) if c[0] == b_index}
        lost_failover, lost = [], []
        for key, (deleted, value, exp, at, vb, address) in writer.model.items():
            if key in writer.uncertain:
                continue
            doc = node_docs.get(key)
            expired = exp and exp <= time.time() - 1
            if deleted or expired:
                ok = doc is None or doc[0] == "deleted"
            else:
                ok = doc is not None and doc[0] == "live" and doc[1] == value and doc[5] == exp
            if ok:
                continue
            if kill_time is not None and vb in failed_vbs and address == b.address \
                    and at <= kill_time + 1:
                lost_failover.append(key)
            else:
                lost.append(key)
        report.update({
            "seconds": round(elapsed, 1),
            "ops_acknowledged": writer.acked,
            "ops_per_s": round(writer.acked / elapsed, 1) if elapsed else 0,
            "ops_failed": writer.failed, "ops_skipped": writer.skipped,
            "op_kinds": writer.kinds, "keys": len(writer.model),
            "uncertain_keys": len(writer.uncertain),
            "backups": len(backups), "backup_runs": backups,
            "backup_lag_seconds_max": max(x["seconds"] for x in backups),
            "backup_lag_seconds_mean": round(sum(x["seconds"] for x in backups) / len(backups), 2),
            "backup_lag_seqnos_max": max(x["seqnos_behind"] for x in backups),
            "backup_lag_seqnos_mean": round(sum(x["seqnos_behind"] for x in backups)
                                            / len(backups), 1),
            "compactions": compactions, "tombstones_purged": purged,
            "backup_rollbacks": rollbacks, "tail_rollbacks": tail_stats["rollbacks"],
            "tail_records": tail_stats["records"], "tail_out_of_order": tail_stats["out_of_order"],
            "tail_starts": tail.starts, "tail_exit_codes": tail.exits,
            "failover": failover_doc, "held_replicas": len(held),
            "node_documents": sum(1 for v in node_docs.values() if v[0] == "live"),
            "node_tombstones": sum(1 for v in node_docs.values() if v[0] == "deleted"),
            "restored_failed": res.counts.failed,
            "restore_differences": len(restore_diff), "tail_differences": len(tail_diff),
            "lost_in_failover_unreplicated": len(lost_failover),
            "writer_lost": len(lost),
            "data_lost": len(restore_diff) + len(tail_diff) + len(lost)
            + tail_stats["out_of_order"],
            "examples": (restore_diff + tail_diff + [f"writer: {k!r}" for k in lost])[:10],
        })
        return report
    finally:
        if writer is not None:
            writer.stop_evt.set()
        tail.stop()
        for n in (*nodes.values(), fresh):
            try:
                if n.proc is not None:
                    n.stop()
            except Exception:
                pass
        if own_tmp is not None:
            own_tmp.cleanup()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=300)
    ap.add_argument("--rate", type=float, default=200, help="writer ops/s")
    ap.add_argument("--backup-every", type=float, default=10)
    ap.add_argument("--compact-every", type=float, default=7)
    ap.add_argument("--failover-at", type=float, default=0.5,
                    help="fraction of --seconds at which node B is killed and failed over")
    ap.add_argument("--hold", type=float, default=3.0,
                    help="seconds before the failover during which the promoted copies are "
                         "held back (0: none)")
    ap.add_argument("--json", metavar="FILE", help="write the report as JSON to FILE")
    ap.add_argument("--keep", metavar="DIR", help="work in DIR (kept) instead of a temp dir")
    a = ap.parse_args(argv)
    rep = run_soak(seconds=a.seconds, rate=a.rate, backup_every=a.backup_every,
                   compact_every=a.compact_every, failover_at=a.failover_at, hold=a.hold,
                   workdir=a.keep)
    short = {k: v for k, v in rep.items() if k != "backup_runs"}
    print(json.dumps(short, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(rep, indent=1) + "\n")
    return 0 if rep["data_lost"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
