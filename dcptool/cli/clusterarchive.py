"""What the reading commands (info, verify, examine, export) share for a cluster archive:
knowing one when given, opening it with the command's passphrase options, and picking
its buckets from -b/--bucket (repeated, or a comma list), with one line (exit 2) for a
bucket it does not hold. Each command keeps its own code for bucket archives and calls
these only when `is_cluster_archive(ARCHIVE)`."""
from __future__ import annotations

from typing import Any, Iterable

from dcptool.archive.cluster import ClusterArchive, archive_kind
from dcptool.archive.clusterread import one_bucket, select_buckets, split_names
from dcptool.archive.errors import ArchiveError
from dcptool.errors import UsageError


def is_cluster_archive(path: Any) -> bool:
    """ARCHIVE is a cluster archive (its archive.json says so)."""
    return archive_kind(path) == "cluster"


def open_cluster(path: Any) -> ClusterArchive:
    """The command's cluster archive, opened once (an encrypted one unlocked with the
    passphrase the command's options, the environment or the prompt give)."""
    from dcptool.cli.passphrase import passphrase_source

    return ClusterArchive.open(path, passphrase=passphrase_source())


def given_on_command_line(param: str) -> bool:
    """The command line gave option `param` (not its default, nor its variable: a
    DCPTOOL_BUCKET meant for the node picks no bucket of an archive)."""
    from dcptool.cli.connopts import get_current_context

    ctx = get_current_context(silent=True)
    if ctx is None:
        return False
    src = ctx.get_parameter_source(param)
    return src is not None and src.name == "COMMANDLINE"


def pick_buckets(cluster: ClusterArchive, wanted: Iterable[str] | str | None) -> list[str]:
    """The buckets -b/--bucket names (every bucket the archive holds when none)."""
    try:
        return select_buckets(cluster, wanted)
    except ArchiveError as exc:
        raise UsageError(exc.message) from None


def pick_one_bucket(cluster: ClusterArchive, wanted: Iterable[str] | str | None) -> str:
    """The one bucket a command on one bucket reads: -b/--bucket's, or the only one."""
    try:
        return one_bucket(cluster, wanted)
    except ArchiveError as exc:
        raise UsageError(exc.message) from None


def refuse_options(**given: Any) -> None:
    """One line for options a command does not take with a cluster archive (those
    given a value other than None, False, 0 or empty)."""
    used = [name for name, value in given.items() if value not in (None, False, 0, "", [], ())]
    if used:
        opts = ", ".join(used)
        raise UsageError(f"{opts} {'does' if len(used) == 1 else 'do'} not apply to a cluster "
                         "archive", hint="give one of its bucket archives, "
                                         "ARCHIVE/buckets/NAME")


def open_bucket_archive(path: Any, bucket: Iterable[str] | str | None) -> Any:
    """The bucket archive a command on one bucket reads: ARCHIVE itself when it is a
    bucket archive (a -b/--bucket naming another bucket is one line), else the cluster
    archive's bucket -b/--bucket names (required when it holds several)."""
    from dcptool.cli.passphrase import open_archive

    if not is_cluster_archive(path):
        arch = open_archive(path)
        names = split_names(bucket)
        if names and names != [arch.bucket]:
            raise UsageError(f"--bucket {','.join(names)}: archive {arch.path} holds bucket "
                             f"{arch.bucket!r} only")
        return arch
    cluster = open_cluster(path)
    return cluster.open_bucket(pick_one_bucket(cluster, bucket))


__all__ = ["given_on_command_line", "is_cluster_archive", "open_bucket_archive",
           "open_cluster", "pick_buckets", "pick_one_bucket", "refuse_options"]
