"""Named constants of the memcached binary protocol and DCP.

Values are the ones a Couchbase node puts on the wire (kv_engine's tables).
"""
from __future__ import annotations

import enum


class Magic(enum.IntEnum):
    REQUEST = 0x80
    ALT_REQUEST = 0x08  # request with flexible framing extras
    RESPONSE = 0x81
    ALT_RESPONSE = 0x18  # response with flexible framing extras
    SERVER_REQUEST = 0x82
    SERVER_RESPONSE = 0x83


REQUEST_MAGICS = frozenset({Magic.REQUEST, Magic.ALT_REQUEST, Magic.SERVER_REQUEST})
RESPONSE_MAGICS = frozenset({Magic.RESPONSE, Magic.ALT_RESPONSE, Magic.SERVER_RESPONSE})
ALT_MAGICS = frozenset({Magic.ALT_REQUEST, Magic.ALT_RESPONSE})
VALID_MAGICS = REQUEST_MAGICS | RESPONSE_MAGICS


class Opcode(enum.IntEnum):
    GET = 0x00
    SET = 0x01
    ADD = 0x02
    REPLACE = 0x03
    DELETE = 0x04
    INCREMENT = 0x05
    DECREMENT = 0x06
    QUIT = 0x07
    FLUSH = 0x08
    GETQ = 0x09
    NOOP = 0x0A
    VERSION = 0x0B
    GETK = 0x0C
    GETKQ = 0x0D
    APPEND = 0x0E
    PREPEND = 0x0F
    STAT = 0x10
    SETQ = 0x11
    ADDQ = 0x12
    REPLACEQ = 0x13
    DELETEQ = 0x14
    INCREMENTQ = 0x15
    DECREMENTQ = 0x16
    APPENDQ = 0x19
    PREPENDQ = 0x1A
    TOUCH = 0x1C
    GAT = 0x1D
    GATQ = 0x1E
    HELLO = 0x1F
    SASL_LIST_MECHS = 0x20
    SASL_AUTH = 0x21
    SASL_STEP = 0x22
    SET_VBUCKET = 0x3D
    GET_VBUCKET = 0x3E
    DEL_VBUCKET = 0x3F
    GET_ALL_VB_SEQNOS = 0x48
    DCP_OPEN = 0x50
    DCP_ADD_STREAM = 0x51
    DCP_CLOSE_STREAM = 0x52
    DCP_STREAM_REQ = 0x53
    DCP_GET_FAILOVER_LOG = 0x54
    DCP_STREAM_END = 0x55
    DCP_SNAPSHOT_MARKER = 0x56
    DCP_MUTATION = 0x57
    DCP_DELETION = 0x58
    DCP_EXPIRATION = 0x59
    DCP_FLUSH = 0x5A
    DCP_SET_VBUCKET_STATE = 0x5B
    DCP_NOOP = 0x5C
    DCP_BUFFER_ACKNOWLEDGEMENT = 0x5D
    DCP_CONTROL = 0x5E
    DCP_SYSTEM_EVENT = 0x5F
    DCP_PREPARE = 0x60
    DCP_SEQNO_ACKNOWLEDGED = 0x61
    DCP_COMMIT = 0x62
    DCP_ABORT = 0x63
    DCP_SEQNO_ADVANCED = 0x64
    DCP_OSO_SNAPSHOT = 0x65
    GET_REPLICA = 0x83
    SELECT_BUCKET = 0x89
    OBSERVE_SEQNO = 0x91
    GET_LOCKED = 0x94
    UNLOCK_KEY = 0x95
    GET_FAILOVER_LOG = 0x96
    GET_META = 0xA0
    GETQ_META = 0xA1
    SET_WITH_META = 0xA2
    SETQ_WITH_META = 0xA3
    ADD_WITH_META = 0xA4
    ADDQ_WITH_META = 0xA5
    DEL_WITH_META = 0xA8
    DELQ_WITH_META = 0xA9
    COMPACT_DB = 0xB3
    GET_CLUSTER_CONFIG = 0xB5
    GET_COLLECTIONS_MANIFEST = 0xBA
    GET_COLLECTION_ID = 0xBB
    GET_SCOPE_ID = 0xBC
    # dcptool extensions (not defined by kv_engine); see docs/protocol-extensions.md
    HWT_REGISTER = 0xE4
    HWT_LIST = 0xE5
    HWT_REMOVE = 0xE6
    GET_ERROR_MAP = 0xFE


# The name the vectors and `dcptool decode` use for 0x5d.
OPCODE_DISPLAY = {Opcode.DCP_BUFFER_ACKNOWLEDGEMENT: "DCP_BUFFER_ACK"}


def opcode_name(code: int) -> str:
    try:
        op = Opcode(code)
    except ValueError:
        return f"UNKNOWN_0x{code:02x}"
    return OPCODE_DISPLAY.get(op, op.name)


