"""Client-supplied text as it may appear in the node's log.

Whatever a client sends (SASL mechanism and user names, keys, DCP connection names,
HELLO agent names, REST paths and headers) reaches a log line only through `shown()`:
printable ASCII, everything else escaped (`\\n`, `\\x00`, `\\x1b`, `\\u202e`), the
backslash itself doubled, and at most `limit` characters of the value, so a client can
neither forge a line nor send a terminal escape sequence to whoever reads the log.
`escape_controls()` is the formatter's safety net for the whole message.
"""
from __future__ import annotations

#: how much of one client-supplied value a log line shows
DEFAULT_LIMIT = 128

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\", "'": "\\'"}


def _escape_char(c: str) -> str:
    named = _NAMED.get(c)
    if named is not None:
        return named
    o = ord(c)
    if 0x20 <= o <= 0x7E:
        return c
    if o <= 0xFF:
        return f"\\x{o:02x}"
    if o <= 0xFFFF:
        return f"\\u{o:04x}"
    return f"\\U{o:08x}"


def shown(value, limit: int = DEFAULT_LIMIT) -> str:
    """`value` (str, bytes or anything else) quoted, escaped to printable ASCII, and cut
    to `limit` characters (bytes) with a note of how much more there was."""
    if value is None:
        return "None"
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        head = "".join(_escape_char(chr(b)) for b in raw[:limit])
        more = len(raw) - limit
    else:
        text = value if isinstance(value, str) else str(value)
        head = "".join(_escape_char(c) for c in text[:limit])
        more = len(text) - limit
    if more > 0:
        return f"'{head}'...({more} more)"
    return f"'{head}'"


def escape_controls(text: str) -> str:
    """Every character of `text` outside printable ASCII escaped (the backslash kept as
    it is): what the node's log formatter does to each message, so that no line of the
    log holds a newline, a NUL or an escape sequence, whatever reached the message."""
    if text.isascii() and text.isprintable():
        return text
    return "".join(c if 0x20 <= ord(c) <= 0x7E or c == "\\" else _escape_char(c)
                   for c in text)


def one_line_formatter(fmt: str, *, base: type | None = None):
    """A log formatter (of class `base`, default logging's own; the run logs and node.log
    give `dcptool.runlog.UTCFormatter`) whose messages are passed through
    `escape_controls`: each record is one line of printable ASCII, whatever a client
    managed to put into it (a traceback keeps its own lines)."""
    import logging

    if base is None:
        base = logging.Formatter

    class OneLineFormatter(base):
        def formatMessage(self, record):
            record.message = escape_controls(record.message)
            return super().formatMessage(record)

    return OneLineFormatter(fmt)
