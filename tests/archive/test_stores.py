"""The store contract (dcptool/archive/stores/): every store, the same tests.

Each test takes `where`, a location on one store: a local directory, a new prefix of a
bucket on the suite's S3 server (tests/s3util.py), a space of the memory store. A new
store is proved by one more param of that fixture. The tests go through the facade the
archive code calls (`storage.*`), first file by file (save, load, ranges, stat, list,
remove, writes that are all or nothing, the lock's create-if-absent), then archive by
archive (backups written, resolved, packed, merged and verified), and check that what a
store says it can do (its capabilities) is what it does.
"""
from __future__ import annotations

import pickle
import threading

import pytest
from storefixtures import s3_bucket, where  # noqa: F401 (fixtures)
from archiveutil import W, mutations, seed_004_archive, write_events

from dcptool.archive import Archive, ArchivePosition, storage
from dcptool.archive.errors import ArchiveExistsError, ArchiveLockedError
from dcptool.archive.lock import ArchiveLock
from dcptool.archive.merging import StagedMerge, merge_vbuckets, plan_merge
from dcptool.archive.packing import Packer
from dcptool.archive.stores import LOCAL, MEMORY, S3, Member, store_of
from dcptool.archive.verify import verify_archive

#: the store objects behind storefixtures.STORE_NAMES (the `where` fixture's params)
STORES = {"local": LOCAL, "s3": S3, "memory": MEMORY}


@pytest.fixture
def root(where):
    """`where` as a location, made ready to hold files (a local directory is created)."""
    loc = storage.location(where)
    storage.prepare_dir(loc)
    return loc


# -- the location and its store ------------------------------------------------------------------


def test_the_store_is_chosen_once_from_the_location(where, request):
    loc = storage.location(where)
    assert store_of(loc) is store_of(where) is STORES[request.node.callspec.params["where"]]
    assert storage.location(loc) is loc
    assert storage.location(str(loc)) == loc
    assert pickle.loads(pickle.dumps(loc / "a" / "b")) == loc / "a" / "b"
    assert (loc / "a" / "b").parent == loc / "a" and (loc / "a").name == "a"
    assert store_of(Member(loc / "p", 0, 1, "m")) is not None


# -- files ---------------------------------------------------------------------------------------


def test_save_load_range_stat(root):
    data = bytes(range(256)) * 40
    f = storage.write_new(root / "f.bin")
    f.write(data[:1000])
    f.write(data[1000:])
    f.close()
    p = root / "f.bin"
    assert storage.read_bytes(p) == p.read_bytes() == data
    assert storage.stat_size(p) == len(data)
    assert p.is_file() and p.exists()
    assert storage.read_range(p, 100, 50) == data[100:150]
    assert storage.read_range(p, len(data) - 10, 50) == data[-10:]  # (fewer at the end)
    assert storage.read_range(p, 5, 0) == b""
    with storage.open_read(p) as r:
        assert storage.file_size(r) == len(data)
        r.seek(2000)
        assert r.read(10) == data[2000:2010]
        r.seek(-5, 2)
        assert r.read() == data[-5:]
    storage.atomic_write_bytes(root / "t.txt", "é".encode())
    assert (root / "t.txt").read_text() == "é"


def test_missing_files_are_file_not_found(root):
    p = root / "nothing"
    assert not p.is_file() and not p.exists()
    for call in (storage.read_bytes, storage.stat_size, storage.open_read, storage.identity,
                 storage.age_seconds):
        with pytest.raises(FileNotFoundError):
            call(p)
    storage.unlink(p)  # (missing_ok by default)


