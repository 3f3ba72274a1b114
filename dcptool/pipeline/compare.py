"""`verify --against`: does the archive still describe the node it came from?

For each vbucket the archive holds, the archive's resolved state as of its last backup
(what a restore would write) is compared with the node's current data up to the seqno that
backup ended at, when the node has the archive's history (the archive's vbucket uuid is in
its failover log). A node with a history of its own (one the archive was restored into:
its seqnos are its own) is compared document by document, all it holds; a note says
"different history" only for such a vbucket that differs. The node's side comes from a keys-only DCP pass (no values) from seqno 0
to that seqno: a document whose current version is above it (changed after the backup) is
not in the pass, so it shows up as a difference, while documents created after the backup
do not. Each side is summarised by a count and an order-independent hash of
(key, rev seqno, cas, deleted); the vbuckets that differ are reported with their first
differing keys.

One Spark task per group of vbuckets: it resolves the group from the archive files and
reads the same vbuckets from the node over its own DCP connection, a few vbucket streams
at a time (STREAM_WINDOW), each vbucket compared as its stream ends, so that what a task
holds does not grow with the documents' count. On a member of a cluster
each vbucket's seqno and failover log come from its active member, and each task reads
the vbuckets of one member from that member (`pipeline/nodeinfo.cluster_state`), so
`--against` any member compares the whole bucket of the cluster.

A node with another vbucket count than the archive (the archive restored into a bucket of
1024, 128 or 64 vbuckets) is compared by key: each task streams all of the node's vbuckets
(keys only, up to their high seqnos) and keeps the keys that map to its archive vbuckets by
the archive's count, so every document the node holds is compared; the tasks are half as
many, as each reads the node's keys once.

Collections: both sides are compared by doc key (collection id + key). The node is read
over a collections connection (`SessionConfig(collections=True)`: every collection, doc
keys; a node without collections gives its default collection's keys the 0x00 prefix),
and the archive's resolution leaves out collections dropped as of its backup, as a restore
does. Differences name the key without prefix and its collection id.
"""
from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass, field
from typing import Any

from dcptool.archive import REC_MUTATION, Archive, backup_path, storage
from dcptool.archive.format import entries_records
from dcptool.errors import UsageError

from . import progress
from .datasource import resolve_parts
from .plans import CompareTask, VBucketComparePlan
from .runtime import (check_executors_see, default_parallelism, get_context, plan_groups,
                      run_tasks)
from .tasks import reporting_failures, task_failure

MASK = (1 << 64) - 1


def entry_hash(key: bytes, rev: int, cas: int, deleted: bool) -> int:
    h = hashlib.blake2b(key, digest_size=8)
    h.update(b"\0%d:%d:%d" % (rev, cas, 1 if deleted else 0))
    return int.from_bytes(h.digest(), "big")


def summarise(state: dict[bytes, tuple[int, int, bool]]) -> dict[str, Any]:
    total = 0
    for k, (rev, cas, deleted) in state.items():
        total = (total + entry_hash(k, rev, cas, deleted)) & MASK
    return {"count": len(state), "hash": f"{total:016x}"}


def _side(v: tuple[int, int, bool] | None) -> dict[str, Any] | None:
    if v is None:
        return None
    return {"rev_seqno": v[0], "cas": v[1], "deleted": v[2]}


def compare_states(a: dict[bytes, tuple], n: dict[bytes, tuple], limit: int) -> list[dict]:
    """The first `limit` doc keys (in key order) whose state differs between the archive `a`
    and the node `n`: key without prefix and collection id (hex)."""
    from dcptool.protocol.collections import CollectionsError, hex_id, split_doc_key

    diff = sorted(k for k in a.keys() | n.keys() if a.get(k) != n.get(k))
    out = []
    for k in diff[:limit]:
        try:
            cid, key = split_doc_key(k)
        except CollectionsError:
            cid, key = 0, k
        out.append({"key": key.decode("utf-8", "replace"), "collection_id": hex_id(cid),
                    "archive": _side(a.get(k)), "node": _side(n.get(k))})
    return out


def parts_records(parts) -> int:
    """The records of a vbucket's (backup id, manifest entry) parts."""
    return entries_records(e for _bid, e in parts)


