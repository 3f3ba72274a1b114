"""The archive passphrase on the command line: `--passphrase-file` on every command that
takes an ARCHIVE, never a passphrase value.

A passphrase comes from --passphrase-file PATH (or DCPTOOL_ARCHIVE_PASSPHRASE_FILE), then
DCPTOOL_ARCHIVE_PASSPHRASE, then a prompt when a terminal is attached
(see dcptool.archive.crypto.get_passphrase). It is never printed or logged.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from dcptool.archive import crypto


def _passphrase_file_option() -> Any:
    def proto(
        passphrase_file: Annotated[Optional[Path], typer.Option(
            "--passphrase-file", metavar="PATH", envvar=crypto.PASSPHRASE_FILE_ENV,
            show_default=False,
            help="Read the passphrase of an encrypted archive from the first line of this "
                 "file (else DCPTOOL_ARCHIVE_PASSPHRASE, else a prompt on the terminal).")] = None,
    ) -> None:  # pragma: no cover
        pass

    t = typer.Typer(add_completion=False)
    t.command()(proto)
    return typer.main.get_command(t).params[0]


def add_passphrase_file(cmd: Any) -> None:
    """Give a command whose argument is an archive a --passphrase-file option (once)."""
    params = getattr(cmd, "params", None)
    if not params or cmd.callback is None or getattr(cmd, "_dcptool_passphrase_file", False):
        return
    names = [p.name for p in params]
    if "passphrase_file" in names or not any(
            p.name == "archive" and getattr(p, "param_type_name", "") == "argument"
            for p in params):
        return
    cmd._dcptool_passphrase_file = True
    params.append(_passphrase_file_option())
    inner = cmd.callback

    @functools.wraps(inner)
    def callback(*args, **kwargs):
        crypto.set_passphrase_file(kwargs.pop("passphrase_file", None))
        return inner(*args, **kwargs)

    cmd.callback = callback
