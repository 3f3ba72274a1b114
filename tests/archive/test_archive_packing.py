"""Packed backups (dcptool/archive/packing.py): the small last segments of a task's
vbuckets stored together in packs, their summaries in done batches.

A backup task on object storage packs; these tests drive the writers with a Packer
directly, on a local directory and on the test suite's S3 server, and check that a packed
backup reads, verifies, resumes and commits like one of separate files."""
from __future__ import annotations

import json
import re

import pytest
from archiveutil import W, mutations, write_events

from dcptool.archive import Archive, ArchivePosition, storage
from dcptool.archive import packing
from dcptool.archive.packing import Packer
from dcptool.archive.verify import verify_archive

VBS = 16


@pytest.fixture(params=["local", "s3"])
def where(request, tmp_path):
    """An archive location: a local directory, or a prefix of a new bucket on the S3 server."""
    if request.param == "local":
        return str(tmp_path / "arch")
    _server, bucket = request.getfixturevalue("s3")
    return f"s3://{bucket}/arch"


def names_in(path) -> list[str]:
    return sorted(storage.listdir(storage.location(path)))


def spec(vb: int) -> tuple[ArchivePosition, list[tuple]]:
    """vbucket vb's events: 40 + 7*vb mutations (so the members differ in size)."""
    last = 40 + 7 * vb
    return ArchivePosition.at(W, last), mutations(1, last, per_snapshot=20,
                                                  prefix=b"vb%d-" % vb)


def write_vbuckets(bw, vbs, packer, **kw) -> list[dict]:
    out = []
    for vb in vbs:
        end, events = spec(vb)
        w = bw.vbucket(vb, ArchivePosition.at(W, 0), [(W, 0)], packer=packer, sync=False, **kw)
        write_events(w, events)
        out.append(w.close(end))
    return out


def finish(packer: Packer) -> None:
    """What a backup task does last: the packer's last pack and batch, then everything
    durable (on S3: the background uploads done)."""
    packer.flush()
    storage.sync_filesystem(packer.dir)


def packed_backup(where, vbs) -> tuple:
    """A new archive at `where` with one packed full backup of vbuckets `vbs` (as a backup
    task writes it): (archive, backup writer, packer, manifest)."""
    archive = Archive.create(where, bucket="default", vbuckets=VBS)
    bw = archive.begin_backup("full")
    packer = Packer(bw.dir)
    sums = write_vbuckets(bw, vbs, packer)
    finish(packer)
    return archive, bw, packer, bw.commit(sums)


def expected_keys(vb: int) -> set[bytes]:
    end, _ = spec(vb)
    return {b"vb%d-%d" % (vb, s) for s in range(1, end.seqno + 1)}


def test_packed_backup_reads_and_verifies_like_separate_files(where, monkeypatch):
    monkeypatch.setattr(packing, "PACK_BYTES", 3000)  # several packs from small vbuckets
    archive, bw, packer, manifest = packed_backup(where, range(VBS))

    names = names_in(bw.dir)
    packs = [n for n in names if n.startswith("pack-")]
    batches = [n for n in names if n.startswith("done-")]
    assert len(packs) >= 3 and len(packs) == packer.packs_written
    assert len(batches) == packer.batches_written == len(packs)
    # every vbucket's data is a member of a pack: no file of its own, no done file
    assert not [n for n in names if n.startswith("vb-")], names
    assert set(names) == set(packs) | set(batches) | {"backup.json", "manifest.json"}
    for e in manifest["vbuckets"]:
        (f,) = e["files"]
        assert f["name"] == f"vb-{e['vbucket']:04d}-000.mpk.zst"
        assert f["pack"] in packs and isinstance(f["offset"], int)
    # members lie one after another in each pack
    by_pack: dict[str, list[dict]] = {}
    for e in manifest["vbuckets"]:
        by_pack.setdefault(e["files"][0]["pack"], []).append(e["files"][0])
    for p, fs in by_pack.items():
        fs.sort(key=lambda f: f["offset"])
        assert fs[0]["offset"] == 0
        assert all(a["offset"] + a["size"] == b["offset"] for a, b in zip(fs, fs[1:]))
        assert storage.stat_size(storage.location(bw.dir) / p) == fs[-1]["offset"] + fs[-1]["size"]

    report = verify_archive(where)
    assert report.ok, report.problems
    assert report.files_checked == VBS
    for vb in range(VBS):
        got = archive.resolve_vbucket(vb)
        assert set(got) == expected_keys(vb)


