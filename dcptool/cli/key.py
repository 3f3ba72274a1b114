"""`dcptool key`: add, remove and list the passphrases (key files) of an encrypted archive.

Each key file in ARCHIVE/keys/ holds the archive's data key wrapped under one passphrase
(see docs/archive-format.md, Encrypted archives): a passphrase is changed by adding a key
for the new one and removing the old one, without rewriting any data.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from dcptool.cli.app import app
from dcptool.cli.manual import manual
from dcptool.cli.output import console, print_json, print_table, table_console
from dcptool.errors import UsageError

manual(
    "key",
    exit_codes=(3,),
    exit_note="1 when the passphrase opens no key of the archive (one line, before anything "
              "is changed), when the archive is not encrypted, or when remove would delete "
              "the last key. 3 when another writer (a backup, a merge) holds the archive "
              "lock: add and remove take it.",
    files=(
        ("ARCHIVE/keys/KEYID.json", "One key file per passphrase: scrypt parameters and salt, "
                                    "the data key wrapped with AES-256-GCM (mode 0600)."),
    ),
    env=("DCPTOOL_ARCHIVE_PASSPHRASE", "DCPTOOL_ARCHIVE_NEW_PASSPHRASE"),
    see_also=("backup", "verify", "info"),
)

NEW_PASSPHRASE_ENV = "DCPTOOL_ARCHIVE_NEW_PASSPHRASE"

key_app = typer.Typer(
    name="key",
    help="""Add, remove and list the passphrases of an encrypted archive (one key file
    each in ARCHIVE/keys/). Changing a passphrase is 'key add' then 'key remove' of the
    old key: no data is rewritten, and the data key stays the same, so an old copy of a
    removed key file still opens the archive with its old passphrase (see 'key remove').

    Example: dcptool key list /backups/secret
    """,
    no_args_is_help=True,
)
app.add_typer(key_app, name="key")

ArchiveArg = Annotated[str, typer.Argument(
    metavar="ARCHIVE", help="Encrypted archive directory, or s3://BUCKET/PREFIX.",
    show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON.")]


def _open(archive: str) -> Any:
    from dcptool.cli.passphrase import open_archive

    a = open_archive(archive)  # unlocks: a wrong passphrase is one line here
    if not a.encrypted:
        raise UsageError(f"archive {archive} is not encrypted: it has no keys",
                         hint="'dcptool backup --encrypt' creates an encrypted archive")
    return a


@key_app.command("list")
def key_list(archive: ArchiveArg, as_json: JsonOpt = False) -> None:
    """List the keys of an encrypted archive: id, creation time and scrypt parameters;
    the key the passphrase given opens is marked.

    Example: DCPTOOL_ARCHIVE_PASSPHRASE_FILE=~/.dcptool-pass dcptool key list /backups/secret --json
    """
    from dcptool.archive import crypto

    a = _open(archive)
    keys = crypto.list_keys(a.path, a.meta)
    current = _current(a)
    for k in keys:
        k["current"] = k["id"] == current
    if as_json:
        print_json({"archive": str(a.path), "keys": keys})
        return
    rows = []
    for k in keys:
        kdf = k["kdf"]
        rows.append([k["id"], k["created"], f"scrypt N={kdf['n']} r={kdf['r']} p={kdf['p']}",
                     "yes" if k["current"] else "no"])
    # "current": the key the passphrase of this run opened
    print_table(table_console(), ["id", "created", "kdf", "current"], rows,
                title=f"keys of {a.path}")


def _current(a: Any) -> str | None:
    """The id of the key the passphrase of this run opened."""
    return a.key_id


def _new_passphrase(path: Optional[Path], archive: str) -> str:
    from dcptool.archive import crypto

    if path is not None:
        return crypto.read_passphrase_file(os.fspath(path), "--new-passphrase-file")
    env = os.environ.get(NEW_PASSPHRASE_ENV)
    if env:
        return env
    return crypto.prompt_passphrase(f"the new key of {archive}", confirm=True)


@key_app.command("add")
def key_add(
    archive: ArchiveArg,
    new_passphrase_file: Annotated[Optional[Path], typer.Option(
        "--new-passphrase-file", metavar="PATH", show_default=False,
        help="Read the new passphrase from the first line of this file (else "
             "DCPTOOL_ARCHIVE_NEW_PASSPHRASE, else a prompt, asked twice).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Add a passphrase: a new key file wrapping the archive's data key under it. The
    current passphrase (DCPTOOL_ARCHIVE_PASSPHRASE, --passphrase-file or the prompt)
    must open an existing key first.

    Example: dcptool key add /backups/secret --passphrase-file old.txt --new-passphrase-file new.txt
    """
    from dcptool.archive import crypto
    from dcptool.archive.format import iso_time, utc_now

    a = _open(archive)
    new = _new_passphrase(new_passphrase_file, archive)
    with a.lock("key add"):
        added = crypto.add_key(a.path, a.meta, a.key, new, iso_time(utc_now()))
    if as_json:
        print_json({"archive": str(a.path), "added": added})
    else:
        console().print(f"added key {added['id']} ({added['file']})")


@key_app.command("remove")
def key_remove(
    archive: ArchiveArg,
    key_id: Annotated[str, typer.Argument(metavar="KEYID", help="The key to remove (see "
                                                                 "'dcptool key list').",
                                          show_default=False)],
    as_json: JsonOpt = False,
) -> None:
    """Remove a key file: its passphrase no longer opens the archive as it is now. The
    last key is never removed. The passphrase given must open one of the archive's keys.

    The data key stays the same (no data is rewritten): whoever kept a copy of the
    removed key file (a copy of ARCHIVE/keys/, a backup of the archive) and knows its
    passphrase can still unwrap the data key and read the archive, including every backup
    written after the removal. To shut out such a copy, start a new encrypted archive
    (backup --encrypt into a new directory, a full backup) under a new passphrase and
    remove the old archive when it is no longer needed.

    Example: dcptool key remove /backups/secret 3f2a9c0d1e4b5a69
    """
    from dcptool.archive import crypto

    a = _open(archive)
    with a.lock("key remove"):
        removed = crypto.remove_key(a.path, a.meta, a.key, key_id)
    if as_json:
        print_json({"archive": str(a.path), "removed": removed})
    else:
        console().print(f"removed key {removed['id']} ({removed['file']})")
