"""`dcptool backup --continuous --json` as a process of its own, for the tests of continuous
backups: its JSON lines and stderr as they come, and waits on its checkpoints."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from datetime import datetime


def epoch(iso: str) -> float:
    """An ISO 8601 time of dcptool's (`...Z`) as seconds since the epoch."""
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


class ContinuousRun:
    """A running `dcptool ... --json` command (`argv`, started in a session of its own)."""

    def __init__(self, argv: list[str], env: dict[str, str]):
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.records: list[dict] = []
        self.err: list[str] = []
        self._threads = [threading.Thread(target=self._read, args=(s, out), daemon=True)
                         for s, out in ((self.proc.stdout, True), (self.proc.stderr, False))]
        for t in self._threads:
            t.start()

    def _read(self, stream, out: bool) -> None:
        for line in stream:
            if out and line.strip():
                self.records.append(json.loads(line))
            elif not out:
                self.err.append(line.rstrip("\n"))

    def checkpoints(self) -> list[dict]:
        return [r for r in self.records if r.get("event") == "checkpoint"]

    def wait(self, pred, what: str, timeout: float = 120.0):
        """`pred()`'s first true value, while the process runs, within `timeout` s."""
        deadline = time.monotonic() + timeout
        while True:
            v = pred()
            if v:
                return v
            assert self.proc.poll() is None, "\n".join(self.err)
            assert time.monotonic() < deadline, f"{what}: {self.err}"
            time.sleep(0.1)

    def wait_checkpoints(self, n: int, timeout: float = 120.0) -> list[dict]:
        return self.wait(lambda: len(self.checkpoints()) >= n and self.checkpoints(),
                         f"no {n} checkpoints", timeout)

    def wait_caught_up(self, after: float, buckets=("default",), timeout: float = 60.0) -> dict:
        """The first checkpoint begun after `after` (epoch) that left nothing behind in
        any of `buckets`."""
        def caught():
            for r in self.checkpoints():
                if (epoch(r["time"]) - r["seconds"] > after
                        and all(r["lag"].get(b, {}).get("items") == 0 for b in buckets)):
                    return r
            return None
        return self.wait(caught, "not caught up", timeout)

    def interrupt(self, timeout: float = 120.0) -> int:
        self.proc.send_signal(signal.SIGINT)
        rc = self.proc.wait(timeout)
        for t in self._threads:
            t.join(10)
        return rc

    def kill9(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        for t in self._threads:
            t.join(10)


def assert_nothing_twice(archive) -> int:
    """Along the chain of the bucket archive `archive` (a path or URL) every vbucket's item
    seqnos strictly increase (nothing was written into the archive twice) and each backup
    starts where the one before it ended; the number of items."""
    from dcptool.archive import Archive

    a = Archive.open(archive)
    last: dict[int, int] = {}
    ends: dict[int, int] = {}
    n = 0
    for b in a.chain():
        for e in b.manifest["vbuckets"]:
            vb = e["vbucket"]
            if vb in ends and not e.get("rollbacks"):
                assert e["start"]["seqno"] == ends[vb], (b.id, vb)
            ends[vb] = e["end"]["seqno"]
            for rec in b.items(vb):
                assert rec[1] > last.get(vb, 0), (b.id, vb, rec[1], last.get(vb))
                last[vb] = rec[1]
                n += 1
    return n