def task_work(task: CompareTask) -> int:
    """What the progress bar counts of a task: the seqnos it streams from the node and the
    records of the archive it resolves (see _compare_task)."""
    if task.node_streams:
        node = sum(e for _vb, e in task.node_streams if e > 0)
    else:
        node = sum(p.stream_end for p in task.plans if p.stream_end > 0)
    return node + sum(parts_records(p.parts) for p in task.plans)


def compare_task(task: CompareTask) -> list[dict[str, Any]]:
    """Compare one group of vbuckets (see the module docstring)."""
    with storage.pack_cache():  # packs on object storage: each read once, whole
        return _compare_task(task)


#: vbucket streams a compare task keeps open at once (same vbucket count): each vbucket is
#: compared as its stream ends and its keys are let go, so a task holds the node's keys of
#: this many vbuckets, not of its whole group (flat memory whatever the documents' count)
STREAM_WINDOW = 8


def _compare_task(task: CompareTask) -> list[dict[str, Any]]:
    from dcptool.client.events import (DELETION, EV_CAS, EV_KEY, EV_KIND, EV_REV_SEQNO, EV_SEQNO,
                                       EV_VBUCKET, EXPIRATION, MUTATION)
    from dcptool.client.position import ZERO
    from dcptool.client.session import SessionConfig
    from dcptool.protocol import vbucket_of
    from dcptool.protocol.collections import split_doc_key

    plan: dict[int, VBucketComparePlan] = {p.vbucket: p for p in task.plans}
    node: dict[int, dict[bytes, tuple]] = {}
    cross = bool(task.node_streams)
    if cross:  # another vbucket count: every key the node holds, given to its archive vbucket
        ends = dict(task.node_streams)
        node = {vb: {} for vb in plan}
    else:
        ends = {vb: p.stream_end for vb, p in plan.items()}
    streams = {vb: (ZERO, e) for vb, e in ends.items() if e > 0}
    # the progress bar counts the node's seqnos streamed (one per item, the rest once the
    # streams end) and then the archive's records of each vbucket compared
    node_work = sum(e for _s, e in streams.values())
    counted = progress.counted()
    node_done = seen = 0
    out: list[dict[str, Any]] = []
    if streams:
        config = SessionConfig(name=task.name, no_value=True, consistent=True,
                               collections=True)
        consumer = task.opts.consumer(config)
        # by vbucket count: STREAM_WINDOW streams at a time, each vbucket compared when its
        # stream ends; another count: every stream at once (a key's vbucket is known only
        # once all of the node's vbuckets are read)
        queue = sorted(streams)
        window = len(queue) if cross else STREAM_WINDOW
        open_: set[int] = set()

        def open_more() -> None:
            batch = {}
            while queue and len(open_) + len(batch) < window:
                vb = queue.pop(0)
                batch[vb] = streams[vb]
                if not cross:
                    node[vb] = {}
            if batch:
                consumer.add_streams(batch)
                open_.update(batch)

        try:
            open_more()
            for events in consumer.batches(tick=1.0):
                for ev in events:
                    kind = ev[EV_KIND]
                    if kind == MUTATION or kind == DELETION or kind == EXPIRATION:
                        seen += 1
                        vb = ev[EV_VBUCKET]
                        if ev[EV_SEQNO] <= ends[vb]:
                            key = bytes(ev[EV_KEY])
                            if cross:
                                vb = vbucket_of(split_doc_key(key)[1], task.archive_vbuckets)
                                if vb not in node:
                                    continue
                            node[vb][key] = (ev[EV_REV_SEQNO], ev[EV_CAS], kind != MUTATION)
                if counted:
                    n = min(seen - node_done, node_work - node_done)
                    node_done += n
                    progress.add(n)
                if not cross:
                    live = consumer.session.streams
                    ended = [vb for vb in open_ if vb in live and live[vb].finished]
                    for vb in sorted(ended):
                        open_.discard(vb)
                        out.append(_vbucket_result(task, plan[vb], node.pop(vb)))
                    if ended:
                        open_more()
        finally:
            consumer.close()
    progress.add(node_work - node_done)
    done = {r["vbucket"] for r in out}
    for vb in sorted(plan):
        if vb not in done:
            out.append(_vbucket_result(task, plan[vb], node.pop(vb, {})))
    out.sort(key=lambda r: r["vbucket"])
    return out


