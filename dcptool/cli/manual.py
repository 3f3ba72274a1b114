"""What each command's manual says beyond its help text: exit statuses, files, variables.

A command module declares its facts next to the command, once:

    manual("backup", exit_codes=(3,), exit_note="...", files=(("ARCHIVE/lock", "..."),),
           env=("DCPTOOL_LOG_KEEP",), see_also=("restore", "info"))

and the man pages, completions and docs/exit-codes.md (scripts/gen_cli_docs.py) read them
from `MANUALS`. Names are top-level command names (`node`, `failover-log`).
"""
from __future__ import annotations

from dataclasses import dataclass

#: exit statuses that apply to every command
COMMON_EXIT = (0, 1, 2, 130)

#: environment variables that are not an option's envvar
ENV_DOCS = {
    "DCPTOOL_PASSWORD": "The password, so it never appears on a command line or in ps (child "
                        "processes such as the Spark JVM do not inherit it).",
    "DCPTOOL_ARCHIVE_PASSPHRASE": "The passphrase of an encrypted archive (else "
                                  "--passphrase-file, else a prompt on the terminal); never "
                                  "printed or logged.",
    "DCPTOOL_ARCHIVE_PASSPHRASE_COMMAND": "A command whose first line of output is the "
                                          "passphrase of an encrypted archive, used when "
                                          "--passphrase-file, --passphrase-command, "
                                          "DCPTOOL_ARCHIVE_PASSPHRASE and its _FILE variable "
                                          "give none.",
    "DCPTOOL_ARCHIVE_NEW_PASSPHRASE": "The passphrase 'dcptool key add' adds (else "
                                      "--new-passphrase-file, else a prompt).",
    "DCPTOOL_LOG_KEEP": "How many run logs of each kind (backup, restore, merge) to keep in "
                        "ARCHIVE/logs (default 20).",
    "DCPTOOL_ENGINE": "off: never attach to a running dcptool engine (every Spark command starts "
                      "its own Spark).",
    "DCPTOOL_ENGINE_DIR": "Where the dcptool engine keeps its socket, state and log (default "
                          "$XDG_RUNTIME_DIR/dcptool-engine, else ~/.cache/dcptool/engine).",
    "DCPTOOL_MANIFEST_CACHE": "Where commands keep the archive manifests they read and checked, "
                              "so the next command does not check an unchanged chain again "
                              "(default $XDG_CACHE_HOME/dcptool/manifests, else "
                              "~/.cache/dcptool/manifests; off: no cache). Never for an "
                              "encrypted archive.",
    "DCPTOOL_PROGRESS_INTERVAL": "Seconds between the progress reports of a Spark command's "
                                 "tasks, and between the polls that draw them (default 0.25).",
    "DCPTOOL_GAP_TOLERANCE": "Seconds a backup may start after the previous one ended without "
                             "a gap of the archive between them, for --to-time, --at and "
                             "info's window (default 10; a continuous backup's recorded "
                             "checkpoint interval is added).",
    "NO_COLOR": "When set to anything but the empty string, output has no colour "
                "(https://no-color.org). Output that is not a terminal never has colour.",
}


@dataclass(frozen=True)
class Manual:
    """One top-level command's manual facts."""

    #: exit statuses beyond COMMON_EXIT
    exit_codes: tuple[int, ...] = ()
    #: what the statuses mean for this command
    exit_note: str | None = None
    #: (path, what it is) for each file the command reads or writes
    files: tuple[tuple[str, str], ...] = ()
    #: variables of ENV_DOCS the command reads besides its options' own
    env: tuple[str, ...] = ()
    #: related commands, for SEE ALSO
    see_also: tuple[str, ...] = ()


#: top-level command name -> its manual facts (commands without facts are absent)
MANUALS: dict[str, Manual] = {}


def manual(command: str, **facts) -> Manual:
    """Declare the manual facts of top-level command `command` (see `Manual`)."""
    if command in MANUALS:
        raise ValueError(f"manual facts for {command!r} declared twice")
    MANUALS[command] = m = Manual(**facts)
    return m
