"""What a benchmark prints and keeps: its figures as JSON on stdout, and in a file when asked."""
from __future__ import annotations

import json
from pathlib import Path


def print_and_keep(res: dict, json_out: str | None) -> dict:
    """Print `res` as indented JSON; write it to `json_out` too when given; return it."""
    print(json.dumps(res, indent=1))
    if json_out:
        Path(json_out).write_text(json.dumps(res, indent=2) + "\n")
    return res
