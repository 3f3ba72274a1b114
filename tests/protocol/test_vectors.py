"""Every frame that real DCP clients sent decodes to what its annotation states."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dcptool.protocol import ProtocolError, decode_frame, decode_message, message_fields
from dcptool.protocol.constants import opcode_name

from conftest import VECTORS, vector_files

LINE = re.compile(r"^(?P<hex>[0-9a-fA-F]+)\s+#\s*(?P<note>.*)$")
FIELD = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\[[^\]]*\]|\{[^}]*\}|\S+)')

#: annotation names of decoded fields -> dcptool's field names
RENAME = {
    "vb_uuid": "vbucket_uuid",
    "snap_start": "snap_start_seqno",
    "snap_end": "snap_end_seqno",
}


def _vector_frames():
    out = []
    for path in vector_files():
        for n, line in enumerate(path.read_text().splitlines(), 1):
            m = LINE.match(line.strip())
            if m:
                out.append(pytest.param(path.name, n, m["hex"], m["note"], id=f"{path.stem}:{n}"))
    return out


def _annotation(note: str) -> dict:
    parts = note.split()
    ann = {"conn": parts[0], "opcode": parts[1]}
    for name, raw in FIELD.findall(note):
        if raw.startswith('"') or raw.startswith("[") or raw.startswith("{"):
            ann[name] = json.loads(raw)
        else:
            ann[name] = raw
    return ann


def _int(v) -> int:
    return int(v, 16) if isinstance(v, str) and v.startswith("0x") else int(v)


def test_vectors_present():
    assert len(_vector_frames()) >= 190


def test_a_missing_vector_set_is_an_error_not_a_skip(tmp_path, monkeypatch):
    import subprocess
    import sys

    import conftest

    monkeypatch.setattr(conftest, "VECTORS", tmp_path / "nothing-here")
    with pytest.raises(pytest.fail.Exception, match="no captured client vectors"):
        conftest.vector_files()
    # and with this project's settings any parametrised test left with no parameters fails
    # the run instead of being skipped (in one process: `-n 0` after the settings' `-n auto`
    # only spares starting a worker per core for one empty test)
    (tmp_path / "test_empty.py").write_text(
        "import pytest\n\n@pytest.mark.parametrize('name', [])\n"
        "def test_each(name):\n    pass\n")
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0",
                          "-c", str(conftest.REPO / "pyproject.toml"),
                          str(tmp_path / "test_empty.py")],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert res.returncode != 0, res.stdout
    assert "Empty parameter set" in res.stdout and "skipped" not in res.stdout, res.stdout


@pytest.mark.parametrize("name,line,hexdata,note", _vector_frames())
def test_vector_frame(name, line, hexdata, note):
    raw = bytes.fromhex(hexdata)
    ann = _annotation(note)
    frame, used = decode_frame(raw)
    assert frame is not None and used == len(raw)
    assert opcode_name(frame.opcode) == ann["opcode"]
    assert frame.magic == _int(ann["magic"])
    assert frame.opaque == _int(ann["opaque"])
    if "vb" in ann:
        assert frame.vbucket == int(ann["vb"])
    if "status" in ann:
        assert frame.status == _int(ann["status"])
    if "key" in ann:
        assert frame.key.decode() == ann["key"]
    if "value_text" in ann:
        assert frame.value == ann["value_text"].replace("\\0", "\0").encode()
    if "value_hex" in ann:
        assert frame.value == bytes.fromhex(ann["value_hex"])
    assert frame.encode() == raw

    if name.startswith("pythondcpclient") and ann["opcode"] == "DCP_OPEN" and not frame.extras:
        # an old client's control message sent with the DCP_OPEN opcode and no extras:
        # the frame is well formed, the DCP_OPEN body is not, and the error names the field
        with pytest.raises(ProtocolError) as err:
            decode_message(frame)
        assert err.value.field == "extras"
        return

    msg = decode_message(frame)
    fields = message_fields(msg)
    if "features" in ann:
        assert list(fields["features"]) == [int(f.split()[0], 16) for f in ann["features"]]
    for key, expected in ann.get("decoded", {}).items():
        assert fields[RENAME.get(key, key)] == _int(expected), key
    assert msg.encode() == raw


def test_libdcp_quirks_decode():
    """libdcp writes stream flags unswapped and pads connection_buffer_size with NULs."""
    text = (VECTORS / "libdcp-cbcrecv-initial.requests.hex").read_text()
    msgs = [decode_message(decode_frame(bytes.fromhex(LINE.match(l)["hex"]))[0])
            for l in text.splitlines() if LINE.match(l)]
    reqs = [m for m in msgs if type(m).__name__ == "DcpStreamReq"]
    assert {m.flags for m in reqs} == {0x30000000}
    ctl = [m for m in msgs if type(m).__name__ == "DcpControl" and m.key == "connection_buffer_size"]
    assert ctl[0].value == b"20971520\x00\x00" and ctl[0].value_text == "20971520"
