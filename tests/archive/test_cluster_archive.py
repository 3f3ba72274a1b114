"""Cluster archives (dcptool/archive/cluster.py): a bucket archive per bucket, and the
record of each backup run, on every store (`where`, tests/archive/conftest.py)."""
from __future__ import annotations

import threading

import pytest
from storefixtures import s3_bucket, where  # noqa: F401 (fixtures)
from archiveutil import W, backup, mutations

from dcptool.archive import Archive, ArchivePosition, storage
from dcptool.archive.cluster import ClusterArchive, archive_kind, check_bucket_name
from dcptool.archive.crypto import WrongPassphraseError
from dcptool.archive.errors import (
    ArchiveError,
    ArchiveExistsError,
    ArchiveLockedError,
    NotAnArchiveError,
)

RUN = {"cluster": {"uuid": "c0ffee"},
       "buckets": {"travel": {"backup": None, "settings": {"ramQuota": 100}}},
       "users": [{"id": "ann", "roles": ["data_backup[travel]"], "password_hash": "x"}]}


def one_backup(archive: Archive, n: int) -> dict:
    return backup(archive, "full", {0: {
        "start": ArchivePosition.at(W, 0), "end": ArchivePosition.at(W, n),
        "events": mutations(1, n), "flog": [(W, 0)]}})


def test_buckets_and_runs_round_trip(where):
    cluster = ClusterArchive.create(where)
    assert archive_kind(where) == "cluster"
    assert cluster.bucket_names() == [] and cluster.run_ids() == []
    made = {}
    for name, n in (("travel", 30), ("beer-sample", 12)):
        archive, created = cluster.bucket_for_backup(name, vbuckets=4, node="n:1")
        assert created
        made[name] = one_backup(archive, n)["id"]
        # a bucket archive is a whole archive: it opens alone, at its own path
        assert archive_kind(cluster.bucket_path(name)) == "bucket"
        assert len(Archive.open(cluster.bucket_path(name)).resolve_vbucket(0)) == n
    again, created = cluster.bucket_for_backup("travel", vbuckets=4, node="n:1")
    assert not created and again.uuid == cluster.open_bucket("travel").uuid
    first = cluster.new_run_id()
    cluster.write_run(first, RUN)
    second = cluster.new_run_id()
    assert second > first
    cluster.write_run(second, {**RUN, "buckets": {k: {"backup": v} for k, v in made.items()}})
    reopened = ClusterArchive.open(where)
    assert reopened.bucket_names() == ["beer-sample", "travel"]
    assert reopened.run_ids() == [first, second]
    assert reopened.run()["buckets"] == {k: {"backup": v} for k, v in made.items()}
    assert reopened.run(first)["users"] == RUN["users"]
    # a run is written once
    with pytest.raises(FileExistsError):
        reopened.write_run(first, RUN)
    with pytest.raises(ArchiveError, match="no run"):
        reopened.run("20200101T000000.000000Z")
    with pytest.raises(ArchiveError, match="not a run id"):
        reopened.run("../../archive")


def test_the_kinds_of_archive_are_told_apart(where):
    assert archive_kind(where) is None
    Archive.create(where, bucket="b", vbuckets=4)
    assert archive_kind(where) == "bucket"
    with pytest.raises(NotAnArchiveError, match="not describe a dcptool cluster archive"):
        ClusterArchive.open(where)
    with pytest.raises(ArchiveExistsError):
        ClusterArchive.create(where)


@pytest.mark.parametrize("name", [".hidden", "..", "a/b", "a" * 101, "", "sp ace", "é"])
def test_bucket_names_that_are_not_couchbase_names_are_refused(name):
    with pytest.raises(ArchiveError, match="is not a bucket name"):
        check_bucket_name(name)


def test_couchbase_bucket_names_are_taken():
    for name in ("travel-sample", "beer_sample", "a.b", "50%", "A" * 100):
        assert check_bucket_name(name) == name


def test_encrypted_runs_and_buckets_open_with_the_passphrase(where):
    cluster = ClusterArchive.create(where, passphrase="cluster pass")
    archive, _ = cluster.bucket_for_backup("travel", vbuckets=4, node="n:1")
    assert archive.encrypted
    one_backup(archive, 5)
    run_id = cluster.new_run_id()
    cluster.write_run(run_id, RUN)
    # the run file holds no password hash in the clear
    raw = storage.read_bytes(storage.location(where) / "runs" / f"{run_id}.json")
    assert b"data_backup" not in raw and b"password_hash" not in raw
    opened = ClusterArchive.open(where, passphrase="cluster pass")
    assert opened.run()["users"] == RUN["users"]
    assert len(opened.open_bucket("travel").resolve_vbucket(0)) == 5
    with pytest.raises(WrongPassphraseError):
        ClusterArchive.open(where, passphrase="not it")
    # a changed byte of a sealed run is found
    path = storage.location(where) / "runs" / f"{run_id}.json"
    storage.atomic_write_bytes(path, raw[:-3] + bytes([raw[-3] ^ 1]) + raw[-2:])
    with pytest.raises(ArchiveError, match="damaged"):
        opened.run(run_id)


def test_runs_creating_one_cluster_archive_at_once_have_one_winner(where):
    start = threading.Barrier(4)
    won: list[str] = []
    lost: list[BaseException] = []

    def create() -> None:
        start.wait()
        try:
            won.append(ClusterArchive.create(where).uuid)
        except ArchiveExistsError as exc:
            lost.append(exc)

    threads = [threading.Thread(target=create) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and len(lost) == 3
    assert ClusterArchive.open(where).uuid == won[0]


def test_the_cluster_lock_is_one_writers(where):
    cluster = ClusterArchive.create(where)
    with cluster.lock("backup"):
        with pytest.raises(ArchiveLockedError):
            cluster.lock("backup").acquire()
