"""`dcptool decode`: show what frames a captured byte stream or hex dump holds."""
from __future__ import annotations

import binascii
import sys
from pathlib import Path
from typing import Annotated, Any, Iterator, Optional

import typer

from dcptool.cli.app import app
from dcptool.cli.manual import manual
from dcptool.cli.output import console, print_json, stdout_is_terminal
from dcptool.errors import UsageError
from dcptool.protocol import (
    Frame,
    ProtocolError,
    decode_frame,
    decode_message,
    message_fields,
)
from dcptool.protocol.constants import (
    REQUEST_MAGICS,
    Feature,
    feature_name,
    opcode_name,
    status_name,
)


manual(
    "decode",
    exit_note="1 when any frame was malformed.",
    see_also=("tail",),
)


_COMMON = {"vbucket", "opaque", "cas", "datatype", "status", "op", "framing", "framing_rest"}


def _text_or_hex(name: str, raw: bytes, out: dict[str, Any]) -> None:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        out[f"{name}_hex"] = raw.hex()
        return
    if text.isprintable() or not text:
        out[name] = text
    else:
        out[name] = text
        out[f"{name}_hex"] = raw.hex()


def frame_to_dict(frame: Frame) -> dict[str, Any]:
    """A JSON-friendly description of one frame and its decoded fields.

    Raises ProtocolError when the frame's sections do not fit its opcode.
    """
    out: dict[str, Any] = {
        "magic": f"0x{frame.magic:02x}",
        "opcode": opcode_name(frame.opcode),
    }
    if frame.magic in REQUEST_MAGICS:
        out["vbucket"] = frame.specific
    else:
        out["status"] = status_name(frame.specific)
    out["opaque"] = f"0x{frame.opaque:08x}"
    out["cas"] = frame.cas
    out["datatype"] = frame.datatype
    msg = decode_message(frame)
    for name, value in message_fields(msg).items():
        if name in _COMMON:
            continue
        if name == "stream_id" and value is None:
            continue
        if name == "features":
            out[name] = [feature_name(f) if f in Feature._value2member_map_ else f"0x{f:04x}"
                         for f in value]
        elif isinstance(value, bytes):
            if value or name in ("key",):
                _text_or_hex(name, value, out)
        elif isinstance(value, tuple):
            out[name] = [list(v) if isinstance(v, tuple) else v for v in value]
        else:
            out[name] = value
    if "key" not in out and frame.key:
        _text_or_hex("key", frame.key, out)
    return out


def _hex_lines(text: str) -> Iterator[tuple[int, bytes | str]]:
    """(line number, frame bytes) per line; a str instead of bytes means the line is bad hex."""
    for n, line in enumerate(text.splitlines(), 1):
        data = line.split("#", 1)[0]
        data = "".join(data.split())
        if not data:
            continue
        try:
            yield n, binascii.unhexlify(data)
        except (binascii.Error, ValueError) as exc:
            yield n, f"not valid hex: {exc}"


def decode_hex_text(text: str) -> Iterator[dict[str, Any]]:
    """One result per frame line: the decoded frame, or an error with line and reason."""
    for n, data in _hex_lines(text):
        if isinstance(data, str):
            yield {"line": n, "offset": 0, "error": data, "field": "hex"}
            continue
        try:
            frame, used = decode_frame(data, 0)
            if frame is None:
                raise ProtocolError("length", f"truncated: {len(data)} bytes do not hold a whole frame",
                                    offset=0)
            if used != len(data):
                raise ProtocolError("length", f"{len(data) - used} bytes after the end of the frame",
                                    offset=used)
            item = {"line": n, "offset": 0}
            item.update(frame_to_dict(frame))
            yield item
        except ProtocolError as exc:
            yield {"line": n, "offset": exc.offset or 0, "error": exc.reason, "field": exc.field}


def decode_raw_bytes(data: bytes) -> Iterator[dict[str, Any]]:
    """Decode a captured byte stream frame by frame, skipping bad frames when framing allows."""
    off = 0
    n = len(data)
    while off < n:
        try:
            frame, used = decode_frame(data, off)
        except ProtocolError as exc:
            yield {"offset": off, "error": exc.reason, "field": exc.field}
            if exc.frame_size and not exc.framing_lost:
                off += exc.frame_size
                continue
            return
        if frame is None:
            yield {"offset": off, "error": f"truncated: {n - off} bytes left do not hold a whole frame",
                   "field": "length"}
            return
        item: dict[str, Any] = {"offset": off}
        try:
            item.update(frame_to_dict(frame))
        except ProtocolError as exc:
            item = {"offset": off, "opcode": opcode_name(frame.opcode), "error": exc.reason,
                    "field": exc.field}
        yield item
        off += used


def _render_table(items: list[dict[str, Any]]) -> None:
    from rich.table import Table

    table = Table(show_lines=False)
    for col in ("#", "offset", "magic", "opcode", "vb/status", "opaque", "cas", "dt"):
        table.add_column(col, no_wrap=True)
    table.add_column("key", overflow="fold")
    table.add_column("fields", overflow="fold", ratio=1)
    skip = {"line", "offset", "magic", "opcode", "vbucket", "status", "opaque", "cas", "datatype", "key",
            "error", "field"}
    for i, it in enumerate(items, 1):
        where = f"line {it['line']}" if "line" in it else str(it.get("offset", ""))
        if "error" in it:
            table.add_row(str(i), where, "", it.get("opcode", ""), "", "", "", "", "",
                          f"[red]malformed {it['field']}: {it['error']}[/red]")
            continue
        rest = ", ".join(f"{k}={v}" for k, v in it.items() if k not in skip)
        table.add_row(str(i), where, it["magic"], it["opcode"],
                      str(it.get("vbucket", it.get("status", ""))), it["opaque"], str(it["cas"]),
                      str(it["datatype"]), str(it.get("key", it.get("key_hex", ""))), rest)
    out = console()
    if not out.is_terminal:
        out.width = max(out.width, 160)
    out.print(table)


@app.command()
def decode(
    source: Annotated[Optional[Path], typer.Argument(
        help="File to read: hex frames (one per line, text after '#' ignored) or, with --raw, a "
             "captured byte stream. Default or '-': standard input.", show_default=False)] = None,
    raw: Annotated[bool, typer.Option(
        "--raw", help="Read a binary capture instead of hex lines.")] = False,
    json_out: Annotated[Optional[bool], typer.Option(
        "--json/--table", help="One JSON object per frame (default when stdout is not a "
                               "terminal), or a table.")] = None,
) -> None:
    """Decode memcached/DCP frames and print each with its decoded fields.

    Exit status 1 if any frame was malformed.

    Example: dcptool decode capture.requests.hex --json
    """
    if source is None or str(source) == "-":
        data = sys.stdin.buffer.read()
    else:
        try:
            data = source.read_bytes()
        except FileNotFoundError:
            raise UsageError(f"no such file: {source}") from None
        except IsADirectoryError:
            raise UsageError(f"{source} is a directory, not a capture file") from None
        except OSError as exc:
            raise UsageError(f"cannot read {source}: {exc.strerror}") from None
    if raw:
        results = decode_raw_bytes(data)
    else:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise UsageError("input is not hex text", hint="use --raw for a binary capture") from None
        results = decode_hex_text(text)
    if json_out is None:
        json_out = not stdout_is_terminal()
    bad = 0
    if json_out:
        for item in results:
            bad += "error" in item
            print_json(item)
    else:
        items = list(results)
        bad = sum("error" in it for it in items)
        _render_table(items)
    if bad:
        raise typer.Exit(1)
