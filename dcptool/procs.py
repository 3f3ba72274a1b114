"""Processes on this host: whether a pid from a lock or state file still runs."""
from __future__ import annotations

import os
from pathlib import Path


def pid_alive(pid: int, *, cmdline_contains: bytes | None = None) -> bool:
    """Whether process `pid` exists (one we may not signal counts as alive, a zombie not).

    With `cmdline_contains`, a process whose command line (read from /proc, where there is
    one) lacks those bytes counts as gone: the pid was reused by another program.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (ended, not yet reaped by its parent) is gone
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return False
    except (OSError, IndexError):
        pass
    if cmdline_contains is None:
        return True
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True
    return cmdline_contains in cmdline


#: environment variables that hold a secret itself (not a file's or a command's name): a
#: child process never inherits them. The Spark JVM, its Python daemon and workers, the
#: engine and a secret command get what they need otherwise (task closures, a 0600 file
#: removed after reading) or need nothing.
SECRET_ENV = ("DCPTOOL_PASSWORD", "DCPTOOL_ARCHIVE_PASSPHRASE", "DCPTOOL_ARCHIVE_NEW_PASSPHRASE")


def child_env(base: "dict[str, str] | None" = None, **extra: str) -> dict[str, str]:
    """A copy of `base` (default this process's environment) without SECRET_ENV, with
    `extra` added: the environment to start a child process with."""
    env = {k: v for k, v in (os.environ if base is None else base).items()
           if k not in SECRET_ENV}
    env.update(extra)
    return env


class secrets_hidden:
    """Inside the block, SECRET_ENV is out of os.environ (restored after): for children
    that a library starts from os.environ itself (PySpark's gateway launch)."""

    def __enter__(self) -> "secrets_hidden":
        self._saved = {k: os.environ.pop(k) for k in SECRET_ENV if k in os.environ}
        return self

    def __exit__(self, *exc: object) -> None:
        for k, v in self._saved.items():
            os.environ.setdefault(k, v)


def run_secret_command(command: str, *, what: str = "--password-command") -> str:
    """The first line a command prints on its standard output: a secret from a secret
    manager's CLI (restic's --password-command). `command` is split like a shell does
    (no shell runs it); its standard error and input stay the terminal's. Errors name the
    command's status, never what it printed."""
    import shlex
    import subprocess

    from dcptool.errors import UsageError

    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise UsageError(f"{what}: cannot split the command: {exc}") from None
    if not argv:
        raise UsageError(f"{what}: the command is empty")
    try:
        done = subprocess.run(argv, stdout=subprocess.PIPE, check=False, env=child_env())
    except OSError as exc:
        raise UsageError(f"{what}: cannot run {argv[0]}: {exc.strerror or exc}") from None
    if done.returncode != 0:
        raise UsageError(f"{what}: {argv[0]} exited with status {done.returncode}")
    try:
        text = done.stdout.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{what}: {argv[0]} printed something that is not UTF-8 text") from None
    secret = text.split("\n", 1)[0].rstrip("\r")
    if not secret:
        raise UsageError(f"{what}: {argv[0]} printed an empty first line")
    return secret
