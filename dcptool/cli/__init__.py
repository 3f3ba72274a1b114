"""The dcptool command line.

`main` is the console script's entry point: `dcptool --version` answers here, before the
command tree (typer, rich, every command's module) is imported; everything else goes to
`dcptool.cli.app.main`.
"""
from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    """Run the CLI (see dcptool.cli.app.main)."""
    args = sys.argv[1:] if argv is None else argv
    if list(args) == ["--version"]:
        from dcptool import __version__

        print(f"dcptool {__version__}")
        sys.exit(0)
    from dcptool.cli.app import main as run

    run(argv)
