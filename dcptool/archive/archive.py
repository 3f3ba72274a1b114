"""The archive: its directory, the backups in it, and the driver side of writing a backup.

    ARCHIVE/archive.json                 what this archive is (written once)
    ARCHIVE/lock                         present while a writer holds the archive
    ARCHIVE/backups/<id>/backup.json     a backup's intent, written when it begins
    ARCHIVE/backups/<id>/vb-NNNN-SSS.mpk.zst, vb-NNNN.done.json
    ARCHIVE/backups/<id>/manifest.json   written last: the backup is committed

See docs/archive-format.md for every field.
"""
from __future__ import annotations

import json
import os
import uuid as uuidlib
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterable, Sequence

from .errors import (
    ArchiveError,
    ArchiveExistsError,
    ChainError,
    CorruptFileError,
    NotAnArchiveError,
    PartialBackupExistsError,
    SummaryMismatchError,
)
from .format import (
    ARCHIVE_JSON,
    CLUSTER_FORMAT_NAME,
    BACKUP_ID_RE,
    BACKUP_JSON,
    BACKUP_TYPES,
    BACKUPS_DIR,
    DEFAULT_BLOCK_SIZE,
    DEFAULT_LEVEL,
    DEFAULT_SEGMENT_BYTES,
    DIR_MODE,
    FILE_MODE,
    BATCH_RE,
    DONE_RE,
    PACK_RE,
    entry_location,
    listed_size,
    FORMAT_NAME,
    FORMAT_VERSION,
    COLLECTIONS_VERSION,
    FULL,
    MANIFEST_FORMAT,
    MANIFEST_JSON,
    ArchivePosition,
    atomic_write_json,
    backup_id_for,
    fsync_dir,
    iso_time,
    json_lines,
    make_dir,
    parse_backup_id,
    parse_data_name,
    read_json,
    utc_now,
    uuid_for_seqno,
    vbucket_ranges,
)
from . import chain as chains
from . import crypto, manifestcache, storage
from .lock import ArchiveLock
from .manifest import check_manifest, check_summary, totals_of
from .reader import Backup, VBucketHistory
from .recovery import (
    VBucketRecovery,
    batch_summaries,
    done_summaries,
    file_digest,
    recover_backup,
)
from .resolve import part_cuts, resolve, snapshot_boundaries
from .writer import VBucketWriter

LATEST = "latest"
#: archive.json's version of an encrypted archive (its backups are format FORMAT_VERSION)
ENCRYPTED_VERSION = 4
#: a backup directory holding this file is being removed (object storage, where a
#: directory cannot be renamed away at once): it is neither committed nor partial
#: (never resumed); the next merge, remove or prune finishes its removal
REMOVING = "removing"


def backup_path(archive_root: str | os.PathLike[str], backup_id: str) -> Path:
    """The directory of backup `backup_id` in the archive at `archive_root` (for tasks that
    carry only the archive's path; `Archive.backup_dir` is the same)."""
    return storage.location(archive_root) / BACKUPS_DIR / backup_id


def _reopened(path: Any, meta: dict[str, Any], key: tuple[str, bytes] | None,
              key_id: str | None) -> "Archive":
    """An opened archive from its pickle (see Archive.__reduce__)."""
    return Archive(path, meta, None if key is None else crypto.DataKey(*key), key_id)


#: below this many bytes of data files, a commit hashes them in one thread
PARALLEL_HASH_BYTES = 16 << 20

#: manifests this process read and checked, by file identity (see Archive.manifest)
_MANIFESTS: dict[tuple[Any, ...], dict[str, Any]] = {}


#: each manifest's end positions by vbucket, by the id of the manifest (held with it, so
#: the id stays its own): a backup asks for the chain's end positions several times
_ENDS: dict[int, tuple[dict[str, Any], dict[int, ArchivePosition]]] = {}


def _manifest_ends(doc: dict[str, Any]) -> dict[int, ArchivePosition]:
    held = _ENDS.get(id(doc))
    if held is not None and held[0] is doc:
        return held[1]
    ends = {e["vbucket"]: ArchivePosition.coerce(e["end"]) for e in doc["vbuckets"]}
    if len(_ENDS) >= 512:
        _ENDS.clear()
    _ENDS[id(doc)] = (doc, ends)
    return ends


_LOGS: dict[int, tuple[dict[str, Any], dict[int, list[list[int]]]]] = {}


def _manifest_logs(doc: dict[str, Any]) -> dict[int, list[list[int]]]:
    """Each vbucket's failover log in a manifest (kept as `_manifest_ends` keeps ends)."""
    held = _LOGS.get(id(doc))
    if held is not None and held[0] is doc:
        return held[1]
    logs = {e["vbucket"]: e["failover_log"] for e in doc["vbuckets"]}
    if len(_LOGS) >= 512:
        _LOGS.clear()
    _LOGS[id(doc)] = (doc, logs)
    return logs


def _remember(ident: tuple[Any, ...], doc: dict[str, Any]) -> None:
    if len(_MANIFESTS) >= 512:
        _MANIFESTS.clear()
    _MANIFESTS[ident] = doc


#: what Archive.create makes before archive.json: a location holding only these (and
#: hidden temporary files) is an archive another run is creating at this moment
_CREATED_FIRST = frozenset({BACKUPS_DIR, crypto.KEYS_DIR})


def _being_created(names: Iterable[str]) -> bool:
    """Whether a location holding `names` (and no archive.json) holds only what a run
    creating an archive there makes before its archive.json (or nothing)."""
    return all(n in _CREATED_FIRST or n.startswith(".") for n in names)


def made_by_either(make) -> None:
    """Make a directory of a new archive that another run creating it at this moment may
    have made first."""
    try:
        make()
    except FileExistsError:
        pass


