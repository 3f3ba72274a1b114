"""A backup whose manifest is damaged (truncated): every error that meets it names the way
out, and `remove --backup ID` takes it out touching nothing else."""
from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest
from cliutil import cli

from dcptool.archive import Archive
from dcptool.archive.verify import verify_archive

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_archive_retention import make_chain, restored, times40  # noqa: E402


def _truncate(archive: Archive, bid: str) -> None:
    path = archive.backup_dir(bid) / "manifest.json"
    path.write_bytes(path.read_bytes()[:100])


def _tree(archive: Archive, ids) -> dict[str, str]:
    return {str(p.relative_to(archive.path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for bid in ids for p in sorted(archive.backup_dir(bid).rglob("*")) if p.is_file()}


@pytest.fixture
def chain(tmp_path):
    """5 backups, full at 0 and 3."""
    return make_chain(tmp_path / "a", times40()[:5], fulls={0, 3})


def test_a_damaged_newest_backup_names_the_way_out_and_remove_takes_it_out(chain, capsys,
                                                                            node_factory):
    archive, ids, model = chain
    _truncate(archive, ids[-1])
    assert archive.is_damaged(ids[-1]) and not archive.is_damaged(ids[-2])
    before = _tree(archive, ids[:-1])
    way_out = f"dcptool remove {archive.path} --backup {ids[-1]}"
    # a backup into the archive is refused in one line whose hint is the remove command
    node = node_factory(vbuckets=2)
    rc, out, err = cli(capsys, "backup", archive.path, "-c", f"{node.host}:{node.port}",
                       "-u", node.username, "-p", node.password, "--no-progress")
    assert rc == 1 and not out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and way_out in lines[0] and "Traceback" not in err
    assert archive.backup_ids() == ids  # nothing begun
    # info and verify name it too
    rc, out, _err = cli(capsys, "info", archive.path)
    assert rc == 0 and "damaged" in out and way_out in out.replace("\n", "")
    rc, out, err = cli(capsys, "verify", archive.path)
    assert rc == 1 and way_out in (out + err).replace("\n", "")

    rc, out, err = cli(capsys, "remove", archive.path, "--backup", ids[-1], "--dry-run")
    assert rc == 0, err
    assert archive.committed_ids() == ids
    rc, out, err = cli(capsys, "remove", archive.path, "--backup", ids[-1])
    assert rc == 0, err
    assert archive.committed_ids() == ids[:-1]
    assert not archive.backup_dir(ids[-1]).exists()
    assert _tree(archive, ids[:-1]) == before  # nothing else touched
    assert verify_archive(archive.path).ok
    for bid in ids[:-1]:
        assert restored(archive, bid) == model.states[bid]


def test_a_damaged_backup_others_continue_from_goes_only_with_them(chain, capsys):
    archive, ids, model = chain
    _truncate(archive, ids[1])  # ids[2] continues from it; ids[3] is full
    rc, _out, err = cli(capsys, "remove", archive.path, "--backup", ids[1])
    assert rc == 2
    assert ids[2] in err and f"--backup {ids[2]}" in err
    assert archive.committed_ids() == ids
    rc, _out, err = cli(capsys, "remove", archive.path, "--backup", ids[1], "--backup", ids[2],
                        "--backup", ids[0])
    assert rc == 2 and "on their own" in err
    before = _tree(archive, [ids[0], *ids[3:]])
    rc, _out, err = cli(capsys, "remove", archive.path, "--backup", ids[1], "--backup", ids[2])
    assert rc == 0, err
    assert archive.committed_ids() == [ids[0], *ids[3:]]
    assert _tree(archive, [ids[0], *ids[3:]]) == before
    assert verify_archive(archive.path).ok
    for bid in (ids[0], *ids[3:]):
        assert restored(archive, bid) == model.states[bid]