def test_s3_packed_archive_copied_to_a_directory_is_an_archive(s3, tmp_path):
    """docs/archive-format.md: the objects, copied into a directory, are an archive."""
    server, bucket = s3
    archive, bw, packer, _manifest = packed_backup(f"s3://{bucket}/p", range(VBS))
    c = server.client()
    for o in c.list_objects_v2(Bucket=bucket, Prefix="p/")["Contents"]:
        dest = tmp_path / "copy" / o["Key"][len("p/"):]
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(c.get_object(Bucket=bucket, Key=o["Key"])["Body"].read())
    report = verify_archive(tmp_path / "copy")
    assert report.ok, report.problems
    local = Archive.open(tmp_path / "copy")
    assert set(local.resolve_vbucket(5)) == expected_keys(5)


def test_flipped_byte_in_a_pack_names_the_member(where):
    archive, bw, packer, manifest = packed_backup(where, range(4))
    f = manifest["vbuckets"][2]["files"][0]
    pack = storage.location(bw.dir) / f["pack"]
    data = bytearray(storage.read_bytes(pack))
    data[f["offset"] + f["size"] // 2] ^= 0x01
    if not storage.store_of(pack).local:
        storage.put_bytes(pack, bytes(data))
    else:
        pack.write_bytes(bytes(data))
    report = verify_archive(where)
    assert not report.ok
    bad = [p for p in report.problems if "SHA-256" in p.message]
    assert [p.vbucket for p in bad] == [2], report.problems
    assert bad[0].path.endswith(f"vb-0002-000.mpk.zst (in {f['pack']})")
    # a restore's up-front check refuses it too
    from dcptool.archive.errors import CorruptFileError
    from dcptool.pipeline.restore import check_chain_files

    with pytest.raises(CorruptFileError, match="vb-0002-000"):
        check_chain_files(Archive.open(where), Archive.open(where).chain(), range(4))
    check_chain_files(Archive.open(where), Archive.open(where).chain(), [0, 1, 3])


def test_resume_keeps_the_vbuckets_of_written_batches(where, monkeypatch):
    """A task killed after some batches: their vbuckets are complete; the others restart
    (their members in a pack without a batch are not trusted); the result verifies."""
    monkeypatch.setattr(packing, "PACK_BYTES", 1000)
    archive = Archive.create(where, bucket="default", vbuckets=VBS)
    bw = archive.begin_backup("full")
    packer = Packer(bw.dir)
    write_vbuckets(bw, range(10), packer)  # some flushes happen on the way
    if not packer.pending:
        write_vbuckets(bw, [10], packer)
    assert packer.batches_written >= 2 and packer.pending
    # the "crash": vbuckets 10.. never finish, what the packer holds is never written
    bw.lock.release()

    resumed = archive.resume_backup()
    rec = resumed.recover()
    complete = {vb for vb, r in rec.items() if r.complete}
    batched = set()
    for n in names_in(resumed.dir):
        if n.startswith("done-"):
            doc = json.loads(storage.read_bytes(storage.location(resumed.dir) / n))
            batched |= {s["vbucket"] for s in doc["vbuckets"]}
    assert complete == batched and 0 < len(complete) < 11
    plan = resumed.plan(range(VBS))
    assert set(plan.kept) == complete
    packer2 = Packer(resumed.dir)
    sums = list(plan.kept.values()) + write_vbuckets(
        resumed, sorted(plan.starts), packer2)
    finish(packer2)
    manifest = resumed.commit(sums)
    assert len(manifest["vbuckets"]) == VBS
    names = names_in(resumed.dir)
    used = {e["files"][0]["pack"] for e in manifest["vbuckets"]}
    # the pack no batch named (the crash's) is gone; every pack left is used
    assert {n for n in names if n.startswith("pack-")} == used
    report = verify_archive(where)
    assert report.ok, report.problems
    for vb in range(VBS):
        assert set(archive.resolve_vbucket(vb)) == expected_keys(vb)


def test_a_newer_batch_replaces_an_older_attempt_and_commit_drops_it(where):
    """A retried task writes its vbuckets again: the newest batch is the vbuckets' state,
    and the commit deletes the failed attempt's pack and batch."""
    archive = Archive.create(where, bucket="default", vbuckets=VBS)
    bw = archive.begin_backup("full")
    p1 = Packer(bw.dir)
    write_vbuckets(bw, range(4), p1)
    finish(p1)
    first = [n for n in names_in(bw.dir) if n.startswith(("pack-", "done-"))]
    p2 = Packer(bw.dir)
    sums = write_vbuckets(bw, range(4), p2)  # the retry (resume=False)
    pack2 = f"pack-{p2.token}.mpk.zst"
    finish(p2)
    rec = bw.recover()
    assert all(r.complete for r in rec.values())
    assert {r.summary["files"][0]["pack"] for r in rec.values()} == {pack2}
    bw.commit(sums)
    left = names_in(bw.dir)
    assert not set(first) & set(left)
    assert pack2 in left
    assert verify_archive(where).ok


def test_pack_cache_reads_a_pack_once_for_all_its_members(s3):
    """On S3 a reader in a pack_cache scope costs one GET per pack, not one per member
    (counted with botocore's own event hooks on the real client)."""
    _server, bucket = s3
    archive, bw, packer, _manifest = packed_backup(f"s3://{bucket}/c", range(VBS))
    client = storage.s3_client(storage.location(f"s3://{bucket}").settings)
    gets = []

    def count(params, **kw):
        gets.append(params.get("Key"))

    client.meta.events.register("provide-client-params.s3.GetObject", count)
    try:
        backup = Archive.open(f"s3://{bucket}/c").chain()[-1]
        with storage.pack_cache():
            for vb in range(VBS):
                assert set(r[7] for r in backup.records(vb) if r[0] == 3) == expected_keys(vb)
        assert len([k for k in gets if re.search(r"/pack-[0-9a-f]{16}\.mpk\.zst$", k)]) == 1
        gets.clear()
        # outside a scope: ranged reads of each member
        for vb in range(3):
            list(backup.records(vb))
        assert len(gets) == 3
    finally:
        client.meta.events.unregister("provide-client-params.s3.GetObject", count)


def test_local_writer_without_packer_is_unchanged(tmp_path):
    archive = Archive.create(tmp_path / "a", bucket="default", vbuckets=4)
    bw = archive.begin_backup("full")
    sums = []
    for vb in range(2):
        end, events = spec(vb)
        w = bw.vbucket(vb, ArchivePosition.at(W, 0), [(W, 0)])
        write_events(w, events)
        sums.append(w.close(end))
    m = bw.commit(sums)
    assert not any("pack" in f for e in m["vbuckets"] for f in e["files"])
    assert "vb-0000.done.json" in names_in(bw.dir)


def test_encrypted_packed_backup_reads_verifies_and_names_a_changed_member(where, monkeypatch):
    """A member is sealed under its own name and offsets (as a file of its own would be):
    it opens from the pack, and a byte changed in the pack is caught for that member."""
    from dcptool.archive import crypto

    monkeypatch.setenv(crypto.PASSPHRASE_ENV, "correct horse battery staple")
    try:
        archive = Archive.create(where, bucket="default", vbuckets=VBS,
                                 passphrase="correct horse battery staple")
        assert archive.encrypted
        bw = archive.begin_backup("full")
        packer = Packer(bw.dir, key=archive.key)
        sums = write_vbuckets(bw, range(6), packer)
        finish(packer)
        manifest = bw.commit(sums)
        batch = next(n for n in names_in(bw.dir) if n.startswith("done-"))
        assert b"vbucket" not in storage.read_bytes(storage.location(bw.dir) / batch)  # sealed
        assert verify_archive(where).ok
        archive = Archive.open(where)
        for vb in range(6):
            assert set(archive.resolve_vbucket(vb)) == expected_keys(vb)
        f = manifest["vbuckets"][4]["files"][0]
        pack = storage.location(bw.dir) / f["pack"]
        data = bytearray(storage.read_bytes(pack))
        data[f["offset"] + 40] ^= 0x01
        if not storage.store_of(pack).local:
            storage.put_bytes(pack, bytes(data))
        else:
            pack.write_bytes(bytes(data))
        report = verify_archive(where)
        assert {p.vbucket for p in report.problems} == {4}, report.problems
        assert all("tampered" in p.message for p in report.problems)
    finally:
        pass
