"""Connection options (dcptool.client.options; no node needed)."""
from __future__ import annotations

import pickle

import pytest

from dcptool.client.options import ConnOptions
from dcptool.errors import UsageError


def test_connopts_defaults_and_secrecy():
    o = ConnOptions.from_cli("couchbases://h", None, "s3cret", "b", None, True)
    assert (o.host, o.port, o.tls, o.username, o.bucket, o.verify) == ("h", 11207, True, "Administrator", "b", False)
    assert "s3cret" not in repr(o)
    assert pickle.loads(pickle.dumps(o)) == o
    ctx = o.ssl_context()
    assert ctx is not None and not ctx.check_hostname


def test_connopts_missing_values(monkeypatch):
    with pytest.raises(UsageError, match="no node"):
        ConnOptions.from_cli(None, "u", "p")
    monkeypatch.setattr("sys.stdin.isatty", lambda: False)
    with pytest.raises(UsageError, match="no password"):
        ConnOptions.from_cli("h", "u", None)


def test_connopts_prompts_on_terminal(monkeypatch):
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    monkeypatch.setattr("getpass.getpass", lambda prompt: "typed")
    assert ConnOptions.from_cli("h:1", "u", None).password == "typed"
