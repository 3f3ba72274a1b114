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


def test_choose_password_precedence(tmp_path):
    from dcptool.client.options import choose_password

    f = tmp_path / "pw"
    f.write_text("from-file\nsecond line\n")
    # a password given on the command line wins; one from DCPTOOL_PASSWORD wins over the
    # variable's file, but not over a file given on the command line
    assert choose_password("typed", f, password_given=True) == "typed"
    assert choose_password("env", f) == "env"
    assert choose_password("env", f, file_given=True) == "from-file"
    assert choose_password(None, f, file_given=True) == "from-file"
    with pytest.raises(UsageError, match="not both"):
        choose_password("typed", f, password_given=True, file_given=True)
    with pytest.raises(UsageError, match="DCPTOOL_PASSWORD_FILE"):
        choose_password(None, tmp_path / "missing", file_label="DCPTOOL_PASSWORD_FILE")
