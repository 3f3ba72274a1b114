"""A cluster archive: every bucket of a cluster, each in a bucket archive of its own, and
what each backup run recorded about the cluster (docs/archive-format.md, "Cluster
archives").

    ARCHIVE/
      archive.json        {"format": "dcptool-cluster-archive", "version": 1, "uuid", ...}
      lock                held by a cluster backup run for the whole run
      keys/               only when encrypted: the passphrase's key files
      buckets/NAME/       one bucket archive (the bucket format) per bucket ever backed up
      runs/RUN-ID.json    one per committed run: the buckets' backups, settings, users

A bucket archive is a complete archive: `dcptool info ARCHIVE/buckets/NAME` reads it
alone, and its chain is incremental on its own. A run's file is written last, after every
bucket's backup of the run committed: a run without its file (killed) left committed or
partial bucket backups that the next run continues, as a bucket archive's own partial
backups are continued. Run files hold password hashes (as the cluster exports them for
backup, never a plain password): in an encrypted archive they are sealed under the
cluster archive's data key.
"""
from __future__ import annotations

import json
import re
import uuid as uuidlib
from datetime import timedelta
from typing import Any

from . import crypto, storage
from .archive import Archive, made_by_either
from .errors import ArchiveError, ArchiveExistsError, NotAnArchiveError
from .format import (
    ARCHIVE_JSON,
    CLUSTER_FORMAT_NAME,
    DIR_MODE,
    FILE_MODE,
    backup_id_for,
    iso_time,
    json_lines,
    make_dir,
    parse_backup_id,
    read_json,
    utc_now,
)
from .lock import ArchiveLock

CLUSTER_FORMAT = CLUSTER_FORMAT_NAME
CLUSTER_VERSION = 1
BUCKETS_DIR = "buckets"
RUNS_DIR = "runs"

#: Couchbase Server's rule for bucket names (letters, digits, ".", "%", "_", "-"; at most
#: 100), and dcptool's: not starting with "." (a bucket name is a directory's name here)
BUCKET_NAME_RE = re.compile(r"[A-Za-z0-9_%\-][A-Za-z0-9._%\-]{0,99}")
RUN_ID_RE = re.compile(r"\d{8}T\d{6}\.\d{6}Z")


def check_bucket_name(name: str) -> str:
    if not isinstance(name, str) or not BUCKET_NAME_RE.fullmatch(name):
        raise ArchiveError(f"{name!r} is not a bucket name (letters, digits, '.', '%', '_' "
                           "and '-', at most 100, not starting with '.')")
    return name


def _meta_of(path: Any) -> dict[str, Any] | None:
    try:
        meta = read_json(storage.location(path) / ARCHIVE_JSON)
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def archive_kind(path: Any) -> str | None:
    """'cluster' or 'bucket' for the archive at `path` by what its archive.json says,
    None where there is none (or it is no dcptool archive)."""
    return _kind(_meta_of(path))


def _kind(meta: dict[str, Any] | None) -> str | None:
    if meta is None:
        return None
    return {CLUSTER_FORMAT: "cluster", "dcptool-archive": "bucket"}.get(meta.get("format"))


def bucket_of_archive(path: Any) -> str | None:
    """The bucket a bucket archive at `path` holds, by its archive.json (None: no bucket
    archive there)."""
    meta = _meta_of(path)
    if meta is None or _kind(meta) != "bucket":
        return None
    bucket = meta.get("bucket")
    return bucket if isinstance(bucket, str) else None


