"""The vbucket position: the full offset a DCP stream resumes from.

A position is (vbucket uuid, seqno, snapshot start, snapshot end) plus the failover log
last received for the vbucket and a few recent snapshot ends (the points a rollback can
go back to). It is a value: every change makes a new one.

The rollback rule (pure, seed 000 "Client Flow" 2 and the fact sheet §8.3):
`Position.rolled_back(seqno)` moves to the latest known snapshot end at or below `seqno`
(or 0) and drops failover entries above it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

#: how many recent snapshot ends a position remembers as rollback points
MAX_SNAPSHOT_ENDS = 32


def thin_ends(ends: tuple[int, ...], cap: int = MAX_SNAPSHOT_ENDS) -> tuple[int, ...]:
    """Keep at most `cap` ends: the newest half dense, older ones every other one.

    So a long-running stream still knows some old rollback points, not only recent ones.
    """
    while len(ends) > cap:
        half = len(ends) // 2
        old, new = ends[:half], ends[half:]
        ends = old[1::2] + new if len(old) > 1 else new[-cap:]
    return ends


@dataclass(frozen=True, slots=True)
class Position:
    """Where a vbucket stream stands.

    `uuid` is the vbucket uuid valid for `seqno` (the newest failover-log entry
    received); `seqno` is the last seqno the consumer holds; `snap_start`/`snap_end`
    are the bounds of the snapshot `seqno` belongs to (equal to `seqno` once that
    snapshot was received completely). `failover_log` is newest first.
    `snapshot_ends` lists known complete snapshot ends, ascending (rollback points).
    """

    uuid: int = 0
    seqno: int = 0
    snap_start: int = 0
    snap_end: int = 0
    failover_log: tuple[tuple[int, int], ...] = ()
    snapshot_ends: tuple[int, ...] = field(default=())

    def __post_init__(self) -> None:
        if not (self.snap_start <= self.seqno <= self.snap_end):
            raise ValueError(f"position seqno {self.seqno} outside its snapshot "
                             f"[{self.snap_start}, {self.snap_end}]")

    @property
    def complete(self) -> bool:
        """True when the position is at a snapshot end (a consistent point)."""
        return self.seqno == self.snap_end

    @classmethod
    def at(cls, uuid: int, seqno: int, failover_log: Iterable[tuple[int, int]] = ()) -> "Position":
        """A consistent position at a snapshot end."""
        return cls(uuid, seqno, seqno, seqno, tuple(tuple(e) for e in failover_log),
                   (seqno,) if seqno else ())

    @classmethod
    def latest(cls, failover_log: Iterable[tuple[int, int]], high_seqno: int) -> "Position":
        """The position of a vbucket's current end: newest uuid, its high seqno ("now")."""
        log = tuple((int(u), int(s)) for u, s in failover_log)
        uuid = log[0][0] if log else 0
        return cls.at(uuid, high_seqno, log)

    def uuid_at(self, seqno: int) -> int:
        """The uuid of the newest failover entry at or below `seqno` (0 when none)."""
        for u, s in self.failover_log:
            if s <= seqno:
                return u
        return 0

    def rolled_back(self, rollback_seqno: int) -> "Position":
        """The position after the node asked to roll back to at most `rollback_seqno`.

        Goes to the latest known snapshot end at or below it (or 0), drops failover
        entries above that point, and takes the uuid of the newest entry that remains.
        """
        target = 0
        for end in self.snapshot_ends:
            if end <= rollback_seqno and end > target:
                target = end
        if self.complete and self.seqno <= rollback_seqno:
            target = max(target, self.seqno)
        return self.moved_to(target)

    def moved_to(self, seqno: int) -> "Position":
        """A consistent position at `seqno` (a snapshot end the consumer holds) with the
        failover entries above it dropped."""
        log = tuple((u, s) for u, s in self.failover_log if s <= seqno)
        uuid = log[0][0] if log else 0
        ends = tuple(e for e in self.snapshot_ends if e <= seqno)
        if seqno and (not ends or ends[-1] != seqno):
            ends = ends + (seqno,)
        return Position(uuid, seqno, seqno, seqno, log, ends)

    # ------------------------------------------------------------------ the archive's form

    @classmethod
    def from_archive(cls, pos: Any, failover_log: Iterable[Any] | None = ()) -> "Position":
        """The position an archive recorded (its ArchivePosition, or the JSON dict with uuid,
        seqno, snap_start and snap_end) with the failover log recorded beside it. A
        position on a snapshot end remembers that end as a rollback point."""
        if isinstance(pos, dict):
            uuid, seqno = int(pos["uuid"]), int(pos["seqno"])
            ss, se = int(pos["snap_start"]), int(pos["snap_end"])
        else:
            uuid, seqno, ss, se = int(pos.uuid), int(pos.seqno), int(pos.snap_start), int(pos.snap_end)
        log = tuple((int(u), int(s)) for u, s in (failover_log or ()))
        return cls(uuid, seqno, ss, se, log, (se,) if seqno == se and seqno else ())

    def to_archive(self) -> dict[str, int]:
        """The archive's form (as its manifests and writer take it): uuid, seqno,
        snap_start, snap_end."""
        return {"uuid": self.uuid, "seqno": self.seqno, "snap_start": self.snap_start,
                "snap_end": self.snap_end}

    # ------------------------------------------------------------------ persistence

    def to_dict(self) -> dict[str, Any]:
        return {
            "uuid": self.uuid,
            "seqno": self.seqno,
            "snap_start": self.snap_start,
            "snap_end": self.snap_end,
            "failover_log": [[u, s] for u, s in self.failover_log],
            "snapshot_ends": list(self.snapshot_ends),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Position":
        try:
            return cls(
                int(d.get("uuid", 0)), int(d["seqno"]),
                int(d.get("snap_start", d["seqno"])), int(d.get("snap_end", d["seqno"])),
                tuple((int(u), int(s)) for u, s in d.get("failover_log", ())),
                tuple(int(e) for e in d.get("snapshot_ends", ())),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"bad position {d!r}: {exc}") from None

    def __str__(self) -> str:
        return (f"uuid {self.uuid} seqno {self.seqno} snapshot [{self.snap_start}, "
                f"{self.snap_end}]")


ZERO = Position()
