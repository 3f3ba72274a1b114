"""Running dcptool's CLI inside the test process."""
from __future__ import annotations

import pytest

from dcptool.cli.app import main


def cli(capsys, *args) -> tuple[int, str, str]:
    """`dcptool ARGS` in this process (the test session's Spark): (exit status, out, err)."""
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in args])
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err
