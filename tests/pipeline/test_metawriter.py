"""MetaWriter's handling of answers a healthy reference node never gives (TMPFAIL, failures).

The reference node throttles writers instead of answering TMPFAIL, so the retry path is
exercised against a scripted peer on a socketpair; everything else about restore is tested
end to end against real nodes in test_backup_restore.py.
"""
from __future__ import annotations

from client.peer import Peer

from dcptool.pipeline.metawriter import DELETION, MUTATION, MetaWriter
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
    recs = [(MUTATION, k, b"{}", 0, 0, 1, 100, 1) for k in (b"a", b"busy", b"newer", b"bad", b"c")]
    recs.append((DELETION, b"gone", b"", 0, 0, 2, 200, 0))
    counts = writer.write(recs).as_dict()
    assert answered[b"busy"] == 3
    assert counts["retries"] == 2
    assert counts["restored"] == {"mutation": 3, "deletion": 1, "expiration": 0}
    assert counts["skipped"]["mutation"] == 1 and counts["failed"]["mutation"] == 1
    assert counts["errors"] == ["mutation bad: E2BIG"]
    peer.close()