def _vbucket_result(task: CompareTask, p: VBucketComparePlan,
                    nside: dict[bytes, tuple]) -> dict[str, Any]:
    """One vbucket compared: the archive's side resolved, both sides summarised, the first
    differing keys when they differ."""
    archive = task.archive
    recs, _owners = resolve_parts([(bid, backup_path(archive.path, bid), e)
                                   for bid, e in p.parts], key=archive.key)
    arch = {}
    for r in recs:
        if r[0] == REC_MUTATION:
            arch[r[7]] = (r[2], r[3], False)
        else:
            arch[r[4]] = (r[2], r[3], True)
    del recs
    a_sum = summarise(arch)
    n_sum = summarise(nside)
    res = {"vbucket": p.vbucket, "end_seqno": p.end_seqno, "node_high_seqno": p.node_high,
           "archive": a_sum, "node": n_sum, "match": a_sum == n_sum, "differences": [],
           "notes": list(p.notes)}
    if not res["match"]:
        res["differences"] = compare_states(arch, nside, task.max_keys)
    progress.add(parts_records(p.parts))
    return res


@dataclass
class CompareReport:
    archive: str
    node: str
    backup: str
    vbuckets: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def differing(self) -> list[dict[str, Any]]:
        return [v for v in self.vbuckets if not v["match"]]

    @property
    def ok(self) -> bool:
        return not self.differing

    def to_json(self) -> dict[str, Any]:
        return {"archive": self.archive, "node": self.node, "backup": self.backup,
                "ok": self.ok, "vbuckets_compared": len(self.vbuckets),
                "vbuckets_differing": [v["vbucket"] for v in self.differing],
                "keys_archive": sum(v["archive"]["count"] for v in self.vbuckets),
                "keys_node": sum(v["node"]["count"] for v in self.vbuckets),
                "vbuckets": self.vbuckets, "notes": self.notes,
                "seconds": round(self.seconds, 3)}


def run_verify_against(archive_path: Archive | str | os.PathLike[str], opts, *,
                       backup: str | None = None,
                       vbuckets: list[int] | None = None, partitions: int | None = None,
                       master: str | None = None, max_keys: int = 5,
                       spark=None) -> CompareReport:
    from .nodeinfo import cluster_state

    t0 = time.monotonic()
    archive = Archive.opened(archive_path)
    manifests = archive.manifests()
    if not manifests:
        raise UsageError(f"archive {archive.path} holds no committed backup to compare")
    chain = archive.chain_ids(manifests, backup)
    parts, last_entry = _chain_entries(manifests, chain, vbuckets)
    # over collections connections (a legacy one gets the default collection's high
    # seqnos); on a member of a cluster, each vbucket's from its active member
    count, highs, logs, members = cluster_state(opts)
    # a node of another vbucket count (the archive restored into it): its seqnos and
    # vbuckets say nothing of the archive's; documents are compared by key, all it holds
    cross = bool(count) and count != archive.vbucket_count
    report = CompareReport(str(archive.path), opts.address, chain[-1])
    node_streams: tuple[tuple[int, int], ...] = ()
    if cross:
        node_streams = tuple(sorted((vb, h) for vb, h in highs.items() if vb < count))
        report.notes.append(
            f"the node has {count} vbuckets and archive {archive.path} has "
            f"{archive.vbucket_count}: each archive vbucket was compared by key with every "
            f"document the node holds whose key maps to it")
    plan, other = _compare_plan(parts, last_entry, highs, logs, cross)
    if plan:
        spark = spark or get_context(master)  # RDD jobs: no session needed
        check_executors_see(spark, archive.path, name="archive.json",
                            key_travels=archive.key is not None)
        # across vbucket counts each task reads all of the node's keys: fewer tasks
        n = partitions or (1 if cross else 2) * default_parallelism(spark)
        tasks = [CompareTask(o, archive.at(archive.path.absolute()),
                             f"dcptool-verify:{os.getpid()}:{i}", tuple(plan[vb] for vb in g),
                             max_keys, node_streams=node_streams,
                             archive_vbuckets=archive.vbucket_count if cross else 0)
                 for i, (o, g) in enumerate(_task_groups(opts, plan, members, n, cross))]
        try:
            # (the archive is only read: the bar counts tasks for a master that is not local)
            results = run_tasks(spark, reporting_failures(compare_task), tasks,
                                total=sum(task_work(t) for t in tasks))
        except Exception as exc:
            raise task_failure(exc, "verify task", None) from None
        for r in results:
            report.vbuckets.extend(r)
        report.vbuckets.sort(key=lambda v: v["vbucket"])
        _explain(report, plan, other, last_entry, cross, count, archive.vbucket_count)
    else:
        report.notes.append("the archive holds no vbucket to compare")
    report.seconds = time.monotonic() - t0
    return report


