"""Encryption at rest (see docs/archive-format.md, "Encrypted archives").

An encrypted archive has one random 256-bit *data key*. It never reaches a file in the
clear: each `ARCHIVE/keys/KEYID.json` holds it wrapped (AES-256-GCM) under a key derived
from one passphrase with scrypt, so a passphrase is added, changed or removed by writing or
deleting one small file, never by rewriting data (restic's model).

Everything under `backups/` is sealed with AES-256-GCM under *subkeys* of the data key:

- a subkey is HKDF-SHA256(data key, salt=16 random bytes, info="dcptool-archive subkey 1");
  every write session picks a fresh salt: one per data file written (and one for the frame
  that recovery rewrites when it cuts a partial file), one per metadata file written;
- the nonce of a sealed piece is 4 zero bytes and a 64-bit big-endian counter that starts
  at 0 for each salt and counts the pieces sealed under it. A subkey belongs to one writer
  object, which counts up and never reuses a counter: nonces never repeat under one key.
- the additional authenticated data binds each piece to where it belongs: the backup id
  and file name (``ID/NAME``) and, for a frame of a data file, its byte offset in the file.
  A frame moved, swapped, or copied into another file, or a manifest copied to another
  backup, fails to open.

A sealed piece is stored as a zstd *skippable frame* (magic 0x184D2A5E), so a data file
stays a valid zstd stream:

    5E 2A 4D 18 | u32-le body length | 01 | salt (16) | counter (u64-be) | ciphertext + tag (16)

A data file is a run of such envelopes, one per zstd frame; a metadata file (backup.json,
done files, manifest.json) is one envelope around its JSON. `archive.json` and the key
files stay in the clear; `archive.json` carries an HMAC-SHA256 under a subkey of the data
key, and so does each key file, so `verify` reports a changed byte in either.

Everything here is a function of a key and bytes: this module keeps no state. The data
key of an archive a command opened lives in its opened-archive handle
(`archive.Archive.key`), which whoever reads or writes a file of the archive uses; Spark
tasks receive the handle (the key pickled inside it), never a passphrase. No function here
prints or logs a key or a passphrase.
"""
from __future__ import annotations

import base64
import getpass
import hashlib
import hmac
import json
import os
import secrets
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import storage
from .errors import ArchiveError, CorruptFileError

#: environment variables a passphrase comes from (the file's first line is the passphrase)
PASSPHRASE_ENV = "DCPTOOL_ARCHIVE_PASSPHRASE"
PASSPHRASE_FILE_ENV = "DCPTOOL_ARCHIVE_PASSPHRASE_FILE"
PASSPHRASE_COMMAND_ENV = "DCPTOOL_ARCHIVE_PASSPHRASE_COMMAND"

CIPHER = "AES-256-GCM"
KEYS_DIR = "keys"
KEY_FORMAT = "dcptool-key"
#: scrypt parameters of new key files: OWASP's N=2^17, r=8, p=1 (128 MiB of memory,
#: ~0.4-0.6 s on a current CPU, once per command). Key files written before keep the
#: parameters they name (N=2^15 until 0.x) and still open: `_kek` reads them from the file.
SCRYPT_N = 1 << 17
SCRYPT_R = 8
SCRYPT_P = 1
#: DCPTOOL_TESTONLY_WEAKEN_KDF=1 gives new key files scrypt N=2^10 instead (about 1/150 of
#: the cost), for test suites that make hundreds of encrypted archives, never for an archive
#: that matters: a key file names its parameters, so the archive stays as weak as they are.
WEAKEN_KDF_ENV = "DCPTOOL_TESTONLY_WEAKEN_KDF"
WEAK_SCRYPT_N = 1 << 10
#: the most a key file may ask for (a changed key file must not make us allocate gigabytes)
_MAX_N, _MAX_R, _MAX_P = 1 << 20, 32, 16

#: a skippable zstd frame's magic number (little-endian 0x184D2A5E)
ENVELOPE_MAGIC = (0x184D2A5E).to_bytes(4, "little")
ENVELOPE_VERSION = 1
_HEAD = 1 + 16 + 8  # version, salt, counter
_TAG = 16
#: bytes an envelope adds to what it holds
OVERHEAD = 8 + _HEAD + _TAG
_INFO = b"dcptool-archive subkey 1"


