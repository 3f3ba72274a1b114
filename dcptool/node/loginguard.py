"""Slowing down repeated failed logins (KV SASL and REST basic auth).

Every failed login counts against the user name it gave and the client address it came
from. The first `FREE_FAILURES` failures in a row cost nothing; after that each one makes
the next attempt of that user and of that address wait `BASE_DELAY` seconds, doubling with
every further failure up to the node's `--auth-failure-delay`. An attempt is checked only
once the wait of both its user and its address has passed, so logins tried on many
connections at once are checked one after another rather than in parallel. A correct
login, once its wait is over, succeeds and clears both counts. A user or address with no
failure for `FORGET_AFTER` seconds starts again from zero; the table holds at most
`MAX_ENTRIES` names and addresses (the oldest are forgotten first).
"""
from __future__ import annotations

import time
from collections import OrderedDict

FREE_FAILURES = 3
BASE_DELAY = 0.25
FORGET_AFTER = 900.0
MAX_ENTRIES = 16384


class LoginGuard:
    def __init__(self, max_delay: float | None) -> None:
        self.max_delay = max_delay
        #: ("u", name) or ("a", address) -> [failures in a row, time of the last one,
        #: monotonic time before which the next attempt waits]
        self._entries: OrderedDict[tuple[str, str], list] = OrderedDict()
        #: attempts that had to wait
        self.delayed = 0

    def _keys(self, user: str | None, address: str | None):
        if user is not None:
            yield ("u", user[:256])
        if address:
            yield ("a", address)

    def wait(self, user: str | None, address: str | None, now: float | None = None) -> float:
        """Seconds the next attempt of `user` from `address` still has to wait (0: none)."""
        if self.max_delay is None or not self._entries:
            return 0.0
        now = time.monotonic() if now is None else now
        wait = 0.0
        for key in self._keys(user, address):
            e = self._entries.get(key)
            if e is not None and e[2] > now:
                wait = max(wait, e[2] - now)
        return wait

    def delay_for(self, failures: int) -> float:
        if self.max_delay is None or failures <= FREE_FAILURES:
            return 0.0
        return min(self.max_delay, BASE_DELAY * 2 ** min(failures - FREE_FAILURES - 1, 30))

    def failed(self, user: str | None, address: str | None,
               now: float | None = None) -> tuple[int, float]:
        """Count a failure; (failures in a row of the user or address, the delay it sets)."""
        now = time.monotonic() if now is None else now
        entries = self._entries
        worst_count, worst_delay = 0, 0.0
        for key in self._keys(user, address):
            e = entries.get(key)
            if e is None or now - e[1] > FORGET_AFTER:
                e = [0, now, now]
            e[0] += 1
            e[1] = now
            delay = self.delay_for(e[0])
            e[2] = max(e[2], now) + delay if delay else max(e[2], now)
            entries[key] = e
            entries.move_to_end(key)
            worst_count = max(worst_count, e[0])
            worst_delay = max(worst_delay, delay)
        while len(entries) > MAX_ENTRIES:
            entries.popitem(last=False)
        return worst_count, worst_delay

    def succeeded(self, user: str | None, address: str | None) -> None:
        for key in self._keys(user, address):
            self._entries.pop(key, None)
