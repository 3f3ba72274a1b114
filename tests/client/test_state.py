"""Session state files: round trip, atomic replacement, and clear errors for bad files."""
from __future__ import annotations

import json

import pytest

from dcptool.client import Position, SessionState, StateFileError, load_state, save_state


def test_round_trip_and_replace(tmp_path):
    path = tmp_path / "s.json"
    st = SessionState({0: Position.at(5, 10, ((5, 0),)), 513: Position(6, 7, 5, 9, ((6, 0),), (4,))},
                      "default", {"node": "h:1"})
    save_state(path, st)
    back = load_state(path)
    assert back.positions == st.positions and back.bucket == "default" and back.meta == {"node": "h:1"}
    st.positions[0] = Position.at(5, 11, ((5, 0),))
    save_state(path, st)
    assert load_state(path).positions[0].seqno == 11
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.json"]  # no temporary files left


@pytest.mark.parametrize("content,words", [
    (b"{not json", "not valid JSON"),
    (b'{"format": "other"}', "not a dcptool session state"),
    (b'{"format": "dcptool-session", "version": 99}', "version 99"),
    (b'{"format": "dcptool-session", "version": 1, "vbuckets": {"0": {"seqno": 5, "snap_start": 6, "snap_end": 9}}}',
     "outside its snapshot"),
])
def test_bad_files(tmp_path, content, words):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(StateFileError, match=words):
        load_state(path)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(StateFileError, match="does not exist"):
        load_state(tmp_path / "nope.json")
    with pytest.raises(StateFileError, match="cannot write"):
        save_state(tmp_path / "no-dir" / "s.json", SessionState())


def test_file_is_plain_json(tmp_path):
    path = tmp_path / "s.json"
    save_state(path, SessionState({3: Position.at(1, 2, ((1, 0),))}, "b"))
    d = json.loads(path.read_text())
    assert d["vbuckets"]["3"] == {"uuid": 1, "seqno": 2, "snap_start": 2, "snap_end": 2,
                                  "failover_log": [[1, 0]], "snapshot_ends": [2]}
