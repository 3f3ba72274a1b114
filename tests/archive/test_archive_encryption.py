"""Encrypted archives through the archive API (docs/archive-format.md, Encrypted archives):
the same backups, merges and reads as a plain archive, nothing of the documents in the
clear, and every changed byte caught by the file it is in."""
from __future__ import annotations

import json
import os
import pickle

import pytest
from fileutil import tree_bytes
from test_archive_merging import _chain, _merge, _state

from dcptool.archive import Archive, ArchivePosition, crypto, storage
from dcptool.archive.archive import backup_path
from dcptool.archive.errors import ArchiveError, CorruptFileError
from dcptool.archive.frames import iter_file_records, scan_stored_frames
from dcptool.archive.verify import verify_archive

PASS = "correct horse battery staple"
W = 0xA1A1_0000_0000_0001


@pytest.fixture(autouse=True)
def passphrase(monkeypatch):
    """The passphrase in the environment (no key outlives the handle that holds it)."""
    monkeypatch.setenv(crypto.PASSPHRASE_ENV, PASS)
    monkeypatch.delenv(crypto.PASSPHRASE_FILE_ENV, raising=False)
    yield


def encrypted_chain(path, rounds: int = 4) -> list[str]:
    return _chain(path, rounds, passphrase=PASS)


def test_encrypted_chain_reads_like_a_plain_one_and_hides_the_documents(tmp_path):
    plain_ids = _chain(tmp_path / "plain")
    ids = encrypted_chain(tmp_path / "enc")
    plain, enc = Archive.open(tmp_path / "plain"), Archive.open(tmp_path / "enc")
    assert enc.encrypted and not plain.encrypted
    assert enc.meta["version"] == 4 and enc.meta["encryption"]["cipher"] == "AES-256-GCM"
    assert _state(enc) == _state(plain)
    assert len(ids) == len(plain_ids)
    report = verify_archive(enc.path)
    assert report.ok, [str(p) for p in report.problems]
    assert report.records_checked == verify_archive(plain.path).records_checked
    files = tree_bytes(tmp_path / "enc")
    assert any(n.startswith("keys/") for n in files)
    for name, data in files.items():
        for needle in (b"k0-1", b"n1-1-0", b'"v":', b"mutations", b"sha256", b'"parent"'):
            assert needle not in data, (name, needle)
    # the plain archive holds them, so the search above looks at the right things
    assert any(b"k0-1" in d for d in tree_bytes(tmp_path / "plain").values())
    # a merge of an encrypted archive stays encrypted and reads the same
    state = _state(enc)
    plan = _merge(enc, last=ids[2])
    enc = Archive.open(tmp_path / "enc")
    assert enc.committed_ids() == [plan.merged_id, ids[3]]
    assert _state(enc) == state
    assert verify_archive(enc.path).ok
    for name, data in tree_bytes(tmp_path / "enc").items():
        assert b"k0-1" not in data, name


def test_a_new_process_needs_the_passphrase(tmp_path, monkeypatch):
    encrypted_chain(tmp_path / "enc", rounds=2)
    state = _state(Archive.open(tmp_path / "enc"))
    monkeypatch.setenv(crypto.PASSPHRASE_ENV, "not it")
    with pytest.raises(crypto.WrongPassphraseError, match="wrong passphrase"):
        Archive.open(tmp_path / "enc")
    monkeypatch.delenv(crypto.PASSPHRASE_ENV)
    with pytest.raises(crypto.PassphraseMissingError):
        Archive.open(tmp_path / "enc")
    # a passphrase file (its first line)
    pf = tmp_path / "pass.txt"
    pf.write_text(PASS + "\nignored\n")
    assert _state(Archive.open(tmp_path / "enc",
                               passphrase=crypto.PassphraseSource(file=str(pf)))) == state
    # files read without a loaded key fail with a clear error, not garbage
    bdir = next((tmp_path / "enc" / "backups").iterdir())
    with pytest.raises(crypto.PassphraseMissingError):
        list(iter_file_records(bdir / "vb-0000-000.mpk.zst"))