class ClusterArchive:
    """An opened cluster archive: its location, what its archive.json says and, when it is
    encrypted, its data key and the passphrase that opened it (its bucket archives open
    with the same passphrase)."""

    def __init__(self, path: Any, meta: dict[str, Any], key: crypto.DataKey | None = None,
                 passphrase: str | None = None) -> None:
        self.path = storage.location(path)
        self.meta = meta
        self.key = key
        self._passphrase = passphrase

    def __repr__(self) -> str:
        return f"ClusterArchive({str(self.path)!r})"

    @property
    def uuid(self) -> str:
        return self.meta["uuid"]

    @property
    def passphrase(self) -> str | None:
        """What its bucket archives open with (None: not encrypted). Not in its repr."""
        return self._passphrase

    @property
    def encrypted(self) -> bool:
        return self.key is not None

    # -- creating and opening ---------------------------------------------------------------

    @classmethod
    def create(cls, path: Any, *, passphrase: str | None = None,
               extra: dict[str, Any] | None = None) -> "ClusterArchive":
        """A new cluster archive at `path` (a new or empty directory or prefix);
        ArchiveExistsError when another run created one there first."""
        path = storage.location(path)
        try:
            names = storage.listdir(path)
        except FileNotFoundError:
            names = []
        except NotADirectoryError:
            raise ArchiveError(f"{path} exists and is not a directory") from None
        if ARCHIVE_JSON in names:
            raise ArchiveExistsError(f"{path} already holds an archive")
        if any(n not in (BUCKETS_DIR, RUNS_DIR, crypto.KEYS_DIR) and not n.startswith(".")
               for n in names):
            raise ArchiveError(f"{path} is not empty and is not an archive",
                               hint="choose a new or empty directory (or prefix)")
        made_by_either(lambda: storage.prepare_dir(path, DIR_MODE))
        made_by_either(lambda: make_dir(path / BUCKETS_DIR))
        made_by_either(lambda: make_dir(path / RUNS_DIR))
        meta: dict[str, Any] = {
            "format": CLUSTER_FORMAT,
            "version": CLUSTER_VERSION,
            "uuid": uuidlib.uuid4().hex,
            "created": iso_time(utc_now()),
            "extra": dict(extra or {}),
        }
        dk = key_file = None
        if passphrase is not None:
            enc, dk, keydoc = crypto.new_encryption(meta["uuid"], passphrase, meta["created"])
            meta["encryption"] = enc
            meta["encryption"]["mac"] = crypto.archive_mac(dk, meta)
            made_by_either(lambda: make_dir(crypto.keys_dir(path)))
            key_file = crypto.write_key_file(path, keydoc)
        try:
            storage.create_exclusive(path / ARCHIVE_JSON,
                                     (json_lines(meta) + "\n").encode("utf-8"), FILE_MODE)
        except FileExistsError:
            if key_file is not None:
                storage.unlink(key_file)
            raise ArchiveExistsError(f"{path} already holds an archive") from None
        return cls(path, meta, dk, passphrase)

    @classmethod
    def open(cls, path: Any, *,
             passphrase: str | crypto.PassphraseSource | None = None) -> "ClusterArchive":
        """Open the cluster archive at `path`; an encrypted one is unlocked here with
        `passphrase` or one its source (--passphrase-file, --passphrase-command), the
        environment or the prompt gives; its bucket archives open with the same."""
        path = storage.location(path)
        meta_path = path / ARCHIVE_JSON
        try:
            meta = read_json(meta_path)
        except FileNotFoundError:
            raise NotAnArchiveError(f"{path} is not a dcptool archive "
                                    f"(no {ARCHIVE_JSON})") from None
        except (OSError, ValueError) as exc:
            raise NotAnArchiveError(f"{meta_path} is unreadable: {exc}") from None
        if not isinstance(meta, dict) or meta.get("format") != CLUSTER_FORMAT:
            raise NotAnArchiveError(f"{meta_path} does not describe a dcptool cluster archive")
        version = meta.get("version")
        if not isinstance(version, int) or not 1 <= version <= CLUSTER_VERSION:
            raise NotAnArchiveError(f"{meta_path}: cluster archive version {version!r} is not "
                                    f"supported (this dcptool reads version {CLUSTER_VERSION})",
                                    hint="use a newer dcptool")
        for field_ in ("uuid", "created"):
            if not isinstance(meta.get(field_), str):
                raise NotAnArchiveError(f"{meta_path}: field {field_!r} is missing or not a str")
        if crypto.is_encrypted(meta):
            if not isinstance(passphrase, str):  # from its source, the environment or a prompt
                passphrase = crypto.get_passphrase(f"archive {path}", source=passphrase)
            dk, _ = crypto.unlock(path, meta, passphrase)
            return cls(path, meta, dk, passphrase)
        return cls(path, meta)

    # -- buckets ----------------------------------------------------------------------------

    def bucket_path(self, name: str) -> Any:
        return self.path / BUCKETS_DIR / check_bucket_name(name)

    def bucket_names(self) -> list[str]:
        """The buckets this archive holds an archive of (committed or not), sorted."""
        try:
            names = storage.listdir(self.path / BUCKETS_DIR)
        except FileNotFoundError:
            return []
        return sorted(n for n in names if BUCKET_NAME_RE.fullmatch(n)
                      and (self.path / BUCKETS_DIR / n / ARCHIVE_JSON).exists())

    def open_bucket(self, name: str) -> Archive:
        archive = Archive.open(self.bucket_path(name), passphrase=self._passphrase)
        if archive.bucket != name:
            raise ArchiveError(f"{self.bucket_path(name)} holds bucket {archive.bucket!r}, "
                               f"not {name!r}")
        return archive

    def bucket_for_backup(self, name: str, *, vbuckets: int, node: str,
                          node_uuid: str | None = None) -> tuple[Archive, bool]:
        """(the bucket archive a backup of bucket `name` writes into, whether it was
        created now): encrypted under the cluster archive's passphrase when it is."""
        return Archive.for_backup(self.bucket_path(name), bucket=name, vbuckets=vbuckets,
                                  node=node, node_uuid=node_uuid, passphrase=self._passphrase)

    # -- runs ---------------------------------------------------------------------------------

    def lock(self, purpose: str) -> ArchiveLock:
        return ArchiveLock(self.path, purpose)

    def new_run_id(self) -> str:
        """A run id greater than every committed one (a clock that went back is bumped)."""
        now, ids = utc_now(), self.run_ids()
        if ids and now <= parse_backup_id(ids[-1]):
            now = parse_backup_id(ids[-1]) + timedelta(microseconds=1)
        return backup_id_for(now)

    def run_ids(self) -> list[str]:
        try:
            names = storage.listdir(self.path / RUNS_DIR)
        except FileNotFoundError:
            return []
        return sorted(n[:-5] for n in names
                      if n.endswith(".json") and RUN_ID_RE.fullmatch(n[:-5]))

    def _run_file(self, run_id: str) -> tuple[Any, str]:
        if not RUN_ID_RE.fullmatch(run_id):
            raise ArchiveError(f"{run_id!r} is not a run id (YYYYMMDDTHHMMSS.ffffffZ)")
        return self.path / RUNS_DIR / f"{run_id}.json", f"{RUNS_DIR}/{run_id}.json"

    def write_run(self, run_id: str, record: dict[str, Any]) -> dict[str, Any]:
        """Commit a run: its record, written once (sealed in an encrypted archive)."""
        path, name = self._run_file(run_id)
        doc = {"id": run_id, "archive": self.uuid, **record}
        data = crypto.seal_file(self.key, name, (json.dumps(doc, sort_keys=True) + "\n")
                                .encode("utf-8"))
        storage.create_exclusive(path, data, FILE_MODE)
        return doc

    def run(self, run_id: str | None = None) -> dict[str, Any]:
        """A committed run's record (the latest when `run_id` is None)."""
        if run_id is None:
            ids = self.run_ids()
            if not ids:
                raise ArchiveError(f"{self.path} holds no committed backup run")
            run_id = ids[-1]
        path, name = self._run_file(run_id)
        try:
            raw = storage.read_bytes(path)
        except FileNotFoundError:
            raise ArchiveError(f"{self.path} holds no run {run_id}") from None
        try:
            doc = json.loads(crypto.open_file(self.key, name, raw).decode("utf-8"))
        except (ValueError, crypto.TamperedError) as exc:
            raise ArchiveError(f"{path} is damaged: {exc}") from None
        if not isinstance(doc, dict) or doc.get("id") != run_id or doc.get("archive") != self.uuid:
            raise ArchiveError(f"{path} is not run {run_id} of this archive")
        return doc


__all__ = ["CLUSTER_FORMAT", "ClusterArchive", "archive_kind", "bucket_of_archive",
           "check_bucket_name"]