def test_list_names_sizes_and_directories(root):
    storage.atomic_write_bytes(root / "a.bin", b"12345")
    storage.make_dir(root / "sub")
    storage.atomic_write_bytes(root / "sub" / "b.bin", b"xy")
    assert storage.list_sizes(root) == {"a.bin": 5}
    assert storage.list_sizes(root, dirs=True) == {"a.bin": 5, "sub": -1}
    assert sorted(storage.listdir(root)) == ["a.bin", "sub"]
    assert sorted(p.name for p in root.iterdir()) == ["a.bin", "sub"]
    assert (root / "sub").is_dir() and not (root / "a.bin").is_dir()
    assert storage.list_sizes(root / "sub") == {"b.bin": 2}


def test_directories_follow_the_dirs_capability(root):
    store = store_of(root)
    storage.make_dir(root / "empty")
    # a store with directories has an empty one; without them a prefix is there while an
    # object lies under it
    assert (root / "empty").is_dir() == store.dirs
    storage.make_dir(root / "full")
    storage.atomic_write_bytes(root / "full" / "x", b"x")
    assert (root / "full").is_dir()
    storage.unlink(root / "full" / "x")
    assert (root / "full").is_dir() == store.dirs


def test_remove_a_file_and_a_tree(root):
    storage.atomic_write_bytes(root / "keep", b"k")
    storage.make_dir(root / "tree")
    storage.make_dir(root / "tree" / "sub")
    for name in ("tree/a", "tree/b", "tree/sub/c"):
        storage.atomic_write_bytes(root / name, name.encode())
    storage.unlink(root / "tree" / "a")
    assert not (root / "tree" / "a").exists()
    assert sorted(storage.listdir(root / "tree")) == ["b", "sub"]
    storage.remove_tree(root / "tree")
    assert not (root / "tree").exists() and not (root / "tree" / "sub" / "c").exists()
    # (files only: a filer-backed S3 server may go on listing an emptied prefix)
    assert storage.list_sizes(root) == {"keep": 1}


def test_atomic_replace_prefix_and_rename(root):
    p = root / "f"
    storage.atomic_write_bytes(p, b"first version")
    before = storage.identity(p)
    storage.atomic_write_bytes(p, b"second, longer version")
    assert storage.read_bytes(p) == b"second, longer version"
    assert storage.identity(p) != before
    assert 0 <= storage.age_seconds(p) < 60
    storage.replace_prefix_bytes(p, 6, b"!tail")
    assert storage.read_bytes(p) == b"second!tail"
    storage.make_dir(root / "src")
    for name in ("a", "b", "z-last"):
        storage.atomic_write_bytes(root / "src" / name, name.encode())
    storage.rename_dir(root / "src", root / "dst", last="z-last")
    assert not (root / "src").exists()
    assert {n: storage.read_bytes(root / "dst" / n) for n in storage.listdir(root / "dst")} \
        == {"a": b"a", "b": b"b", "z-last": b"z-last"}


def test_writes_that_need_no_durability_are_there_after_a_sync(root):
    for i in range(5):
        storage.atomic_write_bytes(root / f"d{i}", b"%d" % i, durable=False)
        f = storage.write_new(root / f"n{i}")
        f.write(b"new %d" % i)
        f.close(sync=False)
    storage.sync_filesystem(root)
    for i in range(5):
        assert storage.read_bytes(root / f"d{i}") == b"%d" % i
        assert storage.read_bytes(root / f"n{i}") == b"new %d" % i


def test_a_write_is_all_or_nothing_unless_partial_writes_are_visible(root):
    """An aborted write leaves nothing on a store whose files appear whole; a store whose
    readers see a file while it is written (local) keeps what was written (a partial
    segment the next run resumes from)."""
    store = store_of(root)
    p = root / "w.bin"
    f = storage.write_new(p)
    f.write(b"x" * 4096)
    assert p.is_file() == store.partial_visible
    assert ("w.bin" in storage.list_sizes(root)) == store.partial_visible
    f.abort()
    if store.partial_visible:
        assert storage.read_bytes(p) == b"x" * 4096
    else:
        assert not p.exists() and storage.list_sizes(root) == {}
    # a write closed is there whole
    f = storage.write_new(root / "whole.bin")
    f.write(b"a" * 100)
    f.write(b"b" * 100)
    f.close()
    assert storage.read_bytes(root / "whole.bin") == b"a" * 100 + b"b" * 100