class WrongPassphraseError(ArchiveError):
    """No key of the archive opens with the passphrase given."""


class PassphraseMissingError(ArchiveError):
    """The archive is encrypted and no passphrase was given."""


class SealedWithoutKeyError(PassphraseMissingError, CorruptFileError):
    """A sealed piece read without a data key: a file of an encrypted archive read as a
    plain one's (or a sealed piece slipped into a plain archive)."""


class TamperedError(ValueError):
    """A sealed piece fails authentication (raised by open_file; callers name the file)."""


# -- keys held by this process ------------------------------------------------------------------


class DataKey:
    """An archive's data key, with its subkeys cached. Its repr never shows the key."""

    __slots__ = ("uuid", "_key", "_subkeys", "_lock")

    def __init__(self, uuid: str, key: bytes):
        if len(key) != 32:
            raise ValueError("a data key has 32 bytes")
        self.uuid = uuid
        self._key = bytes(key)
        self._subkeys: dict[bytes, Any] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"DataKey({self.uuid!r}, <secret>)"

    __str__ = __repr__

    def __reduce__(self):  # travels only inside an opened archive (Archive.__reduce__)
        raise TypeError("a DataKey is not pickled on its own; pickle the opened archive")

    def secret(self) -> bytes:
        """The key's bytes (for the opened archive's pickle; never print or log them)."""
        return self._key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DataKey) and other.uuid == self.uuid \
            and hmac.compare_digest(other._key, self._key)

    def __hash__(self) -> int:
        return hash(self.uuid)

    def aead(self, salt: bytes, *, cache: bool = True) -> Any:
        """The AES-256-GCM object of the subkey for `salt` (kept for the next call with
        `cache`: a data file's frames share one salt, a metadata file's salt is its own)."""
        a = self._subkeys.get(salt)
        if a is None:
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM

            a = AESGCM(_hkdf(self._key, salt, _INFO))
            if not cache:
                return a
            with self._lock:
                if len(self._subkeys) > 4096:
                    self._subkeys.clear()
                self._subkeys[salt] = a
        return a

    def mac(self, what: bytes, data: bytes) -> str:
        k = _hkdf(self._key, b"", b"dcptool-archive mac 1 " + what)
        return hmac.new(k, data, hashlib.sha256).hexdigest()


def export_key(dk: DataKey) -> str:
    """A data key as one opaque string, for a channel that carries strings only (the Spark
    data source's options): a secret, never print or log it."""
    return base64.b64encode(json.dumps({"uuid": dk.uuid, "key": _b64(dk._key)}).encode()).decode()


def import_key(token: str) -> DataKey:
    """The data key of `export_key`'s string."""
    doc = json.loads(base64.b64decode(token))
    return DataKey(doc["uuid"], base64.b64decode(doc["key"]))


def _hkdf(key: bytes, salt: bytes, info: bytes) -> bytes:
    # HKDF-SHA256 (RFC 5869) with a 32-byte output: one extract, one expand block
    prk = hmac.new(salt or b"\0" * 32, key, hashlib.sha256).digest()
    return hmac.new(prk, info + b"\x01", hashlib.sha256).digest()


def is_encrypted(meta: dict[str, Any]) -> bool:
    return isinstance(meta, dict) and isinstance(meta.get("encryption"), dict)


# -- sealing ------------------------------------------------------------------------------------------


def _envelope(dk: DataKey, salt: bytes, counter: int, data: bytes, aad: bytes, *,
              cache: bool = True) -> bytes:
    ct = dk.aead(salt, cache=cache).encrypt(b"\0\0\0\0" + counter.to_bytes(8, "big"), data,
                                            aad)
    body_len = _HEAD + len(ct)
    return b"".join((ENVELOPE_MAGIC, body_len.to_bytes(4, "little"), bytes((ENVELOPE_VERSION,)),
                     salt, counter.to_bytes(8, "big"), ct))


