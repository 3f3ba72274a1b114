"""Every DCP frame real clients sent (tests/vectors) gets the answer a real node gives.

The node holds what the captured runs expected: four vbuckets with 4, 2, 0 and 5 items
(the end seqnos cbtransfer asked for), a user `Administrator`/`password`, and a user
named like the bucket with an empty password (python-dcp-client logs in as `default`,
which a real node maps to the bucket of that name). The mock that recorded the vectors
used its own vbucket uuids (0xa1b2c3d4000N); this node has others, so every resume with
a start above 0 is told to roll back to 0, as a real node would tell these clients.
"""
from __future__ import annotations

import struct

import pytest

from dcptool.protocol import decode_message
from dcptool.protocol.constants import Opcode, Status, StreamEndReason
from dcptool.protocol.messages import DcpStreamEnd

from .dcputil import DcpClient
from .vectorutil import by_connection, is_dcp_opcode, read_vector

ITEMS = {0: 4, 1: 2, 2: 0, 3: 5}
CONTROLS_OK = {"connection_buffer_size", "enable_noop", "set_noop_interval",
               "enable_expiry_opcode", "enable_stream_id", "set_priority"}
NO_RESPONSE = {Opcode.DCP_BUFFER_ACKNOWLEDGEMENT}


@pytest.fixture(scope="module")
def loaded_node(tmp_path_factory):
    from nodeprocutil import NodeProcess

    from dcptool.node.auth import Users

    from .mcbputil import connect

    d = tmp_path_factory.mktemp("vecdcp") / "node"
    d.mkdir(parents=True)
    users = Users.load(d)
    users.set_password("Administrator", "password")
    users.set_password("default", "")
    users.save()
    n = NodeProcess(d, vbuckets=4, password=None)
    n.start()
    with connect(n) as kv:
        for vb, count in ITEMS.items():
            for i in range(count):
                assert kv.set(b"k%d_%d" % (vb, i), b'{"vb": %d, "i": %d}' % (vb, i),
                              vbucket=vb).status == Status.SUCCESS
    yield n
    n.stop()


def _vector_names():
    """The vector files that hold DCP requests."""
    from conftest import vector_files

    return [p.name for p in vector_files()
            if any(c.frame.is_request and is_dcp_opcode(c.frame.opcode) for c in read_vector(p))]


class ConnState:
    def __init__(self) -> None:
        self.stream_ids = False
        self.open: dict[int, int] = {}  # vb -> end seqno of streams believed open
        self.dcp = False


def _expected(cap, st: ConnState):
    """(status, note) a real node answers to this DCP request, given the connection's state."""
    f = cap.frame
    op = f.opcode
    if op == Opcode.DCP_OPEN:
        if len(f.extras) != 8:
            return Status.EINVAL, "DCP_OPEN without extras (python-dcp-client's control message)"
        if st.dcp:
            return Status.EINVAL, "second DCP_OPEN"
        return Status.SUCCESS, ""
    if op == Opcode.DCP_CONTROL:
        key = f.key.decode()
        return (Status.SUCCESS if key in CONTROLS_OK else Status.EINVAL), key
    if op == Opcode.DCP_GET_FAILOVER_LOG:
        return Status.SUCCESS, ""
    if op == Opcode.DCP_STREAM_REQ:
        msg = decode_message(f)
        if st.stream_ids and msg.stream_id is None:
            return Status.DCP_STREAM_ID_INVALID, "enable_stream_id without a stream id"
        if f.specific in st.open:
            return Status.KEY_EEXISTS, ""
        if msg.start_seqno == 0:
            return Status.SUCCESS, ""
        return Status.ROLLBACK, "unknown vbucket uuid"
    if op == Opcode.DCP_CLOSE_STREAM:
        if st.stream_ids:
            return Status.DCP_STREAM_ID_INVALID, ""
        return (Status.SUCCESS if f.specific in st.open else Status.KEY_ENOENT), ""
    raise AssertionError(f"no expectation for opcode {op:#x}")


def _note_stream_ends(c: DcpClient, st: ConnState) -> None:
    for f in list(c.backlog):
        if f.magic == 0x80 and f.opcode == Opcode.DCP_STREAM_END:
            st.open.pop(f.specific, None)


@pytest.mark.parametrize("name", _vector_names())
def test_dcp_frames_get_the_answers_of_a_real_node(loaded_node, vectors_dir, name):
    frames = read_vector(vectors_dir / name)
    checked = 0
    for _conn, captured in by_connection(frames).items():
        st = ConnState()
        with DcpClient(loaded_node.host, loaded_node.port, vbuckets=4) as c:
            for cap in captured:
                f = cap.frame
                if not f.is_request:
                    c.send(cap.raw)  # the client's NOOP replies: the node takes them silently
                    continue
                if f.opcode == Opcode.SET:
                    continue  # writes are replayed by test_vectors_kv; keep this node's data
                c.send(cap.raw)
                if not is_dcp_opcode(f.opcode):
                    rsp = c.wait_response(f.opaque, timeout=10)
                    while f.opcode == Opcode.STAT and rsp.key:
                        rsp = c.wait_response(f.opaque, timeout=10)
                    continue
                if f.opcode in NO_RESPONSE:
                    continue
                _note_stream_ends(c, st)
                want, why = _expected(cap, st)
                rsp = c.wait_response(f.opaque, timeout=10)
                assert (rsp.opcode, rsp.status) == (f.opcode, want), f"{cap.note} ({why})"
                decode_message(rsp)
                checked += 1
                if f.opcode == Opcode.DCP_OPEN and want == Status.SUCCESS:
                    st.dcp = True
                if f.opcode == Opcode.DCP_CONTROL and f.key == b"enable_stream_id":
                    st.stream_ids = True
                if f.opcode == Opcode.DCP_STREAM_REQ:
                    if want == Status.SUCCESS:
                        assert len(rsp.value) % 16 == 0 and rsp.value
                        st.open[f.specific] = decode_message(f).end_seqno
                    elif want == Status.ROLLBACK:
                        assert struct.unpack(">Q", rsp.value) == (0,)
                if f.opcode == Opcode.DCP_CLOSE_STREAM and want == Status.SUCCESS:
                    st.open.pop(f.specific, None)
                if f.opcode == Opcode.DCP_GET_FAILOVER_LOG:
                    assert decode_message(rsp).entries
            # streams whose end the node has reached finish with STREAM_END OK and the items
            ending = {vb: end for vb, end in st.open.items() if end <= ITEMS[vb]}
            got: dict[int, list[int]] = {vb: [] for vb in ending}
            while ending:
                m = c.next_message(timeout=10)
                if m.vbucket in ending and hasattr(m, "by_seqno"):
                    got[m.vbucket].append(m.by_seqno)
                if isinstance(m, DcpStreamEnd) and m.vbucket in ending:
                    assert m.reason == StreamEndReason.OK
                    assert got[m.vbucket] == list(range(1, ending.pop(m.vbucket) + 1))
    assert checked > 0
