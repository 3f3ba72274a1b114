"""High watermark table replication and synchronized purgers (seed 002).

Seed 002, "Synchronized HWT replication": a replica must never hold a high watermark row
that is ahead of what it has replicated, or a client resuming on it after a failover
would start from a seqno the new active does not have and miss everything in between.
"Synchronized tombstone purgers": the purger of a replica never goes beyond the purger of
its source; with chain replication each hop never beyond the previous hop.

How the reference node does it. Every node that holds replica vbuckets runs one `HwtSync`
thread. Every `SYNC_INTERVAL` seconds, when its replication applied a new snapshot
(`kick`), and every `PENDING_RETRY` seconds while a row waits, it asks each source node
(the active of the vbucket, or the previous hop of a chain) HWT_LIST for the vbuckets it
replicates from it (`{"vbuckets": [...], "holding": false}`). The answer carries the
source's registered rows, the rows the source itself replicated (so a chain passes them
on hop by hop) and the source's purge seqno of each vbucket. Then, on the event loop and
per vbucket (`plan_install`):

* a source row whose seqno is at or below this node's **persisted** seqno of the vbucket
  is installed (`HighWatermarkTable.install`, one `ReplicatedRow` per name, instance and
  vbucket, written to the node's database);
* a source row that is ahead stays **pending** (listed by HWT_LIST under "pending"); the
  row installed before for the same client, if any, stays until replication catches up;
* a replicated row the source no longer has goes (removed, expired and dropped there);
* the source's purge seqno becomes the vbucket's purge cap (`purge_cap`): the purger of a
  replica vbucket never passes it, and purges nothing while it is unknown (after a start,
  before the first answer, or when the source changed).

After a failover the promoted node keeps its replicated rows (they hold its purger back
as registered rows do), so a client that registered on the old active resumes from its
watermark on the new one. A replica rolled back below an installed row drops it at the
next sync. A controlled move does the same once (`adopt`, called at the end of a
takeover): the new active installs the old active's rows of the vbucket.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Iterable, Protocol

from dcptool.protocol.constants import VBucketState

from .hwt import ReplicatedRow
from dcptool.logsafe import shown

if TYPE_CHECKING:
    from .clustermap import ClusterMap

log = logging.getLogger("dcptool.node.hwtrepl")

_REPLICA = int(VBucketState.REPLICA)
#: seconds between two syncs with nothing happening
SYNC_INTERVAL = 1.0
#: seconds between syncs while a source row waits for replication to catch up
PENDING_RETRY = 0.2
#: the shortest time between two syncs (kicks from replication come with every snapshot)
MIN_GAP = 0.05


# ---------------------------------------------------------------------------
# decisions (pure)


def offered_rows(answer: dict[str, Any], vbuckets: Iterable[int], source: str, now: float
                 ) -> dict[int, dict[tuple[str, str], ReplicatedRow]]:
    """Per vbucket, the rows a source's HWT_LIST answer offers: its registered rows naming
    the vbucket and the rows it replicated itself. When both name the same client the
    lower seqno wins (it holds back more)."""
    want = set(vbuckets)
    out: dict[int, dict[tuple[str, str], ReplicatedRow]] = {vb: {} for vb in want}

    def offer(r: ReplicatedRow) -> None:
        cur = out[r.vb].get((r.name, r.instance))
        if cur is None or r.seqno < cur.seqno:
            out[r.vb][(r.name, r.instance)] = r

    for e in answer.get("entries") or ():
        for vb_s, seqno in (e.get("vbuckets") or {}).items():
            vb = int(vb_s)
            if vb in want:
                offer(ReplicatedRow(e["name"], e["instance"], vb, int(seqno),
                                    float(e["reported_at"]), float(e["expires_at"]),
                                    dict(e.get("meta") or {}), e.get("lost_at"),
                                    e.get("lost_reason"), source, now))
    for r in answer.get("replicated") or ():
        vb = int(r["vbucket"])
        if vb in want:
            offer(ReplicatedRow(r["name"], r["instance"], vb, int(r["seqno"]),
                                float(r["reported_at"]), float(r["expires_at"]),
                                dict(r.get("meta") or {}), r.get("lost_at"),
                                r.get("lost_reason"), source, now))
    return out


def plan_install(current: dict[tuple[str, str], ReplicatedRow],
                 offered: dict[tuple[str, str], ReplicatedRow], persisted: int
                 ) -> tuple[dict[tuple[str, str], ReplicatedRow], list[ReplicatedRow]]:
    """(rows to hold for one vbucket, rows pending) given the rows held now, the rows the
    source offers and this node's persisted seqno of the vbucket.

    Seed 002's example: the local replication is at 1024, XDCR registered 2048 on the
    active: the row is not installed (pending); an earlier row of XDCR at 1000 stays;
    once the replica persisted 2048 the row is installed."""
    install: dict[tuple[str, str], ReplicatedRow] = {}
    pending: list[ReplicatedRow] = []
    for k, r in offered.items():
        if r.seqno <= persisted:
            install[k] = r
            continue
        pending.append(r)
        old = current.get(k)
        if old is not None and old.seqno <= persisted:
            install[k] = old
    return install, pending


def purge_cap(is_replica: bool, known: tuple[str, int] | None) -> int | None:
    """The highest seqno the purger of a vbucket may reach because of its source: None
    (no cap) for a vbucket that is not a replica; the purge seqno its current source
    last reported (`on_map` forgets what another source said); 0 when none is known."""
    if not is_replica:
        return None
    if known is None:
        return 0
    return known[1]


# ---------------------------------------------------------------------------
# the node's side


class Replicating(Protocol):
    """What the watermark replication needs of the node's replication
    (`replication.Replication`): the bucket, the cluster map it follows, its event loop,
    and where it keeps the running sync."""

    bucket: Any
    map: "ClusterMap | None"
    loop: asyncio.AbstractEventLoop | None
    hwt_sync: "HwtSync | None"


class _Stopped(Exception):
    pass


def source_of(repl: Replicating, vb: int) -> str | None:
    """HOST:PORT of the node vbucket `vb` replicates from on this node (None: none)."""
    cmap = repl.map
    if cmap is None:
        return None
    src = cmap.source(vb)
    if src is None:
        return None
    host, port = cmap.address(src)
    return f"{host}:{port}"


class HwtSync(threading.Thread):
    """Pulls the HWT rows and purge seqnos of this node's replica vbuckets from their
    sources (see the module documentation)."""

    def __init__(self, repl: Replicating) -> None:
        super().__init__(name="dcptool-hwt-sync", daemon=True)
        self.repl = repl
        self.cond = threading.Condition()
        self.kicked = True
        self.stopping = False
        self.syncs = 0
        self.last_sync: float | None = None
        self.errors: dict[str, str] = {}
        self._conns: dict[str, Any] = {}

    # -- control (any thread) -------------------------------------------------------

    def kick(self) -> None:
        with self.cond:
            self.kicked = True
            self.cond.notify_all()

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()

    # -- the thread ------------------------------------------------------------------

    def run(self) -> None:
        try:
            while not self.stopping:
                with self.cond:
                    if not self.kicked:
                        wait = PENDING_RETRY if self.repl.bucket.hwt.pending else SYNC_INTERVAL
                        self.cond.wait(wait)
                    self.kicked = False
                if self.stopping:
                    break
                try:
                    self.sync_once()
                except _Stopped:
                    break
                except Exception as exc:  # keep syncing; say why it failed
                    log.warning("HWT sync failed: %s: %s", type(exc).__name__, exc)
                time.sleep(MIN_GAP)
        finally:
            for c in self._conns.values():
                try:
                    c.close()
                except OSError:
                    pass
            self._conns.clear()

    def _on_loop(self, fn, *args):
        loop = self.repl.loop
        if self.stopping or loop is None or loop.is_closed():
            raise _Stopped()

        async def call():
            return fn(*args)
        fut = asyncio.run_coroutine_threadsafe(call(), loop)
        while True:
            try:
                return fut.result(0.5)
            except TimeoutError:
                if self.stopping or not loop.is_running():
                    fut.cancel()
                    raise _Stopped() from None

    def sync_once(self) -> None:
        groups = self._on_loop(self._groups)
        for address, vbs in sorted(groups.items()):
            try:
                answer = self._fetch(address, vbs)
            except Exception as exc:  # unreachable or restarting source: try again later
                self.errors[address] = f"{type(exc).__name__}: {exc}"
                c = self._conns.pop(address, None)
                if c is not None:
                    try:
                        c.close()
                    except OSError:
                        pass
                continue
            self.errors.pop(address, None)
            self._on_loop(self._install, address, vbs, answer)
        self.syncs += 1
        self.last_sync = time.time()

    def _groups(self) -> dict[str, list[int]]:
        """{source address: [replica vbuckets fed from it]} (on the loop)."""
        out: dict[str, list[int]] = {}
        for vbid, vb in self.repl.bucket.vbuckets.items():
            if vb.state != _REPLICA:
                continue
            src = source_of(self.repl, vbid)
            if src is not None:
                out.setdefault(src, []).append(vbid)
        return out

    def _fetch(self, address: str, vbs: list[int]) -> dict[str, Any]:
        from dcptool.client.connection import Connection
        from dcptool.client.watermark import WatermarkUnsupported, get_purge_seqnos, list_watermarks

        conn = self._conns.get(address)
        if conn is None:
            cmap = self.repl.map
            auth = cmap.auth if cmap is not None else {}
            host, _, port = address.rpartition(":")
            conn = Connection.open(host.strip("[]"), int(port),
                                   username=auth.get("username", ""),
                                   password=auth.get("password", ""),
                                   bucket=self.repl.bucket.name, timeout=5.0,
                                   agent="dcptool-node/hwt-sync")
            self._conns[address] = conn
        try:
            return list_watermarks(conn, vbuckets=vbs, holding=False)
        except WatermarkUnsupported:
            # a source without the table: no rows, but its purger still bounds ours
            purge = get_purge_seqnos(conn)
            return {"entries": [], "replicated": [],
                    "purge_seqnos": {str(vb): purge.get(vb, 0) for vb in vbs}}

    def _install(self, address: str, vbs: list[int], answer: dict[str, Any]) -> None:
        """Install what `address` answered (on the loop)."""
        bucket = self.repl.bucket
        hwt = bucket.hwt
        now = time.time()
        offered = offered_rows(answer, vbs, address, now)
        purge = answer.get("purge_seqnos") or {}
        for vbid in vbs:
            vb = bucket.vbuckets.get(vbid)
            # the map may have changed while we asked
            if vb is None or vb.state != _REPLICA or source_of(self.repl, vbid) != address:
                continue
            current = {(r.name, r.instance): r for r in hwt.replicated.values() if r.vb == vbid}
            rows, pending = plan_install(current, offered[vbid], vb.persisted_seqno)
            hwt.install(vbid, rows)
            if pending:
                hwt.pending[vbid] = [{"name": r.name, "instance": r.instance, "seqno": r.seqno,
                                      "persisted_seqno": vb.persisted_seqno, "source": address}
                                     for r in pending]
            else:
                hwt.pending.pop(vbid, None)
            if str(vbid) in purge:
                hwt.source_purge[vbid] = (address, int(purge[str(vbid)]))

    def status(self) -> dict[str, Any]:
        return {"syncs": self.syncs, "last_sync": self.last_sync, "errors": dict(self.errors)}


# ---------------------------------------------------------------------------
# hooks called by replication


def on_map(repl: Replicating) -> None:
    """After a cluster map was applied (on the loop): forget what other sources said,
    start the sync thread when this node holds replica vbuckets, and sync now."""
    hwt = repl.bucket.hwt
    for vbid in list(hwt.source_purge):
        vb = repl.bucket.vbuckets.get(vbid)
        if vb is None or vb.state != _REPLICA or source_of(repl, vbid) != hwt.source_purge[vbid][0]:
            del hwt.source_purge[vbid]
    for vbid in list(hwt.pending):
        vb = repl.bucket.vbuckets.get(vbid)
        if vb is None or vb.state != _REPLICA:
            del hwt.pending[vbid]
    sync = getattr(repl, "hwt_sync", None)
    if sync is None:
        if not any(vb.state == _REPLICA for vb in repl.bucket.vbuckets.values()):
            return
        sync = repl.hwt_sync = HwtSync(repl)
        sync.start()
    sync.kick()


def kick(repl: Replicating) -> None:
    """Replication applied a snapshot: sync soon (a pending row may now be installable)."""
    sync = getattr(repl, "hwt_sync", None)
    if sync is not None:
        sync.kick()


async def stop(repl: Replicating) -> None:
    sync = getattr(repl, "hwt_sync", None)
    if sync is None:
        return
    repl.hwt_sync = None
    sync.stop()
    await asyncio.get_running_loop().run_in_executor(None, sync.join, 10.0)


async def adopt(node, vbid: int, address: tuple[str, int], auth: dict[str, str], *,
                timeout: float = 30.0, bucket=None) -> int:
    """After a takeover of `vbid` from `address` (a controlled move): install the old
    active's rows of the vbucket here, as a replica would have, so the purger of the new
    active keeps what the clients of the old one registered. Rows are installed once this
    node has persisted the vbucket up to them (waiting at most `timeout` seconds). Never
    raises: a row that cannot be fetched only means the purger does not wait for it.
    Returns how many rows were installed."""
    from dcptool.client.connection import Connection
    from dcptool.client.watermark import WatermarkUnsupported, list_watermarks

    loop = asyncio.get_running_loop()
    bucket = node.bucket if bucket is None else bucket
    source = f"{address[0]}:{address[1]}"

    def fetch() -> dict[str, Any]:
        conn = Connection.open(address[0], address[1], username=auth.get("username", ""),
                               password=auth.get("password", ""), bucket=bucket.name,
                               timeout=5.0, agent="dcptool-node/hwt-takeover")
        try:
            return list_watermarks(conn, vbuckets=[vbid], holding=False)
        finally:
            conn.close()

    try:
        answer = await loop.run_in_executor(None, fetch)
    except WatermarkUnsupported:
        return 0
    except Exception as exc:  # the old active went away: nothing to take
        log.warning("vbucket %d: the HWT rows of %s could not be read after the takeover: "
                    "%s", vbid, source, exc)
        return 0
    offered = offered_rows(answer, [vbid], source, time.time())[vbid]
    vb = bucket.vbuckets[vbid]
    top = max((r.seqno for r in offered.values()), default=0)
    deadline = time.monotonic() + timeout
    while vb.persisted_seqno < min(top, vb.high_seqno) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    hwt = bucket.hwt
    current = {(r.name, r.instance): r for r in hwt.replicated.values() if r.vb == vbid}
    rows, pending = plan_install(current, offered, vb.persisted_seqno)
    for r in pending:
        log.warning("vbucket %d: HWT row %s at %d is ahead of this node (persisted %d) and "
                    "was not taken", vbid, shown(r.client), r.seqno, vb.persisted_seqno)
    hwt.install(vbid, rows)
    return len(rows)