def _open(dk: DataKey, body: bytes | memoryview, aad: bytes, *, cache: bool = True) -> bytes:
    """The plaintext of an envelope's body (after magic and length); TamperedError."""
    from cryptography.exceptions import InvalidTag

    if len(body) < _HEAD + _TAG or body[0] != ENVELOPE_VERSION:
        raise TamperedError("not a sealed piece of this format")
    salt = bytes(body[1:17])
    nonce = b"\0\0\0\0" + bytes(body[17:25])
    try:
        return dk.aead(salt, cache=cache).decrypt(nonce, body[_HEAD:], aad)
    except InvalidTag:
        raise TamperedError("fails authentication: the file was tampered with "
                            "(or written under another key)") from None


def _frame_aad(rel: str, offset: int) -> bytes:
    return b"dcptool-frame\0" + rel.encode() + b"\0" + offset.to_bytes(8, "big")


def _file_aad(rel: str) -> bytes:
    return b"dcptool-file\0" + rel.encode()


class FrameSealer:
    """Seals the frames of one data file as one writer writes them: a fresh subkey (salt)
    for this writer, the counter counts its frames."""

    __slots__ = ("_dk", "_rel", "_salt", "_n")

    def __init__(self, dk: DataKey, rel: str):
        self._dk = dk
        self._rel = rel
        self._salt = secrets.token_bytes(16)
        self._n = 0

    def seal(self, frame: bytes, offset: int) -> bytes:
        n = self._n
        self._n = n + 1
        return _envelope(self._dk, self._salt, n, frame, _frame_aad(self._rel, offset))


def frame_sealer(key: DataKey | None, name: str | None) -> FrameSealer | None:
    """A sealer for a data file being written (`name`: "ID/NAME"), None in a plain
    archive (`key` None)."""
    return None if key is None or name is None else FrameSealer(key, name)


class FrameOpener:
    __slots__ = ("_dk", "_rel")

    def __init__(self, dk: DataKey, rel: str):
        self._dk = dk
        self._rel = rel

    def open(self, body: bytes | memoryview, offset: int) -> bytes:
        return _open(self._dk, body, _frame_aad(self._rel, offset))


def frame_opener(key: DataKey | None, name: str | None) -> FrameOpener | None:
    """An opener for a data file's sealed frames, None in a plain archive."""
    return None if key is None or name is None else FrameOpener(key, name)


def envelope_body(data: bytes) -> bytes | None:
    """The body of `data` when it is exactly one envelope, None when it does not start
    with the envelope magic."""
    if data[:4] != ENVELOPE_MAGIC:
        return None
    n = int.from_bytes(data[4:8], "little")
    if len(data) != 8 + n:
        raise TamperedError("sealed file has the wrong length (truncated or grown)")
    return data[8:]


def seal_file(key: DataKey | None, name: str | None, data: bytes) -> bytes:
    """What to store for a metadata file's content: sealed under `key` when the file
    `name` ("ID/NAME", None for a file outside backups/) is one of an encrypted archive's
    backups, as is otherwise."""
    if key is None or name is None:
        return data
    return _envelope(key, secrets.token_bytes(16), 0, data, _file_aad(name), cache=False)


def open_file(key: DataKey | None, name: str | None, data: bytes) -> bytes:
    """A metadata file's content from what is stored (see seal_file); TamperedError (a
    ValueError) when it fails authentication or is in the clear in an encrypted archive."""
    if key is None or name is None:
        if data[:4] == ENVELOPE_MAGIC:
            raise TamperedError("is encrypted but the archive is not")
        return data
    body = envelope_body(data)
    if body is None:
        raise TamperedError("is not encrypted in an encrypted archive: the file was tampered "
                            "with")
    return _open(key, body, _file_aad(name), cache=False)


# -- passphrases -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PassphraseSource:
    """Where a command reads a passphrase from before the environment and the prompt:
    the CLI's --passphrase-file (`file`) or --passphrase-command (`command`)."""

    file: str | None = None
    command: str | None = None