def _task_groups(opts, plan: dict[int, Any], members: dict[str, list[int]] | None, n: int,
                 cross: bool) -> list[tuple[Any, list[int]]]:
    """(connection options, vbuckets) of each task: on a member of a cluster, the
    vbuckets of each member where they are active, read from that member (a vbucket
    active nowhere, from the node named); on a node alone, or compared by key across
    vbucket counts, everything from the node named."""
    if members is None or cross:
        return [(opts, g) for g in plan_groups(sorted(plan), n)]
    from .nodeinfo import node_opts

    placed = {vb: address for address, vbs in members.items() for vb in vbs}
    by_member: dict[str | None, list[int]] = {}
    for vb in sorted(plan):
        by_member.setdefault(placed.get(vb), []).append(vb)
    each = max(1, n // len(by_member))
    return [(opts if address is None else node_opts(opts, address), g)
            for address, vbs in sorted(by_member.items(), key=lambda kv: kv[0] or "")
            for g in plan_groups(vbs, each)]


def _chain_entries(manifests: dict, chain: list[str], vbuckets: list[int] | None
                   ) -> tuple[dict[int, list], dict[int, dict]]:
    """Each vbucket's (backup id, manifest entry) pairs along the chain, oldest first, and
    its last entry (restricted to `vbuckets` when given)."""
    parts: dict[int, list] = {}
    last_entry: dict[int, dict] = {}
    for bid in chain:
        for e in manifests[bid]["vbuckets"]:
            if vbuckets is not None and e["vbucket"] not in vbuckets:
                continue
            parts.setdefault(e["vbucket"], []).append((bid, e))
            last_entry[e["vbucket"]] = e
    return parts, last_entry


def _compare_plan(parts: dict[int, list], last_entry: dict[int, dict], highs: dict[int, int],
                  logs: dict, cross: bool) -> tuple[dict[int, VBucketComparePlan], set[int]]:
    """What to compare of each vbucket, and the vbuckets whose history on the node is not
    the archive's.

    A vbucket's history is another when the archive's vbucket uuid is not in the node's
    failover log (a node the archive was restored into, or another node). Its seqnos say
    nothing about the archive's, so all of the node's documents are compared, and only a
    vbucket that differs says so."""
    plan: dict[int, VBucketComparePlan] = {}
    other: set[int] = set()
    for vb, ps in sorted(parts.items()):
        end = last_entry[vb]["end"]
        notes = []
        if cross:
            other.add(vb)
            high = upto = 0
        elif vb not in highs:
            notes.append("the node does not hold this vbucket as active")
            high = upto = 0
        else:
            high = highs[vb]
            log = logs.get(vb, ())
            if end["seqno"] and not any(u == end["uuid"] for u, _s in log):
                other.add(vb)
                upto = high
            else:
                upto = min(end["seqno"], high)
                if high < end["seqno"]:  # the same history, shorter: that means something
                    notes.append(f"the node's high seqno {high} is below the archive's "
                                 f"{end['seqno']} (the node lost data, or rolled back)")
        plan[vb] = VBucketComparePlan(vb, tuple(ps), end["seqno"], high, upto, tuple(notes))
    return plan, other


def _explain(report: CompareReport, plan: dict[int, VBucketComparePlan], other: set[int],
             last_entry: dict[int, dict], cross: bool, count: int,
             archive_vbuckets: int) -> None:
    """Each compared vbucket's history, the seqno it was compared to, and why a vbucket of
    another history differs."""
    for v in report.vbuckets:
        vb = v["vbucket"]
        v["history"] = "different" if vb in other else "same"
        v["compared_to_seqno"] = None if cross else plan[vb].stream_end
        if cross and not v["match"]:
            v["notes"].append(
                f"the node has {count} vbuckets, the archive {archive_vbuckets}: the "
                f"node's documents whose keys map to archive vbucket {vb} were compared, "
                f"changes made after the restore included")
        elif vb in other and not v["match"]:
            v["notes"].append(
                f"different history: the node's failover log does not hold the archive's "
                f"vbucket uuid {last_entry[vb]['end']['uuid']} (a restored or another "
                f"node), so every document it holds now was compared, changes made "
                f"after the restore included")


__all__ = ["run_verify_against", "CompareReport", "summarise", "entry_hash"]
