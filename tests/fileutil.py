"""Files as the tests compare them."""
from __future__ import annotations

import os


def tree_bytes(root) -> dict[str, bytes]:
    """Every file under `root`: {path relative to root: its bytes}."""
    out = {}
    for dirpath, _dirs, names in os.walk(root):
        for n in names:
            p = os.path.join(dirpath, n)
            with open(p, "rb") as f:
                out[os.path.relpath(p, root)] = f.read()
    return out
