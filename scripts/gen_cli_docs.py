#!/usr/bin/env python3
"""Regenerate man/, completions/ and docs/exit-codes.md from the dcptool command tree.

    python scripts/gen_cli_docs.py            # write the files
    python scripts/gen_cli_docs.py --check    # exit 1 (listing them) if any is out of date

Run it after adding or changing a command or option, and commit what it writes; the tests
in tests/cli/ fail while the generated files and the command tree disagree.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import docgen


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="change nothing; exit 1 if a generated file is out of date")
    ap.add_argument("--repo", type=Path, default=REPO, help="repository root (default: this one)")
    args = ap.parse_args(argv)
    if args.check:
        differ, extra = docgen.stale(args.repo)
        for p in differ:
            print(f"out of date: {p.relative_to(args.repo)}", file=sys.stderr)
        for p in extra:
            print(f"no longer generated: {p.relative_to(args.repo)}", file=sys.stderr)
        bad_examples = docgen.example_problems()
        for line in bad_examples:
            print(f"bad example: {line}", file=sys.stderr)
        if differ or extra:
            print("run: python scripts/gen_cli_docs.py", file=sys.stderr)
        return 1 if differ or extra or bad_examples else 0
    for p in docgen.write(args.repo):
        print(f"wrote {p.relative_to(args.repo)}" if p.exists() else
              f"removed {p.relative_to(args.repo)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