def test_passphrase_change_without_rewriting_data(tmp_path, monkeypatch):
    root = tmp_path / "enc"
    encrypted_chain(root, rounds=2)
    a = Archive.open(root)
    state = _state(a)
    before = {n: d for n, d in tree_bytes(root).items() if n.startswith("backups/")}
    [old] = crypto.list_keys(a.path, a.meta)
    monkeypatch.delenv(crypto.WEAKEN_KDF_ENV)  # the added key file has the real cost
    new = crypto.add_key(a.path, a.meta, a.key, "a new passphrase",
                         "2099-01-01T00:00:00.000000Z")
    assert {k["id"] for k in crypto.list_keys(a.path, a.meta)} == {old["id"], new["id"]}
    with pytest.raises(ArchiveError, match="no key"):
        crypto.remove_key(a.path, a.meta, a.key, "0000")
    crypto.remove_key(a.path, a.meta, a.key, old["id"])
    with pytest.raises(ArchiveError, match="last key"):
        crypto.remove_key(a.path, a.meta, a.key, new["id"])
    with pytest.raises(crypto.WrongPassphraseError):
        Archive.open(root)  # the old passphrase no longer opens it
    monkeypatch.setenv(crypto.PASSPHRASE_ENV, "a new passphrase")
    a = Archive.open(root)
    assert _state(a) == state
    assert verify_archive(root).ok
    after = {n: d for n, d in tree_bytes(root).items() if n.startswith("backups/")}
    assert after == before  # no data file or manifest was rewritten
    key = json.loads((root / new["file"]).read_text())
    assert key["kdf"]["name"] == "scrypt" and key["kdf"]["n"] == crypto.SCRYPT_N
    assert PASS not in json.dumps(key) and "a new passphrase" not in json.dumps(key)


