"""The opened archive is the one object that carries an archive (its location and, when
encrypted, its data key) through the layers: it pickles for Spark tasks with its key, and
`crypto` keeps no state of its own."""
from __future__ import annotations

import pickle
import types

import pytest

from dcptool.archive import Archive, ArchivePosition, crypto
from dcptool.archive.format import read_json
from dcptool.archive.frames import iter_file_records

PASS = "handle passphrase"
W = 0xB2B2_0000_0000_0001


def _one_backup(archive: Archive) -> str:
    bw = archive.begin_backup("full")
    w = bw.vbucket(0, ArchivePosition.at(W, 0), [(W, 0)])
    w.write([(2, 1, 3, 2)] + [(3, s, 1, 1_700_000_000_000_000_000 + s, 0, 0, 0,
                                b"\x00key-%d" % s, b"secret value %d" % s, None)
                               for s in (1, 2, 3)])
    summary = w.close(ArchivePosition.at(W, 3))
    return bw.commit([summary])["id"]


def test_an_opened_encrypted_archive_pickles_with_its_key_and_reads_after(tmp_path,
                                                                         monkeypatch):
    monkeypatch.delenv(crypto.PASSPHRASE_ENV, raising=False)
    monkeypatch.delenv(crypto.PASSPHRASE_FILE_ENV, raising=False)
    monkeypatch.delenv(crypto.PASSPHRASE_COMMAND_ENV, raising=False)
    a = Archive.create(tmp_path / "enc", bucket="b", vbuckets=2, passphrase=PASS)
    bid = _one_backup(a)
    shipped = pickle.dumps(a)
    assert PASS.encode() not in shipped
    assert a.key is not None and a.key.secret().hex() not in repr(a)

    # no passphrase anywhere: opening by path fails, the unpickled handle reads
    with pytest.raises(crypto.PassphraseMissingError):
        Archive.open(tmp_path / "enc")
    b = pickle.loads(shipped)
    assert isinstance(b, Archive) and b is not a
    assert (b.path, b.meta, b.key_id) == (a.path, a.meta, a.key_id)
    assert b.key == a.key and b.key is not a.key
    assert b.committed_ids() == [bid]
    data_file = b.backup_dir(bid) / "vb-0000-000.mpk.zst"
    assert b"secret value" not in data_file.read_bytes()  # sealed on disk
    records = list(iter_file_records(data_file, key=b.key))
    assert [r[8] for r in records if r[0] == 3] == [b"secret value %d" % s for s in (1, 2, 3)]
    done = read_json(b.backup_dir(bid) / "vb-0000.done.json", b.key)
    assert done["vbucket"] == 0 and done["counts"]["mutations"] == 3
    # the same file without the key: refused, not read as garbage
    with pytest.raises(crypto.PassphraseMissingError):
        list(iter_file_records(data_file))


def test_a_plain_archive_pickles_without_a_key(tmp_path):
    a = Archive.create(tmp_path / "plain", bucket="b", vbuckets=2)
    bid = _one_backup(a)
    b = pickle.loads(pickle.dumps(a))
    assert b.key is None and b.key_id is None and b.path == a.path
    assert len(b.resolve_vbucket(0)) == 3 and b.committed_ids() == [bid]


def test_crypto_keeps_no_module_level_mutable_state():
    """No registry of keys, archives or passphrases: every name at module level is a
    function, a class, a module or an immutable constant."""
    immutable = (str, bytes, int, float, bool, tuple, frozenset, type(None))
    mutable = {}
    for name, value in vars(crypto).items():
        if name.startswith("__") or isinstance(value, (types.FunctionType, types.ModuleType,
                                                       type, immutable)):
            continue
        if callable(value) and getattr(value, "__module__", "").startswith("__future__"):
            continue
        mutable[name] = type(value).__name__
    # `annotations` is the __future__ feature object, not state
    mutable.pop("annotations", None)
    assert mutable == {}, mutable
    for gone in ("_KEYS", "_ROOTS", "_REQUESTS", "_OPENED_WITH", "file_key", "register",
                 "request_encryption", "forget_keys", "_PASSPHRASE_FILE"):
        assert not hasattr(crypto, gone), gone
