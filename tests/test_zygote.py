"""The tests' forked `python -m dcptool` processes (tests/zygote.py) behave as real ones."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

import zygote


@pytest.fixture(scope="module")
def z():
    """A zygote of this module's own (whether or not the suite forks its commands:
    DCPTOOL_TEST_ZYGOTE=0 turns that off, not this)."""
    made = zygote.Zygote()
    yield made
    made.stop()


def real(args, env, cwd):
    return subprocess.run([sys.executable, "-m", "dcptool", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)


def test_a_forked_command_answers_as_a_real_one(z, tmp_path):
    env = dict(z.env, NO_COLOR="1", COLUMNS="100")
    for args in (["--version"], ["no-such-command"], ["info", "relative/archive"]):
        forked = zygote.run(args, env=env, cwd=tmp_path, timeout=120, zygote=z)
        proc = real(args, env, tmp_path)
        assert (forked.returncode, forked.stdout, forked.stderr) == \
            (proc.returncode, proc.stdout, proc.stderr), args
    proc = zygote.popen(["--version"], env=env, stdout=subprocess.DEVNULL, zygote=z)
    assert isinstance(proc, zygote.ZygoteProcess) and proc.wait(60) == 0  # forked


def test_a_forked_node_is_a_process_with_a_session_of_its_own(z, tmp_path):
    proc = zygote.popen(["node", "start", "--data", str(tmp_path / "n"), "--port", "0",
                         "--host", "127.0.0.1", "--password", "password"],
                        env=dict(z.env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                        stderr=subprocess.DEVNULL, zygote=z)
    assert isinstance(proc, zygote.ZygoteProcess)
    try:
        assert proc.stdout.readline().startswith(b"listening on ")
        with open(f"/proc/{proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        assert int(fields[3]) == proc.pid  # its own session (fields: state ppid pgrp session)
        assert proc.poll() is None
    finally:
        proc.terminate()
        assert proc.wait(30) == 0
        proc.stdout.close()


def test_a_changed_module_path_runs_a_real_interpreter(z, tmp_path):
    assert z.fits(dict(z.env))
    assert not z.fits(dict(z.env, PYTHONPATH=str(tmp_path)))
    assert not z.fits(dict(z.env, DCPTOOL_TEST_ZYGOTE="0"))
    proc = zygote.popen(["--version"], env=dict(z.env, DCPTOOL_TEST_ZYGOTE="0"),
                        stdout=subprocess.DEVNULL, zygote=z)
    assert isinstance(proc, subprocess.Popen) and proc.wait(60) == 0
