"""`dcptool backup` / `restore` user errors: one line, no traceback, non-zero exit."""
from __future__ import annotations

import json
import os
import socket
import sys

import pytest
from cliutil import run_dcptool
from docutil import load, opts_for


def run(*args, password="password", timeout=120):
    env = dict(os.environ)
    env.pop("DCPTOOL_PASSWORD", None)
    if password is not None:
        env["DCPTOOL_PASSWORD"] = password
    return run_dcptool(env, *args, timeout=timeout)  # forked from the warm zygote


def one_error_line(res) -> str:
    lines = [l for l in res.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("dcptool: error: "), lines[0]
    assert "Traceback" not in res.stderr
    return lines[0]


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_backup_to_closed_port(tmp_path):
    res = run("backup", "-c", f"127.0.0.1:{_closed_port()}", str(tmp_path / "a"), "--no-progress")
    assert res.returncode != 0
    assert "127.0.0.1" in one_error_line(res)
    assert not (tmp_path / "a").exists()


def test_backup_wrong_password(shared_node, tmp_path):
    n = shared_node
    res = run("backup", "-c", f"{n.host}:{n.port}", str(tmp_path / "a"), password="wrong")
    assert res.returncode != 0
    line = one_error_line(res)
    assert "wrong" not in line and "Administrator" in line


def test_backup_without_password_is_a_usage_error(shared_node, tmp_path):
    n = shared_node
    res = run("backup", "-c", f"{n.host}:{n.port}", str(tmp_path / "a"), password=None)
    assert res.returncode == 2
    assert "password" in one_error_line(res)


def test_restore_missing_archive(tmp_path):
    res = run("restore", str(tmp_path / "none"), "-c", "127.0.0.1:1")
    assert res.returncode != 0
    assert "none" in one_error_line(res)


def test_restore_from_a_directory_that_is_not_an_archive(tmp_path):
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "file.txt").write_text("hello")
    res = run("restore", str(tmp_path / "junk"), "--dry-run")
    assert res.returncode != 0
    one_error_line(res)


def test_backup_into_a_foreign_directory(shared_node, tmp_path):
    n = shared_node
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("x")
    res = run("backup", "-c", f"{n.host}:{n.port}", str(tmp_path / "notes"), "--no-progress")
    assert res.returncode != 0
    one_error_line(res)


def _main(argv, capsys):
    from dcptool.cli.app import main

    with pytest.raises(SystemExit) as ex:
        main(argv)
    out = capsys.readouterr()
    return ex.value.code, out.out, out.err


def test_backup_and_restore_commands_json(shared_node, spark, tmp_path, capsys, monkeypatch):
    """The commands themselves, in-process so they share the test run's SparkSession."""
    n = shared_node
    monkeypatch.setenv("DCPTOOL_PASSWORD", n.password)
    with opts_for(n).connect() as conn:
        load(conn, {f"cli::{i}": {"i": i} for i in range(300)}, n.vbuckets)
    archive = str(tmp_path / "a")
    code, out, err = _main(["backup", "-c", f"{n.host}:{n.port}", archive, "--json"], capsys)
    assert code == 0, err
    summary = json.loads(out)
    assert summary["type"] == "full" and summary["mutations"] >= 300
    assert {"backup_id", "vbuckets", "deletions", "expirations", "rollbacks", "bytes", "seconds",
            "items_per_second"} <= set(summary)
    target = f"{n.host}:{n.port}"
    code, out, err = _main(["restore", archive, "-c", target, "--dry-run", "--json"], capsys)
    assert code == 0, err
    dry = json.loads(out)
    assert dry["dry_run"] and dry["restored"]["mutation"] == summary["mutations"]
    code, out, err = _main(["restore", archive, "-c", target, "--dry-run", "--json",
                            "--filter-keys", "^cli::1"], capsys)
    assert json.loads(out)["restored"]["mutation"] == 111  # cli::1, cli::10-19, cli::100-199