def read_passphrase_file(path: str, label: str) -> str:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ArchiveError(f"{label} {path}: cannot read: {exc.strerror}") from None
    line = text.splitlines()[0] if text else ""
    if not line:
        raise ArchiveError(f"{label} {path} is empty")
    return line


def get_passphrase(purpose: str, *, confirm: bool = False,
                   source: PassphraseSource | None = None) -> str:
    """A passphrase: `source` (--passphrase-file, --passphrase-command),
    DCPTOOL_ARCHIVE_PASSPHRASE, its _FILE and _COMMAND variants, or a prompt on the
    terminal (asked twice with `confirm`)."""
    from dcptool.procs import run_secret_command

    if source is not None and source.file:
        return read_passphrase_file(source.file, "--passphrase-file")
    if source is not None and source.command:
        return run_secret_command(source.command, what="--passphrase-command")
    env = os.environ.get(PASSPHRASE_ENV)
    if env:
        return env
    fenv = os.environ.get(PASSPHRASE_FILE_ENV)
    if fenv:
        return read_passphrase_file(fenv, PASSPHRASE_FILE_ENV)
    cenv = os.environ.get(PASSPHRASE_COMMAND_ENV)
    if cenv:
        return run_secret_command(cenv, what=PASSPHRASE_COMMAND_ENV)
    return prompt_passphrase(purpose, confirm=confirm)


def prompt_passphrase(purpose: str, *, confirm: bool = False) -> str:
    if not sys.stdin.isatty():
        raise PassphraseMissingError(f"{purpose}: a passphrase is needed and none was given",
                                     hint=f"set {PASSPHRASE_ENV} or use --passphrase-file")
    p = getpass.getpass(f"passphrase for {purpose}: ")
    if not p:
        raise ArchiveError("empty passphrase")
    if confirm and getpass.getpass("the same passphrase again: ") != p:
        raise ArchiveError("the passphrases differ")
    return p


# -- key files -----------------------------------------------------------------------------------------


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def _canonical(doc: dict[str, Any], *, drop: tuple[str, ...] = ()) -> bytes:
    return json.dumps({k: v for k, v in doc.items() if k not in drop}, sort_keys=True,
                      separators=(",", ":")).encode()


def _kek(passphrase: str, kdf: dict[str, Any]) -> bytes:
    n, r, p = kdf["n"], kdf["r"], kdf["p"]
    return hashlib.scrypt(passphrase.encode("utf-8"), salt=base64.b64decode(kdf["salt"]),
                          n=n, r=r, p=p, dklen=32, maxmem=128 * r * n + (64 << 20))


def new_key_cost() -> int:
    """The scrypt N of new key files: SCRYPT_N, or WEAK_SCRYPT_N under WEAKEN_KDF_ENV=1."""
    return WEAK_SCRYPT_N if os.environ.get(WEAKEN_KDF_ENV) == "1" else SCRYPT_N


def make_key_file(uuid: str, data_key: DataKey, passphrase: str, *,
                  n: int | None = None, r: int = SCRYPT_R, p: int = SCRYPT_P,
                  created: str = "") -> dict[str, Any]:
    """A new key file's document: the data key wrapped under the passphrase (scrypt N `n`,
    by default `new_key_cost()`)."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    if n is None:
        n = new_key_cost()

    doc: dict[str, Any] = {
        "format": KEY_FORMAT, "id": secrets.token_hex(8), "archive": uuid, "created": created,
        "kdf": {"name": "scrypt", "n": n, "r": r, "p": p, "salt": _b64(secrets.token_bytes(16))},
        "cipher": CIPHER,
    }
    nonce = secrets.token_bytes(12)  # one message under this key file's KEK (fresh salt)
    doc["nonce"] = _b64(nonce)
    doc["wrapped"] = _b64(AESGCM(_kek(passphrase, doc["kdf"])).encrypt(
        nonce, data_key._key, _canonical(doc, drop=("nonce",))))
    doc["mac"] = data_key.mac(b"key", _canonical(doc, drop=("mac",)))
    return doc


def check_key_doc(doc: Any, uuid: str) -> str | None:
    """Why a key file's document is malformed (None when it is well-formed)."""
    if not isinstance(doc, dict) or doc.get("format") != KEY_FORMAT:
        return "is not a dcptool key file"
    if doc.get("archive") != uuid:
        return "belongs to another archive"
    kdf = doc.get("kdf")
    if not isinstance(kdf, dict) or kdf.get("name") != "scrypt":
        return "names an unknown key derivation"
    for k, hi in (("n", _MAX_N), ("r", _MAX_R), ("p", _MAX_P)):
        v = kdf.get(k)
        if not isinstance(v, int) or not 1 <= v <= hi:
            return f"has a scrypt {k} out of range"
    if kdf["n"] & (kdf["n"] - 1) or kdf["n"] < 2:
        return "has a scrypt n that is not a power of two"
    if doc.get("cipher") != CIPHER:
        return "names an unknown cipher"
    for k in ("id", "nonce", "wrapped", "mac", "created"):
        if not isinstance(doc.get(k), str):
            return f"has no {k}"
    try:
        base64.b64decode(kdf["salt"], validate=True)
        base64.b64decode(doc["nonce"], validate=True)
        base64.b64decode(doc["wrapped"], validate=True)
    except (ValueError, TypeError):
        return "holds malformed base64"
    return None