def _flip(path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_tampered_frame_manifest_key_file_and_archive_json_are_each_detected(tmp_path):
    root = tmp_path / "enc"
    ids = encrypted_chain(root, rounds=2)
    a = Archive.open(root)
    crypto.add_key(a.path, a.meta, a.key, "second", "2099-01-01T00:00:00.000000Z")
    assert verify_archive(root).ok
    bdir = a.backup_dir(ids[0])

    # a frame: one byte in the middle of the data file's first sealed frame
    data_file = bdir / "vb-0001-000.mpk.zst"
    _flip(data_file, 60)
    report = verify_archive(root)
    mine = [p for p in report.problems if p.path == str(data_file)]
    assert mine and all("tampered" in p.message for p in mine), [str(p) for p in mine]
    assert {p.path for p in report.problems} == {str(data_file)}, [str(p) for p in report.problems]
    with pytest.raises(CorruptFileError, match="tampered"):
        list(iter_file_records(data_file, key=a.key))
    _flip(data_file, 60)

    # a manifest
    manifest = backup_path(root, ids[1]) / "manifest.json"
    _flip(manifest, manifest.stat().st_size - 5)
    report = verify_archive(root)
    assert [p.path for p in report.problems if "tampered" in p.message] == [str(manifest)]
    with pytest.raises(CorruptFileError, match="tampered"):
        Archive.open(root).manifest(ids[1])
    _flip(manifest, manifest.stat().st_size - 5)

    # a done file and backup.json (no reader of a committed backup needs them)
    for victim in (bdir / "vb-0002.done.json", bdir / "backup.json"):
        _flip(victim, 40)
        report = verify_archive(root)
        assert [p.path for p in report.problems] == [str(victim)]
        assert "tampered" in report.problems[0].message
        _flip(victim, 40)

    # a key file (not the one that opened the archive)
    other = sorted((root / "keys").iterdir())
    first_id = crypto.which_key(root, a.meta, PASS)
    victim = next(p for p in other if p.stem != first_id)
    doc = json.loads(victim.read_text())
    doc["kdf"]["n"] = 1 << 14  # weaker parameters slipped in
    victim.write_text(json.dumps(doc))
    report = verify_archive(root)
    assert [p.path for p in report.problems] == [str(victim)]
    assert "tampered" in report.problems[0].message
    victim.unlink()

    # archive.json (in the clear, but authenticated)
    meta = json.loads((root / "archive.json").read_text())
    meta["vbuckets"] = 8
    (root / "archive.json").write_text(json.dumps(meta))
    with pytest.raises(CorruptFileError, match="archive.json.*tampered"):
        Archive.open(root)


def test_frames_cannot_be_moved_or_swapped_and_files_cannot_go_plain(tmp_path):
    root = tmp_path / "enc"
    ids = encrypted_chain(root, rounds=2)
    a = Archive.open(root)
    bdir = a.backup_dir(ids[0])
    # one backup's manifest copied over another's: bound to its backup id
    m0, m1 = (backup_path(root, i) / "manifest.json" for i in ids)
    saved = m1.read_bytes()
    m1.write_bytes(m0.read_bytes())
    with pytest.raises(CorruptFileError, match="tampered"):
        Archive.open(root).manifest(ids[1])
    m1.write_bytes(saved)
    # a data file copied over another vbucket's (same backup)
    f0, f1 = bdir / "vb-0000-000.mpk.zst", bdir / "vb-0001-000.mpk.zst"
    saved = f1.read_bytes()
    f1.write_bytes(f0.read_bytes())
    with pytest.raises(CorruptFileError, match="tampered"):
        list(iter_file_records(f1, key=a.key))
    f1.write_bytes(saved)
    # a plain manifest slipped into the encrypted archive
    m1.write_bytes(json.dumps(a.manifest(ids[1])).encode())
    with pytest.raises(CorruptFileError, match="not encrypted"):
        Archive.open(root).manifest(ids[1])


def test_a_torn_encrypted_partial_backup_recovers_and_resumes(tmp_path):
    from archiveutil import write_events
    from test_archive_recovery import events

    root = tmp_path / "enc"
    a = Archive.create(root, bucket="b", vbuckets=2, passphrase=PASS)
    bw = a.begin_backup("full", block_size=3000)
    w1 = bw.vbucket(1, ArchivePosition.at(W, 0), [(W, 0)])
    write_events(w1, events(1, 500))
    w1.abort()
    path1 = bw.dir / "vb-0001-000.mpk.zst"
    size = path1.stat().st_size
    os.truncate(path1, size - 700)
    bw.abort()
    bw2 = a.resume_backup()
    w1 = bw2.vbucket(1, ArchivePosition.at(W, 0), [(W, 0)], resume=True)
    assert 0 < w1.position.seqno < 500
    write_events(w1, events(w1.position.seqno + 1, 500))
    s1 = w1.close(ArchivePosition.at(W, 500))
    w0 = bw2.vbucket(0, ArchivePosition.at(W, 0), [(W, 0)], resume=True)
    write_events(w0, events(1, 500))
    s0 = w0.close(ArchivePosition.at(W, 500))
    bw2.commit([s0, s1])
    report = verify_archive(root)
    assert report.ok, [str(p) for p in report.problems]
    seqnos = [r[1] for r in a.backup(bw.id).records(1) if r[0] == 3]
    assert seqnos == list(range(1, 501))
    # the writer sealed the file's frames under one subkey (one salt); the frame that
    # recovery cut and sealed again got a fresh one
    with storage.open_read(path1) as f:
        offsets = [o for o, _n, _fr in scan_stored_frames(f, str(path1), key=a.key)]
    raw = path1.read_bytes()
    salts = [raw[o + 9:o + 25] for o in offsets]
    assert len(set(salts[:-1])) == 1 and len(salts) > 2


def test_keys_travel_to_tasks_but_never_show(tmp_path, monkeypatch):
    root = tmp_path / "enc"
    encrypted_chain(root, rounds=1)
    a = Archive.open(root)
    want = len(_state(a)[0])
    dk = a.key
    assert "<secret>" in repr(dk) and dk._key.hex() not in repr(dk)
    assert dk._key.hex() not in repr(a)
    with pytest.raises(TypeError):
        pickle.dumps(dk)
    # what run_tasks ships to an executor: a task holding the opened archive (its key in it)
    shipped = pickle.dumps(_Task(a))
    monkeypatch.delenv(crypto.PASSPHRASE_ENV)
    with pytest.raises(crypto.PassphraseMissingError):
        _Task(str(root))(0)
    assert pickle.loads(shipped)(0) == want  # no passphrase in the executor


class _Task:
    def __init__(self, archive):
        self.archive = archive

    def __call__(self, vb: int) -> int:
        a = self.archive if isinstance(self.archive, Archive) else Archive.open(self.archive)
        return len(a.resolve_vbucket(vb))


def test_encrypted_archive_on_s3(s3, monkeypatch):
    server, bucket = s3
    url = f"s3://{bucket}/enc"
    ids = _chain(url, rounds=3, passphrase=PASS)
    a = Archive.open(url)
    assert a.encrypted
    state = _state(a)
    client = server.client()
    keys = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="enc/"):
        keys += [o["Key"] for o in page.get("Contents", ())]
    assert any(k.startswith("enc/keys/") for k in keys)
    for k in keys:
        body = client.get_object(Bucket=bucket, Key=k)["Body"].read()
        assert b"k0-1" not in body and b"sha256" not in body, k
    assert verify_archive(url).ok
    _merge(a, last=ids[1])
    a = Archive.open(url)
    assert _state(a) == state and verify_archive(url).ok
    # a changed byte in an object is reported for that object
    bid = a.committed_ids()[0]
    key = f"enc/backups/{bid}/vb-0002-000.mpk.zst"
    data = bytearray(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    data[50] ^= 1
    client.put_object(Bucket=bucket, Key=key, Body=bytes(data))
    report = verify_archive(url)
    assert {p.path for p in report.problems} == {f"s3://{bucket}/{key}"}
    assert all("tampered" in p.message for p in report.problems)


def test_remove_and_prune_on_an_encrypted_archive(tmp_path):
    from test_archive_retention import check_kept, make_chain, times40

    from dcptool.archive.retention import Policy, remove_archive_backups, select_prune

    root = tmp_path / "enc"
    archive, ids, model = make_chain(root, times40()[:8], fulls={0, 5}, passphrase=PASS)
    assert archive.encrypted
    with archive.lock("remove"):
        res = remove_archive_backups(archive, [ids[0], ids[3]])
    kept = [ids[i] for i in (1, 2, 4, 5, 6, 7)]
    check_kept(archive, model, kept, res.renamed)
    drop, reasons = select_prune(archive, Policy(last=2))
    assert drop
    with archive.lock("prune"):
        remove_archive_backups(archive, drop, reasons=reasons)
    assert verify_archive(root).ok
    for name, data in tree_bytes(root).items():
        assert b"k0-" not in data and b'"new"' not in data, name
    # a new process (no key loaded) reads what is left only with the passphrase
    assert len(Archive.open(root).committed_ids()) >= 2


def test_new_key_files_use_owasp_scrypt_cost_and_old_cost_files_still_open(tmp_path,
                                                                          monkeypatch):
    """New key files: scrypt N=2^17, r=8, p=1; a key file written at N=2^15 (before the
    change) opens the archive all the same."""
    assert (crypto.SCRYPT_N, crypto.SCRYPT_R, crypto.SCRYPT_P) == (1 << 17, 8, 1)
    monkeypatch.delenv(crypto.WEAKEN_KDF_ENV)  # the run's cheap key files: not here
    root = tmp_path / "enc"
    _chain(root, 1, passphrase=PASS)
    a = Archive.open(root)
    (first,) = crypto.list_keys(a.path, a.meta)
    assert first["kdf"] == {"name": "scrypt", "n": 1 << 17, "r": 8, "p": 1}
    # a key file as the earlier release wrote it: N=2^15
    dk, _key_id = crypto.unlock(a.path, a.meta)
    old = crypto.make_key_file(a.meta["uuid"], dk, "old cost", n=1 << 15, created="2020")
    assert old["kdf"]["n"] == 1 << 15
    crypto.write_key_file(a.path, old)
    crypto.remove_key(a.path, a.meta, a.key, first["id"])
    with pytest.raises(crypto.WrongPassphraseError):
        Archive.open(root)
    monkeypatch.setenv(crypto.PASSPHRASE_ENV, "old cost")
    a = Archive.open(root)
    assert a.key_id == old["id"]
    assert verify_archive(root).ok
