"""What a terminal shows after a command's output: a small screen renderer for tests.

`render(data, columns)` plays the bytes a pseudo-terminal received onto a screen of
`columns` columns and unlimited rows, the way a VT100-style terminal does: printable
characters advance the cursor and wrap at the right margin (the cursor waits at the margin
until the next character, as xterm does), `\\r` returns to column 0, `\\n` moves one row
down, `\\b` one column back, `ESC[nA`/`B`/`C`/`D`/`G` move the cursor, `ESC[nK` erases in the
line and `ESC[nJ` in the screen; colours, cursor visibility and other escapes change nothing
shown. The result is the screen's rows, trailing blanks removed, so a test can tell what
a person sees: whether a line starts at column 0, and what is left of a progress bar that
was redrawn or erased.
"""
from __future__ import annotations

import re

_CSI = re.compile(r"\x1b\[([0-9;?]*)([@-~])")
_OSC = re.compile(r"\x1b\].*?(?:\x07|\x1b\\)", re.S)


def render(data: bytes | str, columns: int = 80) -> list[str]:
    text = data.decode(errors="replace") if isinstance(data, (bytes, bytearray)) else data
    rows: list[list[str]] = [[]]
    row = col = 0
    pending_wrap = False  # the cursor sits past the last column until the next character

    def line(r: int) -> list[str]:
        while len(rows) <= r:
            rows.append([])
        return rows[r]

    def put(ch: str) -> None:
        nonlocal row, col, pending_wrap
        if pending_wrap:
            row, col, pending_wrap = row + 1, 0, False
        cells = line(row)
        while len(cells) < col:
            cells.append(" ")
        if col < len(cells):
            cells[col] = ch
        else:
            cells.append(ch)
        if col == columns - 1:
            pending_wrap = True
        else:
            col += 1

    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\x1b":
            m = _CSI.match(text, i)
            if m:
                params, final = m.group(1), m.group(2)
                i = m.end()
                if params.startswith("?"):
                    continue  # private modes (cursor shown or hidden): nothing drawn
                nums = [int(p) if p else 0 for p in params.split(";")] if params else []
                n = nums[0] if nums else 0
                if final in "ABCDG":
                    pending_wrap = False
                if final == "A":
                    row = max(0, row - max(1, n))
                elif final == "B":
                    row += max(1, n)
                elif final == "C":
                    col = min(columns - 1, col + max(1, n))
                elif final == "D":
                    col = max(0, col - max(1, n))
                elif final == "G":
                    col = min(columns - 1, max(1, n) - 1)
                elif final == "K":
                    cells = line(row)
                    if n == 0:
                        del cells[col:]
                    elif n == 1:
                        cells[:col + 1] = [" "] * min(len(cells), col + 1)
                    else:
                        cells.clear()
                elif final == "J":
                    if n == 0:
                        del line(row)[col:]
                        del rows[row + 1:]
                    elif n in (2, 3):
                        for r in rows:
                            r.clear()
                continue  # SGR (colours) and the rest: nothing drawn
            m = _OSC.match(text, i)
            i = m.end() if m else i + 2  # an OSC (a link, a title), or a two-byte escape
            continue
        i += 1
        if ch == "\r":
            col, pending_wrap = 0, False
        elif ch == "\n":
            row, pending_wrap = row + 1, False
            line(row)
        elif ch == "\b":
            col, pending_wrap = max(0, col - 1), False
        elif ch == "\t":
            col = min(columns - 1, (col // 8 + 1) * 8)
        elif ch >= " " or ch == "\ufffd":
            put(ch)
    return ["".join(r).rstrip() for r in rows]


def drain_pty(master: int, proc, deadline: float | None = None) -> bytes:
    """What the pseudo-terminal `master` receives until `proc` has exited and nothing is
    left to read, its other end closes, or time.monotonic() passes `deadline`."""
    import os
    import select
    import time

    chunks = []
    while deadline is None or time.monotonic() < deadline:
        r, _, _ = select.select([master], [], [], 0.2)
        if r:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        elif proc.poll() is not None:
            break
    return b"".join(chunks)


def run_with_stderr_on_a_terminal(argv: list[str], env: dict[str, str],
                                  timeout: float = 60) -> tuple[bytes, str]:
    """Run `argv` with its stderr on a pseudo-terminal (stdout a pipe) until it exits:
    (the bytes the terminal received, stdout). Asserts exit status 0."""
    import os
    import pty
    import subprocess

    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=slave,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    os.close(slave)
    try:
        screen = drain_pty(master, proc)
        out = proc.stdout.read().decode()
        assert proc.wait(timeout) == 0
    finally:
        os.close(master)
    return screen, out
