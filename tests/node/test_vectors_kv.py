"""Every non-DCP request a real client sent (tests/vectors) gets a well-formed answer."""
from __future__ import annotations

import json

import pytest

from dcptool.protocol import decode_message
from dcptool.protocol.constants import Opcode, Status

from .mcbputil import Client
from .vectorutil import by_connection, is_dcp_opcode, read_vector

EXPECTED = {
    Opcode.HELLO: Status.SUCCESS,
    Opcode.SELECT_BUCKET: Status.SUCCESS,
    Opcode.STAT: Status.SUCCESS,
    Opcode.GET_ERROR_MAP: Status.SUCCESS,
    Opcode.GET_CLUSTER_CONFIG: Status.SUCCESS,
    Opcode.SET: Status.SUCCESS,
}


@pytest.fixture(scope="module")
def vector_node(tmp_path_factory):
    from nodeprocutil import NodeProcess

    n = NodeProcess(tmp_path_factory.mktemp("vec") / "node", vbuckets=4)
    n.start()
    yield n
    n.stop()


def _vector_params():
    from conftest import vector_files

    return [p.name for p in vector_files()]


@pytest.mark.parametrize("name", _vector_params())
def test_non_dcp_frames_get_well_formed_answers(vector_node, vectors_dir, name):
    frames = read_vector(vectors_dir / name)
    answered = 0
    for _conn, captured in by_connection(frames).items():
        with Client(vector_node.host, vector_node.port, vbuckets=4) as c:
            for cap in captured:
                f = cap.frame
                if not f.is_request or is_dcp_opcode(f.opcode):
                    continue  # DCP frames and replies to the producer: tests/node/test_vectors_dcp.py
                c.send(cap.raw)
                rsp = c.wait_response(f.opaque, timeout=10)
                assert rsp.opcode == f.opcode, cap.note
                msg = decode_message(rsp)  # raises if the answer is malformed
                answered += 1
                if f.opcode == Opcode.SASL_AUTH:
                    ok = b"\x00Administrator\x00password" == f.value
                    assert rsp.status == (Status.SUCCESS if ok else Status.AUTH_ERROR), cap.note
                    continue
                assert rsp.status == EXPECTED[f.opcode], cap.note
                if f.opcode == Opcode.STAT:
                    stats = {}
                    while rsp.key:
                        stats[rsp.key] = rsp.value
                        rsp = c.wait_response(f.opaque, timeout=10)
                        assert rsp.status == Status.SUCCESS
                    if f.key == b"vbucket-seqno":
                        assert {b"vb_%d:high_seqno" % vb for vb in range(4)} <= set(stats)
                    if f.key == b"failovers":
                        assert b"vb_0:0:id" in stats
                elif f.opcode in (Opcode.GET_ERROR_MAP, Opcode.GET_CLUSTER_CONFIG):
                    assert isinstance(json.loads(rsp.value), dict)
                elif f.opcode == Opcode.HELLO:
                    assert set(msg.features) <= {3, 4, 6, 7, 8, 0x0A, 0x0B, 0x0C, 0x0D, 0x10,
                                                 0x12, 0x15, 0x18, 0x1F}
                    # Collections (0x12) acknowledged exactly when asked for, and every
                    # acknowledged feature was asked for
                    asked = set(decode_message(f).features)
                    assert (0x12 in msg.features) == (0x12 in asked)
                    assert set(msg.features) <= asked
    assert answered > 0
