"""The node's decisions as pure functions: no sockets, no clocks, no shared state.

Each function here is the rule a seed or the protocol fact sheet states, written so it
can be tested with the seeds' own numbers:

* `rollback_point`: how far a DCP client must roll back, from the failover log
  (fact sheet section 8.3, seeds 000 and 004).
* `evaluate_stream_request`: the order in which a stream request is checked and the
  seqno range the stream then serves (fact sheet section 8.1).
* `with_meta_wins`: revision-seqno conflict resolution for SET/DEL_WITH_META
  (fact sheet section 4.14).
* `absolute_expiry`: the memcached expiry convention (relative up to 30 days).
* `first_marker_start` / `memory_marker_start`: where snapshot markers begin (seed 003).
* `purge_bound` / `may_purge` / `hold_seconds`: how far the tombstone purger may go, from
  the high watermark table and the metadata purge age (seed 002).
* `takeover_step`: the order of a takeover stream's SET_VBUCKET_STATE handshake.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from dcptool.protocol.constants import SEQNO_MAX, Status, StreamFlag, VBucketState

#: relative expiry values up to this many seconds are offsets from now (memcached rule)
RELATIVE_EXPIRY_LIMIT = 30 * 24 * 3600

#: the stream flags a node knows; bits above are ignored (a real client sets some by mistake)
KNOWN_STREAM_FLAGS = 0x1FF

FailoverLog = Sequence[tuple[int, int]]  # (vbucket uuid, seqno), newest first


# ---------------------------------------------------------------------------
# rollback


def rollback_point(
    failover_log: FailoverLog,
    start: int,
    vb_uuid: int,
    snap_start: int,
    snap_end: int,
    high_seqno: int,
    purge_seqno: int = 0,
    *,
    strict_vb_uuid: bool = False,
    ignore_purged_tombstones: bool = False,
    client_purge_seqno: int = 0,
) -> int | None:
    """The seqno a client must roll back to, or None when it may resume where it is.

    `failover_log` is newest first. The steps are those of the fact sheet, section 8.3:

    1. start 0 never rolls back (unless StrictVbUuid with a non-zero uuid);
    2. a start (or snapshot start) below the purge seqno rolls back to 0 (not with
       IgnorePurgedTombstones): a client in the middle of a snapshot that began below the
       purge seqno may lack deletions the purger dropped;
    3. an unknown uuid rolls back to 0; a known one bounds the client's branch by the
       seqno of the next newer entry (or the high seqno when it is the newest);
    4. a client at the start of its snapshot has nothing of it; at the end it has all of
       it; the rollback point is the branch point, or the snapshot start when the branch
       point falls inside the client's partial snapshot.

    Seed 004: log [(X, 900), (W, 0)], client (W, 1000) -> 900; then (W, 900) -> None.
    """
    if start == 0 and (not strict_vb_uuid or vb_uuid == 0):
        return None
    local_purge = 0 if ignore_purged_tombstones else purge_seqno
    if start != 0 and min(start, snap_start) < local_purge and client_purge_seqno != local_purge:
        return 0
    upper = None
    for i, (uuid, _seqno) in enumerate(failover_log):
        if uuid == vb_uuid:
            upper = failover_log[i - 1][1] if i > 0 else high_seqno
            break
    if upper is None:
        return 0
    if start == snap_start:
        snap_end = start
    if snap_end <= upper:
        return None
    if start == snap_end:
        snap_start = start
    return upper if upper < snap_start else snap_start


# ---------------------------------------------------------------------------
# stream request


@dataclass(frozen=True, slots=True)
class VBucketView:
    """What a stream request needs to know about one vbucket (a snapshot, not the object)."""

    state: int
    high_seqno: int
    persisted_seqno: int
    purge_seqno: int
    failover_log: tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class StreamPlan:
    """An accepted stream: the range it serves and the position the client resumes from."""

    start: int
    end: int
    snap_start: int
    snap_end: int
    vb_uuid: int
    flags: int


@dataclass(frozen=True, slots=True)
class StreamDecision:
    """The answer to a stream request: a status, a rollback seqno or a plan."""

    status: int
    plan: StreamPlan | None = None
    rollback_seqno: int | None = None
    reason: str = ""


def evaluate_stream_request(
    vb: VBucketView | None,
    *,
    flags: int,
    start: int,
    end: int,
    vb_uuid: int,
    snap_start: int,
    snap_end: int,
    has_value: bool = False,
    noop_enabled: bool = True,
    wants_xattrs: bool = False,
    stream_ids_enabled: bool = False,
    stream_id: int | None = None,
    stream_exists: bool = False,
    client_purge_seqno: int = 0,
    filter_error: tuple[int, str] | None = None,
    filtered_high: int | None = None,
) -> StreamDecision:
    """Check a DCP_STREAM_REQ in the order of the fact sheet, section 8.1.

    `filter_error` is the (status, reason) the collections filter of the request value was
    refused with (dcptool.node.dcpfilter), judged at step 7; `filtered_high` the highest
    seqno of the filtered collections, the end of a ToLatest stream with a filter.

    Unknown high flag bits are ignored: libdcp writes its flags without byte swapping
    (0x30000000), and a node that failed such streams would break a real client.
    """
    flags &= KNOWN_STREAM_FLAGS
    # 0. validation
    if flags & StreamFlag.NO_VALUE:
        return StreamDecision(Status.EINVAL, reason="the NoValue stream flag was removed; use DCP_OPEN")
    if flags & StreamFlag.CACHE_TRANSFER and flags & ~(
            StreamFlag.CACHE_TRANSFER | StreamFlag.TAKEOVER | StreamFlag.ACTIVE_VB_ONLY):
        return StreamDecision(Status.EINVAL, reason="CacheTransfer combined with other flags")
    if has_value:
        return StreamDecision(Status.EINVAL, reason="a stream request value needs collections")
    if flags & StreamFlag.CACHE_TRANSFER:
        return StreamDecision(Status.NOT_SUPPORTED, reason="cache transfer is not supported")
    # 1, 2. the vbucket
    if vb is None:
        return StreamDecision(Status.NOT_MY_VBUCKET, reason="no such vbucket")
    if vb.state not in (VBucketState.ACTIVE, VBucketState.REPLICA):
        return StreamDecision(Status.NOT_MY_VBUCKET, reason="vbucket is neither active nor replica")
    if flags & (StreamFlag.ACTIVE_VB_ONLY | StreamFlag.TAKEOVER) \
            and vb.state != VBucketState.ACTIVE:
        return StreamDecision(Status.NOT_MY_VBUCKET, reason="vbucket is not active")
    # 3. FromLatest
    if flags & StreamFlag.FROM_LATEST:
        start = snap_start = snap_end = vb.high_seqno
        if vb_uuid == 0:
            vb_uuid = vb.failover_log[0][0]
    # 4. noop is mandatory for xattrs
    if wants_xattrs and not noop_enabled:
        return StreamDecision(Status.NOT_SUPPORTED, reason="enable noop before streaming xattrs")
    # 5, 6. ranges
    if start > end:
        return StreamDecision(Status.ERANGE, reason="start seqno is above end seqno")
    if not snap_start <= start <= snap_end:
        return StreamDecision(Status.ERANGE, reason="start seqno is outside the snapshot range")
    # 7. the collections filter, stream ids
    if filter_error is not None:
        return StreamDecision(filter_error[0], reason=filter_error[1])
    if stream_ids_enabled != (stream_id is not None):
        return StreamDecision(Status.DCP_STREAM_ID_INVALID,
                              reason="stream id present/absent does not match enable_stream_id")
    # 8. one stream per vbucket (and stream id)
    if stream_exists:
        return StreamDecision(Status.KEY_EEXISTS, reason="a stream for this vbucket already exists")
    # 9. rollback
    rb = rollback_point(
        vb.failover_log, start, vb_uuid, snap_start, snap_end, vb.high_seqno, vb.purge_seqno,
        strict_vb_uuid=bool(flags & StreamFlag.STRICT_VB_UUID),
        ignore_purged_tombstones=bool(flags & StreamFlag.IGNORE_PURGED_TOMBSTONES),
        client_purge_seqno=client_purge_seqno,
    )
    if rb is not None:
        return StreamDecision(Status.ROLLBACK, rollback_seqno=rb)
    # 10. ToLatest / DiskOnly
    if flags & StreamFlag.TO_LATEST:
        end = vb.high_seqno if filtered_high is None else filtered_high
    if flags & StreamFlag.DISK_ONLY:
        end = min(end, vb.persisted_seqno)
    if flags & StreamFlag.TAKEOVER:
        end = SEQNO_MAX  # a takeover stream ends with its handshake, not at a seqno
    if start > end:
        return StreamDecision(Status.ERANGE, reason="start seqno is above the adjusted end seqno")
    if start > vb.high_seqno:
        return StreamDecision(Status.ERANGE, reason="start seqno is above the vbucket's high seqno")
    return StreamDecision(Status.SUCCESS, plan=StreamPlan(start, end, snap_start, snap_end,
                                                          vb_uuid, flags))


# ---------------------------------------------------------------------------
# conflict resolution


def with_meta_wins(
    incoming: tuple[int, int, int, int],
    existing: tuple[int, int, int, int] | None,
    *,
    deletion: bool = False,
    incoming_xattr: bool = False,
    existing_xattr: bool = False,
) -> bool:
    """Does an incoming SET/DEL_WITH_META version beat the stored one (revision-seqno buckets)?

    Versions are (rev_seqno, cas, expiry, flags). A mutation compares the whole tuple
    lexicographically; an equal tuple wins only when it brings xattrs the stored one lacks.
    A deletion compares (rev_seqno, cas) and loses ties. No stored version: it wins.
    """
    if existing is None:
        return True
    if deletion:
        a, b = incoming[:2], existing[:2]
        return a > b
    if incoming > existing:
        return True
    if incoming < existing:
        return False
    return incoming_xattr and not existing_xattr


# ---------------------------------------------------------------------------
# expiry


def absolute_expiry(expiry: int, now: int) -> int:
    """The memcached convention: 0 never expires; up to 30 days is relative; above is absolute."""
    if expiry == 0:
        return 0
    if expiry <= RELATIVE_EXPIRY_LIMIT:
        return now + expiry
    return expiry


def is_expired(expiry: int, now: float) -> bool:
    return expiry != 0 and expiry <= now


# ---------------------------------------------------------------------------
# snapshot markers


def first_marker_start(request_start: int, first_seqno: int) -> int:
    """Start of the first snapshot marker of a stream served from memory.

    When the snapshot continues exactly where the client is, the marker starts at the
    client's seqno (seed 003: R1 asks from 0 and gets 0..100). When deduplication removed
    the seqnos in between, it starts at the first seqno sent (seed 003: A, B, A gives a
    client from 0 the marker 2..3).
    """
    if first_seqno == request_start + 1:
        return request_start
    return first_seqno


def stream_end_reached(snapshot_end: int, end_seqno: int) -> bool:
    """A stream ends after the complete snapshot containing its end seqno."""
    return end_seqno != SEQNO_MAX and snapshot_end >= end_seqno


# ---------------------------------------------------------------------------
# the tombstone purger and the high watermark table (seed 002)


@dataclass(frozen=True, slots=True)
class Watermark:
    """What the purger needs of one high watermark table row.

    `seqnos` maps vbucket -> the seqno up to which the client has everything (it needs
    no tombstone at or below it); vbuckets it does not name it does not hold back.
    `expires_at` is a Unix time; `lost` is set by the guard rail (see `hold_seconds`).
    """

    client: str
    seqnos: Mapping[int, int]
    expires_at: float
    lost: bool = False

    def live(self, now: float) -> bool:
        """Holds the purger back: neither expired nor lost."""
        return not self.lost and self.expires_at > now


@dataclass(frozen=True, slots=True)
class PurgeBound:
    """How far the purger may go in one vbucket.

    A tombstone may be purged when it was deleted at or before `before` (a Unix time) and
    its seqno is at or below `seqno` (None: no live watermark limits the seqno). `held_by`
    names the clients whose watermark is the bound (the slowest ones).
    """

    seqno: int | None
    before: float
    held_by: tuple[str, ...] = ()


def purge_bound(vbid: int, watermarks: Iterable[Watermark], *, now: float, purge_age: float,
                before: float | None = None) -> PurgeBound:
    """The purge bound of vbucket `vbid`.

    A tombstone is purgeable only when it is older than the metadata purge age **and** its
    seqno is at or below the lowest watermark of every live row for this vbucket. Expired
    and lost rows hold nothing back. `before` overrides the age cut-off (COMPACT_DB's
    purge_before_ts); the watermarks still apply.

    Seed 002: the purger has purged up to 1000 in vbucket 128; XDCR reported 2000 and a
    backup 3500; the purger may now go to 2000 and no further.
    """
    cut = now - purge_age if before is None else before
    low: int | None = None
    held: list[str] = []
    for w in watermarks:
        if not w.live(now):
            continue
        s = w.seqnos.get(vbid)
        if s is None:
            continue
        if low is None or s < low:
            low, held = s, [w.client]
        elif s == low:
            held.append(w.client)
    return PurgeBound(low, cut, tuple(held))


def may_purge(bound: PurgeBound, seqno: int, delete_time: float) -> bool:
    """May the tombstone (`seqno`, deleted at `delete_time`) be purged under `bound`?"""
    return delete_time <= bound.before and (bound.seqno is None or seqno <= bound.seqno)


def hold_seconds(watermark_seqno: int, tombstones: Iterable[tuple[int, float]],
                 before: float) -> float:
    """How long a watermark has kept the purger from a tombstone it could otherwise purge.

    `tombstones` are (seqno, delete time) of one vbucket; `before` is the age cut-off
    (now - purge age). Of the tombstones above the watermark that are old enough, the one
    deleted first has been purgeable for `before - delete_time` seconds: that is the hold.
    0 when the watermark keeps nothing back. A row whose hold passes --hwt-max-hold in any
    vbucket is marked lost (the replication-slot lesson: a stuck client must not keep
    every tombstone forever).
    """
    oldest = None
    for seqno, dt in tombstones:
        if seqno > watermark_seqno and dt <= before and (oldest is None or dt < oldest):
            oldest = dt
    return 0.0 if oldest is None else before - oldest


def is_lost(hold: float, max_hold: float | None) -> bool:
    """The guard rail: a hold longer than `max_hold` (None: no limit) loses the row."""
    return max_hold is not None and hold > max_hold


def purge_seqno_after(purge_seqno: int, purged: Iterable[int]) -> int:
    """The vbucket's purge seqno after purging tombstones with seqnos `purged`: the highest
    seqno of a purged tombstone (it never goes down)."""
    return max(purge_seqno, max(purged, default=0))


# ---------------------------------------------------------------------------
# takeover streams (a controlled vbucket move)

#: the phases of a takeover stream
TAKEOVER_SEND = "send"                   # backfill and memory, the vbucket still active
TAKEOVER_WAIT_PENDING = "wait-pending"   # SET_VBUCKET_STATE(pending) sent, nothing else
TAKEOVER_SEND_DEAD = "send-dead"         # the vbucket is dead here: the last items go out
TAKEOVER_WAIT_ACTIVE = "wait-active"     # SET_VBUCKET_STATE(active) sent
TAKEOVER_DONE = "done"                   # STREAM_END OK

#: what the stream does on a step
SEND_PENDING = "send SET_VBUCKET_STATE(pending)"
SET_DEAD = "set the vbucket dead"
SEND_ACTIVE = "send SET_VBUCKET_STATE(active)"
END_OK = "send STREAM_END(OK)"

#: events a takeover stream reacts to
CAUGHT_UP = "caught-up"   # everything the vbucket holds has been sent
ACKED = "acked"           # the consumer answered the SET_VBUCKET_STATE just sent


def takeover_step(phase: str, event: str) -> tuple[str, tuple[str, ...]]:
    """The next phase of a takeover stream and what to do, for one event.

    kv_engine's order: once the consumer has everything, the producer sends
    SET_VBUCKET_STATE(pending) and waits for the answer; then it makes its own vbucket
    dead (from then on writes there answer NOT_MY_VBUCKET, so nothing can be written that
    the stream would not carry), sends what was written meanwhile, sends
    SET_VBUCKET_STATE(active), waits for that answer and ends the stream with OK. The
    history does not branch: the consumer keeps the failover log it got (seeds 000/001,
    "controlled handover"). An event that does not fit the phase changes nothing.
    """
    if phase == TAKEOVER_SEND and event == CAUGHT_UP:
        return TAKEOVER_WAIT_PENDING, (SEND_PENDING,)
    if phase == TAKEOVER_WAIT_PENDING and event == ACKED:
        return TAKEOVER_SEND_DEAD, (SET_DEAD,)
    if phase == TAKEOVER_SEND_DEAD and event == CAUGHT_UP:
        return TAKEOVER_WAIT_ACTIVE, (SEND_ACTIVE,)
    if phase == TAKEOVER_WAIT_ACTIVE and event == ACKED:
        return TAKEOVER_DONE, (END_OK,)
    return phase, ()


def takeover_waits(phase: str) -> bool:
    """Does a takeover stream in `phase` wait for an answer (and send nothing)?"""
    return phase in (TAKEOVER_WAIT_PENDING, TAKEOVER_WAIT_ACTIVE, TAKEOVER_DONE)
