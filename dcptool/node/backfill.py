"""Admission for disk backfills: at most `limit` hold a read transaction at once.

A backfill keeps a SQLite read transaction (its disk snapshot) open while it streams;
many at once would pin old WAL frames and compete for the disk, so streams queue here
and are woken in order as slots free up.
"""
from __future__ import annotations

from collections import deque
from typing import Callable


class BackfillManager:
    def __init__(self, limit: int = 8) -> None:
        self.limit = limit
        self.running = 0
        self.waiting: deque[Callable[[], None]] = deque()
        self.completed = 0

    def acquire(self, wake: Callable[[], None]) -> bool:
        """Take a slot, or queue `wake` to be called when one frees (then call again)."""
        if self.running < self.limit:
            self.running += 1
            return True
        if wake not in self.waiting:
            self.waiting.append(wake)
        return False

    def cancel(self, wake: Callable[[], None]) -> None:
        try:
            self.waiting.remove(wake)
        except ValueError:
            pass

    def release(self) -> None:
        self.running -= 1
        self.completed += 1
        if self.waiting and self.running < self.limit:
            self.waiting.popleft()()
