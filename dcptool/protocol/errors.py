"""The one error type the codec raises for malformed input."""
from __future__ import annotations


class ProtocolError(ValueError):
    """Malformed protocol input. `field` names the part that is wrong.

    `framing_lost` is true when the byte stream cannot be resynchronised (unknown
    magic, body above the limit): a server then closes the connection. Otherwise
    `frame_size`, when set, is the size of the bad packet so a reader can skip it. A body
    above the limit carries `frame_size` too: a server that can discard the body as it
    arrives may answer E2BIG and go on.
    """

    def __init__(self, field: str, reason: str, *, offset: int | None = None,
                 framing_lost: bool = False, frame_size: int | None = None,
                 opcode: int | None = None, opaque: int | None = None) -> None:
        self.field = field
        self.reason = reason
        self.offset = offset
        self.framing_lost = framing_lost
        self.frame_size = frame_size
        self.opcode = opcode
        self.opaque = opaque
        where = f" at offset {offset}" if offset is not None else ""
        super().__init__(f"{field}: {reason}{where}")