class Archive:
    """An opened archive: the one object that carries an archive through the layers.

    Its location (`path`: a local path or an object-store location), what archive.json
    says (`meta`) and, for an encrypted archive, its data key (`key`, None for a plain
    archive) with the id of the key file the passphrase opened (`key_id`). A command opens
    it once (`Archive.open`, `Archive.create`; the CLI with `cli/passphrase.py:
    open_archive`) and passes it in; whoever reads or writes a file of the archive uses
    its key. It pickles with its key for Spark tasks (docs/spark.md: the key travels to
    executors only where the Spark configuration protects it); its repr never shows the key.
    """

    def __init__(self, path: Any, meta: dict[str, Any], key: crypto.DataKey | None = None,
                 key_id: str | None = None):
        self.path = storage.location(path)
        self.meta = meta
        self.key = key
        self.key_id = key_id

    def __reduce__(self):
        # what a Spark task receives: the location, archive.json and the data key (a
        # secret: docs/spark.md says when it may travel), never a passphrase
        key = None if self.key is None else (self.key.uuid, self.key.secret())
        return (_reopened, (self.path, self.meta, key, self.key_id))

    def without_key(self) -> "Archive":
        """The same archive, its data key left out (for a channel the key must not take)."""
        return Archive(self.path, self.meta)

    def at(self, root: Any) -> "Archive":
        """The same archive (meta, key) rooted at `root`: a merge's staging directory."""
        return Archive(root, self.meta, self.key, self.key_id)

    # -- opening and creating ---------------------------------------------------------------

    @classmethod
    def create(cls, path: str | os.PathLike[str], *, bucket: str, vbuckets: int = 1024,
               exist_ok: bool = False, extra: dict[str, Any] | None = None,
               passphrase: str | None = None,
               source: crypto.PassphraseSource | None = None) -> "Archive":
        """Create a new archive (the directory may exist if it is empty).

        With `exist_ok`, an existing archive is opened instead (its bucket must match; an
        encrypted one unlocks with `passphrase` or from `source`). With `passphrase`, a new
        archive is encrypted: a new data key, wrapped under the passphrase in keys/.
        """
        path = storage.location(path)

        def existing() -> "Archive":
            if not exist_ok:
                raise ArchiveExistsError(f"{path} already holds an archive")
            archive = cls.open(path, passphrase=passphrase if passphrase is not None
                               else source)
            if archive.bucket != bucket:
                raise ArchiveError(f"archive {path} holds bucket {archive.bucket!r}, "
                                   f"not {bucket!r}")
            return archive

        if (path / ARCHIVE_JSON).exists():
            return existing()
        if not isinstance(vbuckets, int) or not 1 <= vbuckets <= 65536:
            raise ArchiveError(f"vbucket count {vbuckets!r} is out of range")
        try:
            names = storage.listdir(path)
        except FileNotFoundError:
            names = []
        except NotADirectoryError:
            raise ArchiveError(f"{path} exists and is not a directory") from None
        # what another run creating an archive here at this moment has made before its
        # archive.json: that run or this one creates archive.json, exclusively, below
        if ARCHIVE_JSON in names:  # created since the check above
            return existing()
        if not _being_created(names):
            raise ArchiveError(f"{path} is not empty and is not an archive",
                               hint="choose a new or empty directory (or prefix)")
        made_by_either(lambda: storage.prepare_dir(path, DIR_MODE))
        made_by_either(lambda: make_dir(path / BACKUPS_DIR))
        meta = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "uuid": uuidlib.uuid4().hex,
            "bucket": bucket,
            "vbuckets": vbuckets,
            "created": iso_time(utc_now()),
            "extra": dict(extra or {}),
        }
        dk = key_id = None
        if passphrase is not None:
            # version 4 keeps dcptool without encryption from reading or writing it
            meta["version"] = ENCRYPTED_VERSION
            enc, dk, keydoc = crypto.new_encryption(meta["uuid"], passphrase, meta["created"])
            meta["encryption"] = enc
            meta["encryption"]["mac"] = crypto.archive_mac(dk, meta)
            made_by_either(lambda: make_dir(crypto.keys_dir(path)))
            key_file = crypto.write_key_file(path, keydoc)
            key_id = keydoc["id"]
        try:
            # exclusive: of two runs creating an archive at one location at once, exactly
            # one creates it; the other opens that one (exist_ok) or is told it exists
            storage.create_exclusive(path / ARCHIVE_JSON,
                                     (json_lines(meta) + "\n").encode("utf-8"), FILE_MODE)
        except FileExistsError:
            if key_id is not None:
                # this run's key file wraps a data key the archive does not use
                storage.unlink(key_file)
            return existing()
        return cls(path, meta, dk, key_id)

    @classmethod
    def open(cls, path: Any, *,
             passphrase: str | crypto.PassphraseSource | None = None,
             key: crypto.DataKey | None = None) -> "Archive":
        """Open the archive at `path`; an encrypted one is unlocked here, before any work
        (a wrong passphrase stops here): with its data key when the caller has it (`key`,
        e.g. a Spark worker's), else with `passphrase`, or one read from the source given
        (--passphrase-file, --passphrase-command), the environment or the prompt."""
        path = storage.location(path)
        if not storage.store_of(path).dirs:
            if not path.is_dir():
                raise NotAnArchiveError(f"no archive at {path}: no objects under that prefix")
        elif not path.exists():
            raise NotAnArchiveError(f"no archive at {path}: no such directory")
        elif not path.is_dir():
            raise NotAnArchiveError(f"{path} is not an archive: not a directory")
        meta_path = path / ARCHIVE_JSON
        try:
            meta = read_json(meta_path)
        except FileNotFoundError:
            raise NotAnArchiveError(f"{path} is not a dcptool archive "
                                    f"(no {ARCHIVE_JSON})") from None
        except (OSError, ValueError) as exc:
            raise NotAnArchiveError(f"{meta_path} is unreadable: {exc}") from None
        if isinstance(meta, dict) and meta.get("format") == CLUSTER_FORMAT_NAME:
            # archive/cluster.py: every bucket in an archive of its own under buckets/
            raise NotAnArchiveError(
                f"{path} is a cluster archive: this command reads one bucket's archive",
                hint=f"name one of its buckets' archives, {path / 'buckets'}/NAME")
        if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
            raise NotAnArchiveError(f"{meta_path} does not describe a dcptool archive")
        version = meta.get("version")
        encrypted = crypto.is_encrypted(meta)
        if encrypted and version == ENCRYPTED_VERSION:
            pass
        elif not isinstance(version, int) or version > FORMAT_VERSION or version < 1:
            raise NotAnArchiveError(f"{meta_path}: format version {version!r} is not supported "
                                    f"(this dcptool reads version {FORMAT_VERSION})",
                                    hint="use a newer dcptool")
        for field_, typ in (("uuid", str), ("bucket", str), ("vbuckets", int),
                            ("created", str)):
            if not isinstance(meta.get(field_), typ):
                raise NotAnArchiveError(f"{meta_path}: field {field_!r} is missing or not a "
                                        f"{typ.__name__}")
        if encrypted and key is not None and key.uuid == meta["uuid"]:
            crypto.check_archive_mac(path, meta, key)
            return cls(path, meta, key)
        if encrypted:
            dk, key_id = crypto.unlock(path, meta, passphrase)
            return cls(path, meta, dk, key_id)
        return cls(path, meta)

    @classmethod
    def opened(cls, archive: "Archive | str | os.PathLike[str]") -> "Archive":
        """`archive` when it is opened already (what a command passes in), else the
        archive at that path, opened (library callers, tests)."""
        return archive if isinstance(archive, Archive) else cls.open(archive)

    @property
    def encrypted(self) -> bool:
        return crypto.is_encrypted(self.meta)

    # -- properties -------------------------------------------------------------------------

    @property
    def uuid(self) -> str:
        return self.meta["uuid"]

    @property
    def bucket(self) -> str:
        return self.meta["bucket"]

    @property
    def vbucket_count(self) -> int:
        return self.meta["vbuckets"]

    @property
    def backups_dir(self) -> Any:
        return self.path / BACKUPS_DIR

    def backup_dir(self, backup_id: str) -> Any:
        return backup_path(self.path, backup_id)

    def __repr__(self) -> str:
        return f"Archive({str(self.path)!r}, bucket={self.bucket!r}" \
               f"{', encrypted' if self.key is not None else ''})"

    # -- listing ------------------------------------------------------------------------------

    def backup_ids(self) -> list[str]:
        """Ids of all backup directories, committed or partial, oldest first."""
        try:
            names = storage.list_sizes(self.backups_dir, dirs=True)
        except FileNotFoundError:
            raise NotAnArchiveError(f"{self.path} is not a dcptool archive "
                                    f"({BACKUPS_DIR}/ is missing)") from None
        return sorted(n for n, size in names.items() if size < 0 and BACKUP_ID_RE.match(n))

    def is_committed(self, backup_id: str) -> bool:
        return (self.backup_dir(backup_id) / MANIFEST_JSON).is_file()

    def committed_ids(self) -> list[str]:
        return [b for b in self.backup_ids() if self.is_committed(b)]

    def partial_ids(self) -> list[str]:
        return [b for b in self.backup_ids() if not self.is_committed(b)
                and not self.is_being_removed(b)]

    def is_being_removed(self, backup_id: str) -> bool:
        """A removal (merge, remove, prune) that was interrupted left this backup behind."""
        return (self.backup_dir(backup_id) / REMOVING).is_file()

    def manifest(self, backup_id: str) -> dict[str, Any]:
        """The manifest of a committed backup, checked to be well-formed."""
        path = self.backup_dir(backup_id) / MANIFEST_JSON
        try:
            # a manifest is immutable once committed: one this process read and checked
            # and that has not changed since (same file, size and mtime; same bytes of an
            # object) is served from memory (a backup walks its chain several times);
            # callers only read it
            ident = (*storage.identity(path), json.dumps(self.meta, sort_keys=True))
            doc = _MANIFESTS.get(ident)
            if doc is not None:
                return doc
            # and one an earlier command read and checked (archive/manifestcache.py; never
            # for an encrypted archive)
            doc = manifestcache.load(ident) if self.key is None else None
            if doc is not None:
                _remember(ident, doc)
                return doc
            doc = read_json(path, self.key)
        except FileNotFoundError:
            if self.backup_dir(backup_id).is_dir():
                raise ArchiveError(f"backup {backup_id} is partial (it has no manifest)") from None
            raise ArchiveError(f"archive {self.path} has no backup {backup_id}",
                               hint="see 'dcptool info' for the backups it holds") from None
        except (OSError, ValueError) as exc:
            raise CorruptFileError(path, f"unreadable: {exc}",
                                   hint=self._damaged_hint(backup_id)) from None
        problems = check_manifest(doc, backup_id, self.meta)
        if problems:
            raise CorruptFileError(path, "; ".join(problems[:3]),
                                   hint=self._damaged_hint(backup_id))
        _remember(ident, doc)
        if self.key is None:
            manifestcache.store(ident, doc)
        return doc

    def _damaged_hint(self, backup_id: str) -> str:
        return (f"the manifest of backup {backup_id} is damaged; 'dcptool remove {self.path} "
                f"--backup {backup_id}' takes that backup out and touches nothing else (the "
                "next backup then continues from the backup before it)")

    def is_damaged(self, backup_id: str) -> bool:
        """A committed backup whose manifest is unreadable or ill-formed (truncated, say):
        nothing can be read through it; `remove --backup` takes it out."""
        if not self.is_committed(backup_id):
            return False
        try:
            self.manifest(backup_id)
        except CorruptFileError as exc:
            return exc.path == str(self.backup_dir(backup_id) / MANIFEST_JSON)
        return False

    def backup(self, backup_id: str) -> Backup:
        return Backup(self, self.manifest(backup_id))

    def manifests(self) -> dict[str, dict[str, Any]]:
        """The manifest of every committed backup, by id (each read and checked once)."""
        return {bid: self.manifest(bid) for bid in self.committed_ids()}

    def _replacements(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for bid in self.committed_ids():
            try:
                m = self.manifest(bid)
            except ArchiveError:
                continue
            for old in chains.merged_from(m) or ():
                out[old] = bid
        return out

    def resolve_parent(self, parent: str | None) -> str | None:
        """Where a parent link leads (see archive.chain): the backup itself while it is
        committed, else the merged backup that replaced it."""
        return chains.follow(parent, self.is_committed, self._replacements)

    def parent_of(self, backup_id: str) -> str | None:
        """The committed backup `backup_id` continues from (its parent link, resolved)."""
        return self.resolve_parent(self.manifest(backup_id).get("parent"))

    def chain_ids(self, manifests: dict[str, dict[str, Any]] | None = None,
                  upto: str | None = None) -> list[str]:
        """The ids of the chain ending at `upto` (default newest), oldest first; the same
        as `chain` over manifests already read (`manifests()`)."""
        if manifests is None:
            manifests = self.manifests()
        return chains.chain_ids(
            manifests, upto,
            describe_missing=lambda b: "partial" if self.backup_dir(b).is_dir() else "missing",
            missing_target=self.manifest)

    def latest_id(self) -> str | None:
        ids = self.committed_ids()
        return ids[-1] if ids else None

    def chain(self, upto: str | None = None) -> list[Backup]:
        """The committed backups a restore of `upto` (default: the newest) reads, oldest
        first: from the full backup it descends from, along parent links."""
        target = upto or self.latest_id()
        if target is None:
            return []
        out: list[Backup] = []
        seen: set[str] = set()
        bid: str | None = target
        while bid is not None:
            if bid in seen:
                raise ChainError(f"backup {bid} is its own ancestor")
            seen.add(bid)
            if not self.is_committed(bid):
                child = out[-1].id if out else None
                if child is None:
                    self.manifest(bid)  # raises the right error for a missing/partial target
                raise ChainError(f"backup {child} names parent {bid}, which is "
                                 f"{'partial' if self.backup_dir(bid).is_dir() else 'missing'}",
                                 hint="restore an older backup, or run a new full backup")
            b = self.backup(bid)
            out.append(b)
            bid = self.resolve_parent(b.parent)
        out.reverse()
        return out

    def end_positions(self, upto: str | None = None) -> dict[int, ArchivePosition]:
        """Per vbucket, where the chain ending at `upto` (default newest) stopped: the start
        of the next incremental backup."""
        ends: dict[int, ArchivePosition] = {}
        for b in self.chain(upto):
            ends.update(_manifest_ends(b.manifest))
        return ends

    def failover_logs(self, upto: str | None = None) -> dict[int, list[list[int]]]:
        """Per vbucket, the newest failover log the chain recorded."""
        logs: dict[int, list[list[int]]] = {}
        for b in self.chain(upto):
            logs.update(_manifest_logs(b.manifest))
        return logs

    def history(self, vbucket: int, upto: str | None = None, *,
                check_sha256: bool = False) -> list[VBucketHistory]:
        """The parts of `vbucket`'s history along the chain, oldest first (for resolve)."""
        return [VBucketHistory(b, vbucket, check_sha256=check_sha256) for b in self.chain(upto)
                if b.entry(vbucket) is not None]

    def resolve_vbucket(self, vbucket: int, *, backup: str | None = None,
                        upto_seqno: int | None = None,
                        include_deletions: bool = True) -> dict[bytes, tuple]:
        """The newest surviving version of each key of `vbucket` as of `backup` (default the
        newest) and `upto_seqno`: what a restore writes. See resolve.resolve."""
        return resolve(self.history(vbucket, backup), upto_seqno=upto_seqno,
                       include_deletions=include_deletions)

    def rollback_point(self, vbucket: int, seqno: int, upto: str | None = None) -> ArchivePosition:
        """Where to roll `vbucket` back to when the node answers ROLLBACK to `seqno`: the
        latest snapshot boundary at or below `seqno` on the live branch of the chain (seqno
        0 when there is none), with the uuid of the history branch that holds it."""
        parts = [b for b in self.chain(upto) if b.entry(vbucket) is not None]
        cuts = part_cuts([[r["seqno"] for r in b.entry(vbucket)["rollbacks"]] for b in parts])
        best = 0
        for b, cut in zip(reversed(parts), reversed(cuts)):
            entry = b.entry(vbucket)
            if ArchivePosition.coerce(entry["end"]).seqno <= best and not entry["rollbacks"]:
                break  # this backup and older ones hold nothing above what was found
            limit = seqno if cut is None else min(seqno, cut)
            for s in snapshot_boundaries(b.records(vbucket)):
                if best < s <= limit:
                    best = s
        logs = self.failover_logs(upto)
        flog = logs.get(vbucket, [])
        return ArchivePosition.at(uuid_for_seqno(flog, best, flog[-1][0] if flog else 0), best)

    # -- writing ------------------------------------------------------------------------------

    def lock(self, purpose: str) -> ArchiveLock:
        """An (unacquired) archive lock; use `with archive.lock("merge"):`."""
        return ArchiveLock(self.path, purpose)

    def _new_id(self) -> str:
        now = utc_now()
        existing = self.backup_ids()
        if existing:
            newest = parse_backup_id(existing[-1])
            if now <= newest:
                now = newest + timedelta(microseconds=1)
        return backup_id_for(now)

    def begin_backup(self, backup_type: str, parent: str | None = LATEST, *,
                     level: int = DEFAULT_LEVEL, block_size: int = DEFAULT_BLOCK_SIZE,
                     segment_bytes: int = DEFAULT_SEGMENT_BYTES,
                     extra: dict[str, Any] | None = None,
                     version: int = FORMAT_VERSION,
                     collections: dict[str, Any] | None = None,
                     data: dict[str, list[str]] | None = None,
                     bucket_uuid: str | None = None) -> "BackupWriter":
        """Start a backup: take the archive lock, create the (partial) backup directory.

        `version` is the format version of the backup's files (1 writes the older record
        layout; kept for tests of the readers' compatibility).

        Format 3: `collections` is the node's collections manifest (its JSON form) when the
        backup begins, None for a node without collections; `data` the filter the backup
        streams with ({"include": [...], "exclude": [...]}, names as given), None for all
        data. Both go to backup.json (a resumed backup keeps them) and to the manifest.

        `bucket_uuid` is the uuid of the bucket streamed (the cluster map's `uuid`; None when
        the node gives none): backup.json and the manifest record it, and the next backup
        compares it with the node's (see pipeline/backup.py).

        An incremental backup's parent defaults to the newest committed backup. Refuses to
        start while a partial backup exists (resume it or purge it first).
        """
        if backup_type not in BACKUP_TYPES:
            raise ArchiveError(f"backup type must be full or incremental, not {backup_type!r}")
        if not 1 <= int(level) <= 22:
            raise ArchiveError(f"zstd level {level} is out of range (1..22)")
        lock = self.lock(f"{backup_type} backup").acquire()
        try:
            partial = self.partial_ids()
            if partial:
                raise PartialBackupExistsError(
                    f"archive {self.path} holds a partial backup {partial[-1]}",
                    hint="resume it, or purge it with --purge-partial")
            if backup_type == FULL:
                parent_id = None
            else:
                parent_id = self.latest_id() if parent == LATEST else parent
                if parent_id is None:
                    raise ArchiveError(f"archive {self.path} holds no committed backup; the first "
                                       "backup must be full")
                self.manifest(parent_id)  # must exist, be committed and well-formed
            backup_id = self._new_id()
            bdir = self.backup_dir(backup_id)
            make_dir(bdir)
            if version not in (1, FORMAT_VERSION):
                raise ArchiveError(f"format version {version} cannot be written")
            intent = {
                "format": "dcptool-backup",
                "version": int(version),
                "archive": self.uuid,
                "id": backup_id,
                "parent": parent_id,
                "type": backup_type,
                "started": iso_time(utc_now()),
                "compression": {"codec": "zstd", "level": int(level),
                                "block_size": int(block_size),
                                "segment_bytes": int(segment_bytes)},
                "extra": dict(extra or {}),
            }
            if bucket_uuid is not None:
                intent["bucket_uuid"] = str(bucket_uuid)
            if version >= COLLECTIONS_VERSION:
                intent["collections"] = collections
                if data is not None:
                    intent["data"] = data
            atomic_write_json(bdir / BACKUP_JSON, intent, key=self.key)
        except BaseException:
            lock.release()
            raise
        return BackupWriter(self, intent, lock)

    def partial_backup(self) -> "PartialBackup | None":
        """The newest backup without a manifest, None when there is none."""
        ids = self.partial_ids()
        if not ids:
            return None
        return PartialBackup(self, ids[-1])

    def resume_backup(self) -> "BackupWriter":
        """Take the lock and continue the partial backup (see PartialBackup.recover)."""
        lock = self.lock("resumed backup").acquire()
        try:
            partial = self.partial_backup()
            if partial is None:
                raise ArchiveError(f"archive {self.path} holds no partial backup to resume")
            storage.abort_uploads(partial.dir)  # parts a killed writer left open
            intent = partial.intent
            if intent is None:
                raise ArchiveError(f"partial backup {partial.id} has no readable {BACKUP_JSON}; "
                                   "it cannot be resumed", hint="purge it with --purge-partial")
        except BaseException:
            lock.release()
            raise
        return BackupWriter(self, intent, lock, resumed=True)

    # -- what a backup run decides about the archive ------------------------------------------

    @classmethod
    def for_backup(cls, archive: "Archive | str | os.PathLike[str]", *, bucket: str,
                   vbuckets: int, node: str, node_uuid: str | None = None,
                   passphrase: str | None = None) -> tuple["Archive", bool]:
        """(the archive a backup of `bucket` with `vbuckets` vbuckets from the node
        `node` writes into, whether it was created now): `archive` opened already, or the
        archive at that location (opened, an encrypted one with `passphrase` when one is
        given; created when there is none, encrypted under `passphrase` when one is given).
        A usage error when it holds another bucket or another vbucket count."""
        if not isinstance(archive, Archive):
            where = storage.location(archive)
            if not (where / ARCHIVE_JSON).exists() and not (
                    storage.store_of(where).dirs and where.exists()
                    and not _being_created(p.name for p in where.iterdir())):
                try:
                    return cls.create(archive, bucket=bucket, vbuckets=vbuckets,
                                      passphrase=passphrase), True
                except ArchiveExistsError:
                    pass  # another run created it a moment ago: open that one
            archive = cls.open(archive, passphrase=passphrase)
        archive.check_backup_target(bucket, vbuckets, node=node, node_uuid=node_uuid)
        return archive, False

    def check_backup_target(self, bucket: str, vbuckets: int, *, node: str,
                            node_uuid: str | None = None) -> None:
        """A usage error unless a backup of `bucket` (of `vbuckets` vbuckets, served by
        `node`) may go into this archive."""
        from dcptool.errors import UsageError

        if self.bucket != bucket:
            held = self.recorded_bucket_uuid(self.latest_id())
            raise UsageError(f"archive {self.path} holds bucket '{self.bucket}'"
                             f"{f' (uuid {held})' if held else ''}, not bucket "
                             f"'{bucket}'{f' (uuid {node_uuid})' if node_uuid else ''} "
                             f"that {node} serves",
                             hint="use another archive directory or -b")
        if self.vbucket_count != vbuckets:
            raise UsageError(f"archive {self.path} has {self.vbucket_count} vbuckets but the "
                             f"node has {vbuckets}")

    def recorded_bucket_uuid(self, backup_id: str | None) -> str | None:
        """The bucket uuid the newest backup of `backup_id`'s chain recorded (None: no
        backup recorded one, as with backups of dcptool before it recorded them)."""
        if backup_id is None:
            return None
        for bid in reversed(self.chain_ids(upto=backup_id)):
            uuid = self.manifest(bid).get("bucket_uuid")
            if uuid:
                return str(uuid)
        return None

    def settle_partial(self, purge: bool) -> tuple["PartialBackup | None", list[str], list[str]]:
        """What a backup does with a partial backup: (the one it resumes or None, notes for
        the user, ids discarded). With `purge` (--purge-partial) every partial backup is
        discarded; so is one begun by a dcptool without collections (format < 3: its files
        hold keys without collection ids, the streams now send doc keys)."""
        partial = self.partial_backup()
        notes: list[str] = []
        if partial is not None and not purge and \
                int((partial.intent or {}).get("version", FORMAT_VERSION)) < COLLECTIONS_VERSION:
            purge = True
            notes.append(f"partial backup {partial.id} was begun by a dcptool without "
                         "collections (format version < 3) and cannot be continued: "
                         "discarded, starting again")
        removed: list[str] = []
        if partial is not None and purge:
            removed = self.purge_partial()
            partial = None
        return partial, notes, removed

    def purge_partial(self) -> list[str]:
        """Delete every partial backup (under the lock). Returns the ids removed."""
        with self.lock("purge partial backups"):
            removed = []
            for bid in self.partial_ids():
                storage.remove_tree(self.backup_dir(bid))
                removed.append(bid)
            if removed:
                fsync_dir(self.backups_dir)
            return removed


class PartialBackup:
    """A backup directory without a manifest: a backup killed (or still running elsewhere)."""

    def __init__(self, archive: Archive, backup_id: str):
        self.archive = archive
        self.id = backup_id
        self.dir = archive.backup_dir(backup_id)
        try:
            intent = read_json(self.dir / BACKUP_JSON, archive.key)
            self.intent: dict[str, Any] | None = intent if isinstance(intent, dict) else None
        except (OSError, ValueError):
            self.intent = None

    def __repr__(self) -> str:
        return f"PartialBackup({self.id!r})"

    @property
    def type(self) -> str | None:
        return self.intent.get("type") if self.intent else None

    @property
    def parent(self) -> str | None:
        return self.intent.get("parent") if self.intent else None

    def recover(self, *, scan: bool = True, rehash: bool = True) -> dict[int, VBucketRecovery]:
        """Per vbucket found in the directory: complete (done file verified) or not, and for
        the others the position after their last complete snapshot. Read-only.

        With scan=False only the done files are checked (fast); incomplete vbuckets then
        have position None.
        """
        return recover_backup(self.dir, self.id, scan=scan, rehash=rehash, key=self.archive.key)


@dataclass(frozen=True, slots=True)
class VBucketStart:
    """Where one vbucket of a backup starts: the position the chain before it ended at (or
    zero) with the failover log the chain recorded for it, and whether the files a killed
    attempt left for it are continued (`VBucketWriter(resume=True)` then finds the exact
    position in them)."""

    position: ArchivePosition
    failover_log: tuple[tuple[int, int], ...] = ()
    resume: bool = False


ZERO_START = ArchivePosition(0, 0, 0, 0)


@dataclass(frozen=True, slots=True)
class BackupPlan:
    """What a backup still has to write: `kept` the summaries of the vbuckets a killed
    attempt completed (verified, committed as they are), `starts` the others."""

    kept: dict[int, dict[str, Any]]
    starts: dict[int, VBucketStart]


def _stale_batch(path: Any, by_vb: dict[int, dict[str, Any]], key: Any) -> bool:
    """A done batch any of whose summaries is not the one committed (a failed attempt's)."""
    def plain(s: Any) -> str:
        if not isinstance(s, dict):
            return ""
        return json.dumps([s.get("files"), s.get("end"), s.get("counts")], sort_keys=True)

    summaries = batch_summaries(path, key)
    return not summaries or any(plain(s) != plain(by_vb.get(s["vbucket"])) for s in summaries)


class BackupProgress:
    """How far a running backup is, from its vbuckets' done files (each read once)."""

    def __init__(self, backup_dir: Any, key: crypto.DataKey | None = None):
        self.dir = backup_dir
        self.key = key
        self._read: set[str] = set()
        self._seen: dict[int, tuple[int, int]] = {}  # vbucket: (items, bytes)

    def poll(self) -> tuple[int, int, int]:
        """(vbuckets done, items, bytes) so far; a file not readable yet is counted later."""
        try:
            names = [n for n in storage.listdir(self.dir) if DONE_RE.match(n)
                     or BATCH_RE.match(n)]
        except (OSError, ArchiveError):
            names = []
        for n in sorted(names):
            if n in self._read:
                continue
            try:
                doc = read_json(self.dir / n, self.key)
                summaries = doc["vbuckets"] if BATCH_RE.match(n) else [doc]
                got = {d["vbucket"]: (d["counts"]["mutations"] + d["counts"]["deletions"]
                                      + d["counts"]["expirations"], d["bytes"]["files"])
                       for d in summaries}
            except (OSError, ValueError, KeyError, TypeError, ArchiveError):
                continue
            self._read.add(n)
            self._seen.update(got)
        seen = self._seen.values()
        return len(self._seen), sum(i for i, _ in seen), sum(b for _, b in seen)


class BackupWriter:
    """The driver's handle on a backup being written; holds the archive lock until commit."""

    def __init__(self, archive: Archive, intent: dict[str, Any], lock: ArchiveLock, *,
                 resumed: bool = False):
        self.archive = archive
        self.intent = intent
        self.id: str = intent["id"]
        self.type: str = intent["type"]
        self.parent: str | None = intent["parent"]
        self.dir = archive.backup_dir(self.id)
        self.lock = lock
        self.resumed = resumed
        self.committed = False

    def __repr__(self) -> str:
        return f"BackupWriter({self.id!r}, type={self.type!r}, parent={self.parent!r})"

    @property
    def level(self) -> int:
        return self.intent["compression"]["level"]

    def vbucket(self, vbucket: int, start: Any, failover_log: Iterable[Any] | None = (), *,
                resume: bool = False, **kwargs: Any) -> VBucketWriter:
        """A writer for one vbucket (the same as VBucketWriter(archive path, id, ...))."""
        self._check_open()
        if not 0 <= vbucket < self.archive.vbucket_count:
            raise ArchiveError(f"vbucket {vbucket} is out of range for this archive "
                               f"({self.archive.vbucket_count} vbuckets)")
        return VBucketWriter(self.archive, self.id, vbucket, start, failover_log,
                             resume=resume, **kwargs)

    def recover(self, *, scan: bool = True, rehash: bool = True) -> dict[int, VBucketRecovery]:
        return recover_backup(self.dir, self.id, scan=scan, rehash=rehash, key=self.archive.key)

    def plan(self, vbuckets: Iterable[int]) -> BackupPlan:
        """Where each of `vbuckets` starts: seqno 0 in a full backup, where the parent's
        chain ended in an incremental one; in a resumed backup the vbuckets a killed
        attempt completed are kept and those it began continue from their files."""
        kept: dict[int, dict[str, Any]] = {}
        resume: set[int] = set()
        if self.resumed:
            for vb, rec in self.recover(scan=True).items():
                if rec.complete:
                    kept[vb] = rec.summary
                elif rec.position is not None:
                    resume.add(vb)
        if self.type == FULL:
            ends: dict[int, ArchivePosition] = {}
            logs: dict[int, list[list[int]]] = {}
        else:
            ends = self.archive.end_positions(self.parent)
            logs = self.archive.failover_logs(self.parent)
        starts = {}
        for vb in sorted(vbuckets):
            if vb in kept:
                continue
            pos = ends.get(vb)
            log = tuple((int(u), int(s)) for u, s in logs.get(vb) or ()) if pos else ()
            starts[vb] = VBucketStart(pos or ZERO_START, log, vb in resume)
        return BackupPlan(kept, starts)

    def progress(self) -> BackupProgress:
        """A reader of this backup's progress (safe to poll from another thread)."""
        return BackupProgress(self.dir, self.archive.key)

    def _check_open(self) -> None:
        if self.committed:
            raise ArchiveError(f"backup {self.id} is already committed")
        if not self.lock.held:
            raise ArchiveError(f"backup {self.id} was aborted (the archive lock is released)")

    def _load_done(self) -> list[dict[str, Any]]:
        out = []
        names = sorted(storage.listdir(self.dir))
        for name in names:
            if DONE_RE.match(name):
                try:
                    out.append(read_json(self.dir / name, self.archive.key))
                except (OSError, ValueError) as exc:
                    raise CorruptFileError(self.dir / name, f"unreadable: {exc}") from None
        batched = done_summaries(self.dir, [n for n in names if BATCH_RE.match(n)],
                                 key=self.archive.key)
        return [s for s in out if s.get("vbucket") not in batched] + list(batched.values())

    def commit(self, summaries: Sequence[dict[str, Any]] | None = None, *,
               extra: dict[str, Any] | None = None, rehash: bool = True,
               unchanged: Iterable[int] = ()) -> dict[str, Any]:
        """Check every summary against the files on disk and write the manifest atomically.

        `summaries` are the dicts VBucketWriter.close returned (None: the done files in the
        directory). Data and done files of vbuckets not in the summaries are deleted first
        (leftovers of failed attempts). Releases the archive lock. Returns the manifest.

        `unchanged`: vbuckets of an incremental backup that had nothing new since its
        parent's chain (same failover log, same high seqno): they get no file and no entry,
        only a place in the manifest's `unchanged` ranges; readers find them where the chain
        before left them.
        """
        self._check_open()
        if summaries is None:
            summaries = self._load_done()
        by_vb = self._summaries_by_vbucket(summaries)
        sizes = storage.list_sizes(self.dir)
        self._check_listed_files(by_vb, sizes, rehash)
        self._remove_unlisted(by_vb, sizes)
        manifest = self._manifest(by_vb, extra, sorted(set(unchanged)))
        atomic_write_json(self.dir / MANIFEST_JSON, manifest, key=self.archive.key)
        if self.archive.key is None:  # checked above: the next command need not again
            try:
                ident = (*storage.identity(self.dir / MANIFEST_JSON),
                         json.dumps(self.archive.meta, sort_keys=True))
            except OSError:
                pass
            else:
                # as a reader gets it (JSON's types: lists, not tuples)
                manifestcache.store(ident, json.loads(json.dumps(manifest)))
        self.committed = True
        self.lock.release()
        return manifest

    def _summaries_by_vbucket(self, summaries: Sequence[dict[str, Any]]
                              ) -> dict[int, dict[str, Any]]:
        """{vbucket: summary}, each summary well-formed and one per vbucket."""
        count = self.archive.vbucket_count
        by_vb: dict[int, dict[str, Any]] = {}
        for s in summaries:
            problems = check_summary(s, self.id, count)
            if problems:
                raise SummaryMismatchError(f"backup {self.id}: {problems[0]}")
            if s["vbucket"] in by_vb:
                raise SummaryMismatchError(f"backup {self.id}: two summaries for vbucket "
                                           f"{s['vbucket']}")
            by_vb[s["vbucket"]] = s
        return by_vb

    def _check_listed_files(self, by_vb: dict[int, dict[str, Any]], sizes: dict[str, int],
                            rehash: bool) -> None:
        """Every file a summary lists is on disk with the size and SHA-256 it records
        (SummaryMismatchError naming the first that is not)."""
        def measure(f: dict[str, Any]) -> tuple[int, str] | None:
            held = listed_size(f, sizes)
            if held is None:
                return None
            try:
                if rehash:
                    return file_digest(entry_location(self.dir, f))
                return held, f["sha256"]
            except FileNotFoundError:
                return None

        pairs = [(s, f) for s in by_vb.values() for f in s["files"]]
        # threads pay off for large files only: a small job's hundreds of small files
        # hash faster one after the other than through a pool
        if rehash and len(pairs) > 1 and sum(int(f.get("size") or 0)
                                             for _s, f in pairs) >= PARALLEL_HASH_BYTES:
            # hashlib releases the GIL on large buffers: the files hash in parallel
            from concurrent.futures import ThreadPoolExecutor

            with storage.pack_cache(), \
                    ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
                measured = list(pool.map(measure, [f for _s, f in pairs]))
        else:
            measured = [measure(f) for _s, f in pairs]
        for (s, f), got in zip(pairs, measured):
            path = entry_location(self.dir, f)
            if got is None:
                raise SummaryMismatchError(f"{path}: listed for vbucket {s['vbucket']} but "
                                           "missing")
            size, digest = got
            if size != f["size"] or digest != f["sha256"]:
                raise SummaryMismatchError(
                    f"{path}: the file on disk ({size} bytes) is not the one vbucket "
                    f"{s['vbucket']}'s summary describes ({f['size']} bytes, sha256 "
                    f"{f['sha256'][:12]}...)", hint="rerun the task for this vbucket")

    def _remove_unlisted(self, by_vb: dict[int, dict[str, Any]], sizes: dict[str, int]) -> None:
        """Delete what failed attempts left: data, done, pack and batch files no summary
        lists, and temporary files."""
        listed = {f["name"] for s in by_vb.values() for f in s["files"] if "pack" not in f}
        packs = {f["pack"] for s in by_vb.values() for f in s["files"] if "pack" in f}
        removed = False
        for name in sizes:
            parsed = parse_data_name(name)
            stale = (parsed is not None and name not in listed) or (
                DONE_RE.match(name) is not None and int(name[3:-10]) not in by_vb) or (
                PACK_RE.match(name) is not None and name not in packs) or (
                BATCH_RE.match(name) is not None and _stale_batch(self.dir / name, by_vb,
                                                                     self.archive.key))
            if stale or (name.startswith(".") and name.endswith(".tmp")):
                storage.unlink(self.dir / name)
                removed = True
        if removed:
            fsync_dir(self.dir)

    def _manifest(self, by_vb: dict[int, dict[str, Any]], extra: dict[str, Any] | None,
                  unchanged: list[int]) -> dict[str, Any]:
        """The manifest of this backup (checked to be well-formed)."""
        entries = [by_vb[vb] for vb in sorted(by_vb)]
        manifest = {
            "format": MANIFEST_FORMAT,
            "version": int(self.intent.get("version", FORMAT_VERSION)),
            "archive": self.archive.uuid,
            "bucket": self.archive.bucket,
            **({"bucket_uuid": self.intent["bucket_uuid"]}
               if self.intent.get("bucket_uuid") is not None else {}),
            "id": self.id,
            "parent": self.parent,
            "type": self.type,
            "started": self.intent["started"],
            "finished": iso_time(utc_now()),
            "compression": self.intent["compression"],
            "totals": totals_of(entries),
            "vbuckets": entries,
            "extra": {**self.intent.get("extra", {}), **(extra or {})},
        }
        if unchanged:
            if self.type == FULL:
                raise SummaryMismatchError(f"backup {self.id}: a full backup holds every "
                                           "vbucket it covers (none is unchanged)")
            manifest["unchanged"] = vbucket_ranges(unchanged)
        if manifest["version"] >= COLLECTIONS_VERSION:
            manifest["collections"] = self.intent.get("collections")
            if self.intent.get("data") is not None:
                manifest["data"] = self.intent["data"]
        problems = check_manifest(manifest, self.id, self.archive.meta)
        if problems:
            raise SummaryMismatchError(f"backup {self.id}: {problems[0]}")
        return manifest

    def abort(self) -> None:
        """Release the lock without committing; the backup stays partial."""
        self.lock.release()

    def __enter__(self) -> "BackupWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self.committed:
            self.abort()


__all__ = ["Archive", "BackupWriter", "BackupPlan", "BackupProgress", "PartialBackup",
           "VBucketStart", "LATEST", "backup_path"]
