"""Sans-I/O codec for the memcached binary protocol and DCP.

Bytes in, messages out: no sockets, threads or clocks. Both the client and the
reference node drive it.
"""
from .constants import *  # noqa: F401,F403
from .errors import ProtocolError
from .frame import (
    HEADER,
    Frame,
    FrameDecoder,
    decode_frame,
    decode_frames,
    encode_frame,
    encode_frame_info,
    encode_stream_id,
    parse_frame_infos,
    split_stream_id,
)
from .messages import *  # noqa: F401,F403
from .messages import REQUEST_TYPES, SUCCESS_RESPONSE_TYPES, decode_message, message_fields
from .vbucket import vbucket_of

__all__ = [
    "ProtocolError", "HEADER", "Frame", "FrameDecoder", "decode_frame", "decode_frames",
    "encode_frame", "encode_frame_info", "encode_stream_id", "parse_frame_infos",
    "split_stream_id", "REQUEST_TYPES", "SUCCESS_RESPONSE_TYPES", "decode_message",
    "message_fields", "vbucket_of",
]
