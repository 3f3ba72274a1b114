"""Admission for disk backfills: at most `limit` hold a read transaction at once.

A backfill keeps a SQLite read transaction (its disk snapshot) open while it streams;
many at once would pin old WAL frames and compete for the disk, so streams queue here
and are woken in order as slots free up. One connection may hold at most
`per_owner` slots, so a client that stops reading cannot keep every other connection's
backfills waiting.
"""
from __future__ import annotations

from collections import deque
from typing import Callable, Hashable


class BackfillManager:
    def __init__(self, limit: int = 8, per_owner: int | None = None) -> None:
        self.limit = limit
        self.per_owner = per_owner if per_owner is not None else max(1, limit // 2)
        self.running = 0
        self.owners: dict[Hashable, int] = {}
        self.waiting: deque[tuple[Hashable, Callable[[], None]]] = deque()
        self.completed = 0

    def acquire(self, wake: Callable[[], None], owner: Hashable = None) -> bool:
        """Take a slot, or queue `wake` to be called when one frees (then call again)."""
        if self.running < self.limit and self.owners.get(owner, 0) < self.per_owner:
            self.running += 1
            self.owners[owner] = self.owners.get(owner, 0) + 1
            return True
        if not any(w == wake for _, w in self.waiting):
            self.waiting.append((owner, wake))
        return False

    def cancel(self, wake: Callable[[], None]) -> None:
        for entry in list(self.waiting):
            if entry[1] == wake:
                self.waiting.remove(entry)

    def release(self, owner: Hashable = None) -> None:
        self.running -= 1
        self.completed += 1
        n = self.owners.get(owner, 0) - 1
        if n > 0:
            self.owners[owner] = n
        else:
            self.owners.pop(owner, None)
        if self.running >= self.limit:
            return
        for entry in self.waiting:
            if self.owners.get(entry[0], 0) < self.per_owner:
                self.waiting.remove(entry)
                entry[1]()
                return