def unwrap(doc: dict[str, Any], passphrase: str) -> bytes | None:
    """The data key when `passphrase` opens this key file, else None."""
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    try:
        key = AESGCM(_kek(passphrase, doc["kdf"])).decrypt(
            base64.b64decode(doc["nonce"]), base64.b64decode(doc["wrapped"]),
            _canonical(doc, drop=("nonce", "wrapped", "mac")))
    except (InvalidTag, ValueError):
        return None
    return key if len(key) == 32 else None


def keys_dir(root: Any) -> Any:
    return storage.location(root) / KEYS_DIR


def read_key_files(root: Any) -> dict[str, Any]:
    """{file name: parsed document, or the exception text when unreadable} of keys/."""
    kdir = keys_dir(root)
    try:
        names = sorted(n for n in storage.listdir(kdir) if n.endswith(".json"))
    except (FileNotFoundError, NotADirectoryError):
        return {}
    out: dict[str, Any] = {}
    for name in names:
        try:
            out[name] = json.loads(storage.read_bytes(kdir / name).decode("utf-8"))
        except (OSError, ValueError) as exc:
            out[name] = f"unreadable: {exc}"
    return out


def write_key_file(root: Any, doc: dict[str, Any]) -> Any:
    path = keys_dir(root) / f"{doc['id']}.json"
    storage.create_exclusive(path, (json.dumps(doc, indent=2) + "\n").encode(), 0o600)
    return path


def archive_mac(dk: DataKey, meta: dict[str, Any]) -> str:
    enc = {k: v for k, v in meta["encryption"].items() if k != "mac"}
    return dk.mac(b"archive.json", _canonical({**meta, "encryption": enc}))


def new_encryption(uuid: str, passphrase: str, created: str,
                   **kdf: int) -> tuple[dict[str, Any], DataKey, dict[str, Any]]:
    """(archive.json's "encryption" member without its mac, the new data key, the first
    key file's document)."""
    dk = DataKey(uuid, secrets.token_bytes(32))
    doc = make_key_file(uuid, dk, passphrase, created=created, **kdf)
    return {"cipher": CIPHER, "kdf": "scrypt", "keys": KEYS_DIR + "/"}, dk, doc


def unlock(root: Any, meta: dict[str, Any],
           passphrase: str | PassphraseSource | None = None) -> tuple[DataKey, str]:
    """(data key, id of the key file that opened it) of the encrypted archive at `root`,
    unwrapped from a key file with the passphrase (given, or from `get_passphrase` with
    the source given). Raises WrongPassphraseError, and CorruptFileError when archive.json
    fails its check."""
    uuid = meta["uuid"]
    docs = read_key_files(root)
    good = {n: d for n, d in docs.items() if isinstance(d, dict)
            and check_key_doc(d, uuid) is None}
    if not good:
        raise ArchiveError(f"archive {root} is encrypted but has no usable key file in "
                           f"{keys_dir(root)}")
    if not isinstance(passphrase, str):
        passphrase = get_passphrase(f"archive {root}", source=passphrase)
    for d in good.values():
        key = unwrap(d, passphrase)
        if key is not None:
            dk = DataKey(uuid, key)
            check_archive_mac(root, meta, dk)
            return dk, d["id"]
    raise WrongPassphraseError(f"wrong passphrase for archive {root}: no key of it "
                               "opens with it")