def test_a_small_held_file_can_be_taken_instead_of_written(root):
    f = storage.write_new(root / "held", hold=True)
    f.write(b"member bytes")
    assert f.take() == b"member bytes"
    f.abort()
    assert not (root / "held").exists()


def test_create_if_absent_has_one_winner(root):
    p = root / "lock"
    storage.create_exclusive(p, b"one")
    with pytest.raises(FileExistsError):
        storage.create_exclusive(p, b"two")
    assert storage.read_bytes(p) == b"one"
    storage.break_file(p)
    assert not p.exists()
    # racing writers: exactly one creates it
    won: list[bytes] = []
    lost: list[bytes] = []
    start = threading.Barrier(6)

    def race(i: int) -> None:
        data = b"writer %d" % i
        start.wait()
        try:
            storage.create_exclusive(p, data)
            won.append(data)
        except FileExistsError:
            lost.append(data)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and len(lost) == 5
    assert storage.read_bytes(p) == won[0]


@pytest.mark.parametrize("passphrase", [None, "racing passphrase"])
def test_runs_creating_one_archive_at_once_share_the_one_created(where, passphrase):
    """Backups started at once on a new location: exactly one creates the archive, the
    others open that one (not "already holds an archive", nor "not empty"), and an
    encrypted archive keeps the key file of its creator only."""
    start = threading.Barrier(5)
    got: list[tuple[str, bool]] = []
    failed: list[BaseException] = []

    def create() -> None:
        start.wait()
        try:
            archive, created = Archive.for_backup(where, bucket="b", vbuckets=8,
                                                  node="n:1", passphrase=passphrase)
            got.append((archive.meta["uuid"], created))
        except BaseException as exc:
            failed.append(exc)

    threads = [threading.Thread(target=create) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failed, failed
    assert sum(created for _, created in got) == 1
    opened = Archive.open(where, passphrase=passphrase)
    assert {uuid for uuid, _ in got} == {opened.meta["uuid"]}
    if passphrase is not None:
        keys = storage.location(where) / "keys"
        assert [n for n in storage.listdir(keys) if not n.startswith(".")] == \
            [f"{opened.key_id}.json"]
    with pytest.raises(ArchiveExistsError):
        Archive.create(where, bucket="b", vbuckets=8)


def test_pack_members_read_as_files(root):
    a, b = b"A" * 3000, bytes(range(200))
    storage.atomic_write_bytes(root / "pack-1", a + b)
    ma = Member(root / "pack-1", 0, len(a), "a.mpk.zst")
    mb = Member(root / "pack-1", len(a), len(b), "b.mpk.zst")
    cut = Member(root / "pack-1", len(a) + 100, 500, "cut.mpk.zst")  # the pack holds 100
    for scope in (False, True):
        with storage.pack_cache() if scope else _nothing():
            assert storage.stat_size(ma) == len(a) and storage.stat_size(cut) == 100
            with storage.open_read(mb) as f:
                assert storage.file_size(f) == len(b)
                f.seek(10)
                assert f.read(5) == b[10:15]
            with storage.open_read(ma) as f:
                assert f.read() == a
            with storage.open_read(cut) as f:
                assert f.read() == b[100:]
    assert ma.parent == root and str(ma).endswith("(in pack-1)")
    with pytest.raises(FileNotFoundError):
        storage.open_read(Member(root / "pack-2", 0, 10, "gone"))


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


# -- archives ------------------------------------------------------------------------------------


def test_archive_backups_resolve_and_verify(where):
    archive, full, inc = seed_004_archive(where)
    assert [b.id for b in archive.chain()] == [full["id"], inc["id"]]
    got = Archive.open(where).resolve_vbucket(0)
    # doc-1..doc-900 of the first history, new-901..new-960 of the second
    assert len(got) == 960 and b"doc-900" in got and b"new-960" in got and b"doc-950" not in got
    report = verify_archive(where)
    assert report.ok and report.files_checked == 2, report.problems


def test_the_archive_lock(where):
    Archive.create(where, bucket="default", vbuckets=4)
    store = store_of(where)
    lock = ArchiveLock(where, "backup").acquire()
    try:
        info = lock.holder()
        assert info["token"] == lock.token
        assert ("expires" in info) == store.lock_leases
        with pytest.raises(ArchiveLockedError):
            ArchiveLock(where, "purge").acquire()
    finally:
        lock.release()
    assert lock.holder() is None
    with ArchiveLock(where, "purge") as again:
        assert again.holder()["purpose"] == "purge"


def _packed_backup(where, vbs: range) -> tuple[Archive, dict]:
    archive = Archive.create(where, bucket="default", vbuckets=len(vbs))
    bw = archive.begin_backup("full")
    packer = Packer(bw.dir)
    sums = []
    for vb in vbs:
        w = bw.vbucket(vb, ArchivePosition.at(W, 0), [(W, 0)], packer=packer, sync=False)
        write_events(w, mutations(1, 30 + vb, per_snapshot=10, prefix=b"vb%d-" % vb))
        sums.append(w.close(ArchivePosition.at(W, 30 + vb)))
    packer.flush()
    storage.sync_filesystem(packer.dir)
    return archive, bw.commit(sums)


def test_packed_backup_reads_and_verifies(where):
    archive, manifest = _packed_backup(where, range(4))
    assert all("pack" in e["files"][0] for e in manifest["vbuckets"])
    report = verify_archive(where)
    assert report.ok and report.files_checked == 4, report.problems
    with storage.pack_cache():
        for vb in range(4):
            assert len(archive.resolve_vbucket(vb)) == 30 + vb


def test_merge_packs_where_the_store_packs_and_keeps_what_resolves(where):
    archive, _m = _packed_backup(where, range(4))
    bw = archive.begin_backup("incremental")
    sums = []
    for vb in range(4):
        w = bw.vbucket(vb, ArchivePosition.at(W, 30 + vb), [(W, 0)])
        write_events(w, mutations(31 + vb, 40 + vb, per_snapshot=5, prefix=b"vb%d-" % vb))
        sums.append(w.close(ArchivePosition.at(W, 40 + vb)))
    bw.commit(sums)
    archive = Archive.open(where)
    state = {vb: archive.resolve_vbucket(vb) for vb in range(4)}
    with archive.lock("merge"):
        plan = plan_merge(archive, None, None)
        staged = StagedMerge.begin(archive, plan)
        summaries = merge_vbuckets(staged.target, list(plan.vbuckets.values()))
        staged.commit(summaries)
        staged.publish()
    archive = Archive.open(where)
    assert archive.committed_ids() == [plan.merged_id]
    names = storage.listdir(archive.backup_dir(plan.merged_id))
    # small files go into packs exactly where the store says it packs
    assert any(n.startswith("pack-") for n in names) == store_of(where).packs, names
    assert {vb: archive.resolve_vbucket(vb) for vb in range(4)} == state
    assert verify_archive(where).ok


def test_executors_that_do_not_see_it_are_told_what_the_store_needs(where):
    from dcptool.pipeline.runtime import not_shared

    err = not_shared(str(storage.location(where)), ["host1: no such file"])
    assert "\n" not in err.message and "host1" in err.message
    # a store reached with an endpoint and credentials: the executors need those; else a
    # filesystem they share with the driver
    assert ("endpoint and credentials" in err.message) == store_of(where).needs_credentials
    assert ("shared by the driver" in err.message) == (not store_of(where).needs_credentials)
