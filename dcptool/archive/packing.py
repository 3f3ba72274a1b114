"""Packs: a backup task's small data files stored together, and their summaries in batches.

On object storage every object costs requests (a PUT to write, a GET to read), whatever its
size, and a backup of many vbuckets holding little data each is mostly small files: 1,024
vbuckets give 1,024 last segments of a few kilobytes and 1,024 done files. A `Packer`
(one per backup task on object storage) turns them into a few objects:

- the last segment of each vbucket (the one its writer closes with the end record), when it
  is smaller than storage.PART_BYTES, is appended to the task's current **pack**
  (``pack-TOKEN.mpk.zst``) instead of being written as a file of its own; its file entry
  in the summary gets ``"pack"`` (the pack's name) and ``"offset"`` (where it starts);
- the vbucket's summary waits for the pack: once the pack holds PACK_BYTES, and when the
  task ends, the pack is written, then every other upload of the task is waited for, then
  one **done batch** (``done-TIME-TOKEN.json``, TOKEN the pack's) holds the summaries of
  all the vbuckets finished since the last batch.

A member of a pack is byte for byte the file it would have been (header record, frames,
sealed in an encrypted archive under its own name), so readers only need its location
(`format.entry_location`). Everything else is as with separate files: segments that fill
up (segment_bytes) or that a rollback closes are written on their own; a vbucket is
complete in a partial backup when the newest batch naming it is there and its files match
(recovery.done_summaries); the manifest, written last, lists the members with their packs.
"""
from __future__ import annotations

import secrets
from typing import Any

from . import storage
from .format import atomic_write_json, backup_id_for, batch_name, pack_name, utc_now

#: a pack is written once it holds this much (it may end up to PART_BYTES larger)
PACK_BYTES = 8 << 20

DONE_BATCH_FORMAT = "dcptool-done-batch"


class Packer:
    """Collects the last segments and the summaries of one task's vbuckets (see module doc).

    `sync`: write packs and batches durably at once (False: in the background; the task
    calls `flush()` and then sync_filesystem before it reports its vbuckets done)."""

    def __init__(self, backup_dir: Any, *, sync: bool = False, key: Any = None):
        self.dir = storage.location(backup_dir)
        self.key = key  # the archive's data key (None: plain): done batches are sealed
        self.sync = bool(sync)
        self._new()
        self.packs_written = 0
        self.batches_written = 0

    def _new(self) -> None:
        self.token = secrets.token_hex(8)
        self._buf = bytearray()
        self._dones: list[dict[str, Any]] = []

    @property
    def pending(self) -> int:
        """Summaries waiting for the next batch."""
        return len(self._dones)

    def add(self, entry: dict[str, Any], data: bytes) -> None:
        """Store a data file's bytes in the current pack; `entry` (its file entry in the
        vbucket's summary) learns the pack and the offset."""
        entry["pack"] = pack_name(self.token)
        entry["offset"] = len(self._buf)
        self._buf += data

    def done(self, summary: dict[str, Any]) -> None:
        """A vbucket finished: its summary goes into the next batch."""
        self._dones.append(summary)
        if len(self._buf) >= PACK_BYTES:
            self.flush()

    def flush(self) -> None:
        """Write the pack, wait for the task's other uploads (segments written on their
        own), then the batch of the summaries waiting: a batch is never there before the
        files it names."""
        if not self._dones and not self._buf:
            return
        name = pack_name(self.token)
        if self._buf:
            out = storage.write_new(self.dir / name)
            out.write(bytes(self._buf))
            out.close(self.sync)
            self.packs_written += 1
        if storage.store_of(self.dir).deferred_uploads:
            storage.wait_uploads()
        batch = {"format": DONE_BATCH_FORMAT, "pack": name if self._buf else None,
                 "vbuckets": self._dones}
        atomic_write_json(self.dir / batch_name(backup_id_for(utc_now()), self.token), batch,
                          key=self.key,
                          durable=self.sync)
        self.batches_written += 1
        self._new()


__all__ = ["Packer", "PACK_BYTES", "DONE_BATCH_FORMAT"]