def check_archive_mac(root: Any, meta: dict[str, Any], dk: DataKey) -> None:
    """CorruptFileError unless archive.json's MAC holds under the data key."""
    mac = meta["encryption"].get("mac")
    if not isinstance(mac, str) or not hmac.compare_digest(mac, archive_mac(dk, meta)):
        raise CorruptFileError(storage.location(root) / "archive.json",
                               "fails authentication: the file was tampered with")


def check_key_files(root: Any, dk: DataKey) -> list[tuple[str, str]]:
    """[(key file path, what is wrong)] for key files that are malformed or fail their
    MAC under the data key (tampered)."""
    out = []
    kdir = keys_dir(root)
    for name, doc in read_key_files(root).items():
        path = str(kdir / name)
        if not isinstance(doc, dict):
            out.append((path, f"{doc} (tampered?)"))
            continue
        why = check_key_doc(doc, dk.uuid)
        if why:
            out.append((path, f"{why} (tampered?)"))
        elif not hmac.compare_digest(doc["mac"], dk.mac(b"key", _canonical(doc, drop=("mac",)))):
            out.append((path, "fails authentication: the key file was tampered with"))
    return out


# -- key management (dcptool key add|remove|list) ---------------------------------------------------


def list_keys(root: Any, meta: dict[str, Any]) -> list[dict[str, Any]]:
    """[{id, created, kdf: {name, n, r, p}, file}] of the archive's key files (well-formed
    ones; verify reports the others)."""
    out = []
    for name, doc in read_key_files(root).items():
        if isinstance(doc, dict) and check_key_doc(doc, meta["uuid"]) is None:
            kdf = doc["kdf"]
            out.append({"id": doc["id"], "created": doc["created"], "file": f"{KEYS_DIR}/{name}",
                        "kdf": {"name": kdf["name"], "n": kdf["n"], "r": kdf["r"], "p": kdf["p"]}})
    return sorted(out, key=lambda d: (d["created"], d["id"]))


def add_key(root: Any, meta: dict[str, Any], dk: DataKey, new_passphrase: str,
            created: str) -> dict[str, Any]:
    """Wrap the (unlocked) data key `dk` under one more passphrase; returns the list entry
    of the new key file."""
    doc = make_key_file(meta["uuid"], dk, new_passphrase, created=created)
    write_key_file(root, doc)
    return next(k for k in list_keys(root, meta) if k["id"] == doc["id"])


def remove_key(root: Any, meta: dict[str, Any], dk: DataKey, key_id: str) -> dict[str, Any]:
    """Delete a key file (the archive unlocked: `dk` is its data key); refuses the last
    one (the data would be lost for good)."""
    if dk.uuid != meta["uuid"]:
        raise ArchiveError(f"archive {root}: the key given is another archive's")
    keys = list_keys(root, meta)
    match = [k for k in keys if k["id"] == key_id]
    if not match:
        raise ArchiveError(f"archive {root} has no key {key_id}",
                           hint="see 'dcptool key list' for its keys")
    if len(keys) == 1:
        raise ArchiveError(f"key {key_id} is the last key of archive {root}: without it the "
                           "archive cannot be read", hint="add another key first")
    storage.unlink(storage.location(root) / match[0]["file"])
    return match[0]


def which_key(root: Any, meta: dict[str, Any], passphrase: str) -> str | None:
    """The id of the key file `passphrase` opens, None when none does."""
    for doc in read_key_files(root).values():
        if isinstance(doc, dict) and check_key_doc(doc, meta["uuid"]) is None \
                and unwrap(doc, passphrase) is not None:
            return doc["id"]
    return None