class Status(enum.IntEnum):
    SUCCESS = 0x0000
    KEY_ENOENT = 0x0001
    KEY_EEXISTS = 0x0002
    E2BIG = 0x0003
    EINVAL = 0x0004
    NOT_STORED = 0x0005
    DELTA_BADVAL = 0x0006
    NOT_MY_VBUCKET = 0x0007
    NO_BUCKET = 0x0008
    LOCKED = 0x0009
    DCP_STREAM_NOT_FOUND = 0x000A
    OPAQUE_NO_MATCH = 0x000B
    EWOULD_THROTTLE = 0x000C
    ECONFIG_ONLY = 0x000D
    NOT_LOCKED = 0x000E
    CAS_VALUE_INVALID = 0x000F
    AUTH_STALE = 0x001F
    AUTH_ERROR = 0x0020
    AUTH_CONTINUE = 0x0021
    ERANGE = 0x0022
    ROLLBACK = 0x0023
    EACCESS = 0x0024
    NOT_INITIALIZED = 0x0025
    RATE_LIMITED_MAX_CONNECTIONS = 0x0032
    UNKNOWN_FRAME_INFO = 0x0080
    UNKNOWN_COMMAND = 0x0081
    ENOMEM = 0x0082
    NOT_SUPPORTED = 0x0083
    EINTERNAL = 0x0084
    EBUSY = 0x0085
    ETMPFAIL = 0x0086
    XATTR_EINVAL = 0x0087
    UNKNOWN_COLLECTION = 0x0088
    UNKNOWN_SCOPE = 0x008C
    DCP_STREAM_ID_INVALID = 0x008D


def status_name(code: int) -> str:
    try:
        return Status(code).name
    except ValueError:
        return f"UNKNOWN_0x{code:04x}"


class Datatype(enum.IntFlag):
    RAW = 0x00
    JSON = 0x01
    SNAPPY = 0x02
    XATTR = 0x04


DATATYPE_MASK = 0x07


class Feature(enum.IntEnum):
    INVALID = 0x01
    TLS = 0x02
    TCP_NODELAY = 0x03
    MUTATION_SEQNO = 0x04
    TCP_DELAY = 0x05
    XATTR = 0x06
    XERROR = 0x07
    SELECT_BUCKET = 0x08
    INVALID2 = 0x09
    SNAPPY = 0x0A
    JSON = 0x0B
    DUPLEX = 0x0C
    CLUSTERMAP_CHANGE_NOTIFICATION = 0x0D
    UNORDERED_EXECUTION = 0x0E
    TRACING = 0x0F
    ALT_REQUEST_SUPPORT = 0x10
    SYNC_REPLICATION = 0x11
    COLLECTIONS = 0x12
    SNAPPY_EVERYWHERE = 0x13
    PRESERVE_TTL = 0x14
    VATTR = 0x15
    INVALID3 = 0x16
    SUBDOC_CREATE_AS_DELETED = 0x17
    SUBDOC_DOCUMENT_MACRO_SUPPORT = 0x18
    SUBDOC_REPLACE_BODY_WITH_XATTR = 0x19
    REPORT_UNIT_USAGE = 0x1A
    NON_BLOCKING_THROTTLING_MODE = 0x1B
    SUBDOC_REPLICA_READ = 0x1C
    GET_CLUSTER_CONFIG_WITH_KNOWN_VERSION = 0x1D
    DEDUPE_NOT_MY_VBUCKET_CLUSTERMAP = 0x1E
    CLUSTERMAP_CHANGE_NOTIFICATION_BRIEF = 0x1F


def feature_name(code: int) -> str:
    try:
        return Feature(code).name
    except ValueError:
        return f"UNKNOWN_0x{code:04x}"


class DcpOpenFlag(enum.IntFlag):
    PRODUCER = 0x001
    INVALID = 0x002  # formerly Notifier
    INCLUDE_XATTRS = 0x004
    NO_VALUE = 0x008
    UNUSED = 0x010
    INCLUDE_DELETE_TIMES = 0x020
    NO_VALUE_WITH_UNDERLYING_DATATYPE = 0x040
    PITR = 0x080
    INCLUDE_DELETED_USER_XATTRS = 0x100
    SKIP_DELETES_IN_INITIAL_BACKFILL = 0x200


class StreamFlag(enum.IntFlag):
    TAKEOVER = 0x001
    DISK_ONLY = 0x002
    TO_LATEST = 0x004
    NO_VALUE = 0x008  # removed in 5.0, rejected
    ACTIVE_VB_ONLY = 0x010
    STRICT_VB_UUID = 0x020
    FROM_LATEST = 0x040
    IGNORE_PURGED_TOMBSTONES = 0x080
    CACHE_TRANSFER = 0x100


class SnapshotFlag(enum.IntFlag):
    MEMORY = 0x01
    DISK = 0x02
    CHECKPOINT = 0x04
    ACK = 0x08
    HISTORY = 0x10
    MAY_CONTAIN_DUPLICATES = 0x20


class StreamEndReason(enum.IntEnum):
    OK = 0
    CLOSED = 1
    STATE_CHANGED = 2
    DISCONNECTED = 3
    SLOW = 4
    BACKFILL_FAIL = 5
    ROLLBACK = 6
    FILTER_EMPTY = 7
    LOST_PRIVILEGES = 8


class VBucketState(enum.IntEnum):
    ACTIVE = 1
    REPLICA = 2
    PENDING = 3
    DEAD = 4


class FrameInfoId(enum.IntEnum):
    BARRIER = 0
    DURABILITY_REQUIREMENT = 1
    DCP_STREAM_ID = 2
    OPEN_TRACING = 3
    IMPERSONATE_USER = 4
    PRESERVE_TTL = 5
    IMPERSONATE_EXTRA_PRIVILEGE = 6


class MetaOption(enum.IntFlag):
    FORCE_WITH_META_OP = 0x01
    FORCE_ACCEPT_WITH_META_OPS = 0x02
    REGENERATE_CAS = 0x04
    SKIP_CONFLICT_RESOLUTION = 0x08
    IS_EXPIRATION = 0x10


#: end_seqno meaning "stream forever"
SEQNO_MAX = 0xFFFFFFFFFFFFFFFF
HEADER_LEN = 24
#: default largest body accepted: the 20 MiB document limit plus room for key, extras, xattrs
DEFAULT_MAX_BODY = 20 * 1024 * 1024 + 1024 * 1024
