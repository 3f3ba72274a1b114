"""MetaWriter's handling of answers a healthy reference node never gives (TMPFAIL, failures).

The reference node throttles writers instead of answering TMPFAIL, so the retry path is
exercised against a scripted peer on a socketpair; everything else about restore is tested
end to end against real nodes in test_backup_restore.py.
"""
from __future__ import annotations

from client.peerutil import Peer

from dcptool.pipeline.metawriter import WRITE_DELETION, WRITE_MUTATION, MetaWriter
from dcptool.protocol.constants import Opcode, Status


def test_tmpfail_is_retried_with_backoff_and_other_errors_are_counted():
    answered: dict[bytes, int] = {}

    def setq(peer, frame):
        n = answered.get(frame.key, 0)
        answered[frame.key] = n + 1
        if frame.key == b"busy" and n < 2:
            peer.reply(frame, status=Status.ETMPFAIL)       # twice, then it goes through
        elif frame.key == b"newer":
            peer.reply(frame, status=Status.KEY_EEXISTS)    # the node holds a newer version
        elif frame.key == b"bad":
            peer.reply(frame, status=Status.E2BIG)
        # success of a quiet write: no answer

    peer = Peer({Opcode.SETQ_WITH_META: setq, Opcode.DELQ_WITH_META: setq,
                 Opcode.NOOP: lambda p, f: p.reply(f)})
    conn = peer.connection()
    writer = MetaWriter(conn, 16, window=3, backoff=0.01)
    recs = [(WRITE_MUTATION, k, b"{}", 0, 0, 1, 100, 1) for k in (b"a", b"busy", b"newer", b"bad", b"c")]
    recs.append((WRITE_DELETION, b"gone", b"", 0, 0, 2, 200, 0))
    counts = writer.write(recs).as_dict()
    assert answered[b"busy"] == 3
    assert counts["retries"] == 2
    assert counts["restored"] == {"mutation": 3, "deletion": 1, "expiration": 0}
    assert counts["skipped"]["mutation"] == 1 and counts["failed"]["mutation"] == 1
    assert counts["errors"] == ["mutation bad: E2BIG"]
    peer.close()


def test_two_windows_are_in_flight_and_answers_find_their_window():
    noops: list = []
    held: list = []  # answers not sent yet, in order: (frame, status)

    def noop(peer, frame):
        # answer a window's NOOP only once the next window arrived (or it is the last):
        # a writer that waited for each answer before sending on would hang here
        noops.append(frame.opaque)
        held.append((frame, Status.SUCCESS))
        if sum(f.opcode == Opcode.NOOP for f, _ in held) == 2 or len(noops) == 3:
            for f, status in held:
                peer.reply(f, status=status)
            held.clear()

    def setq(peer, frame):
        if frame.key == b"k3":  # in the second window
            held.append((frame, Status.KEY_EEXISTS))

    peer = Peer({Opcode.SETQ_WITH_META: setq, Opcode.NOOP: noop})
    writer = MetaWriter(peer.connection(timeout=10), 16, window=2, depth=2)
    recs = [(WRITE_MUTATION, b"k%d" % i, b"v", 0, 0, 1, 100 + i, 0) for i in range(6)]
    counts = writer.write(recs).as_dict()
    assert len(noops) == 3 and len(set(noops)) == 3
    assert counts["restored"]["mutation"] == 5 and counts["skipped"]["mutation"] == 1
    peer.close()


def test_windows_hold_a_bounded_number_of_value_bytes():
    """Records of large values go out in windows of at most WINDOW_BYTES of values (a larger
    record alone), each closed by its NOOP; all are counted."""
    from dcptool.pipeline import metawriter

    sizes = [3 << 20, 3 << 20, 3 << 20, 9 << 20, 100, 100, 5 << 20]
    windows: list = [[]]

    def setq(peer, frame):
        windows[-1].append(len(frame.value))

    def noop(peer, frame):
        windows.append([])
        peer.reply(frame)

    peer = Peer({Opcode.SETQ_WITH_META: setq, Opcode.NOOP: noop})
    writer = MetaWriter(peer.connection(timeout=30), 16, window=2000)
    recs = [(WRITE_MUTATION, b"k%d" % i, b"v" * n, 0, 0, 1, 100 + i, 0) for i, n in enumerate(sizes)]
    counts = writer.write(recs).as_dict()
    assert counts["restored"]["mutation"] == len(sizes)
    sent = [w for w in windows if w]
    assert [len(w) for w in sent] == [2, 1, 1, 3]  # 6 MiB, 3, 9 (alone), 5 MiB + 200 B
    assert all(sum(w) <= metawriter.WINDOW_BYTES or len(w) == 1 for w in sent)
    assert sum(sent, []) == sizes
    peer.close()
