"""The node's settings, as `dcptool node start` takes them."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from dcptool.errors import UsageError
from dcptool.protocol.constants import DEFAULT_MAX_BODY

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$", re.IGNORECASE)
_DURATION_UNITS = {"ms": 0.001, "s": 1, "": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
#: words that switch a duration setting off
OFF_WORDS = ("off", "none", "never")


def parse_duration(text: str, *, what: str = "duration", allow_off: bool = False) -> float | None:
    """'3d', '12h', '90s', '250ms', '45' (seconds) -> seconds; 'off' -> None when allowed."""
    t = (text or "").strip().lower()
    if allow_off and t in OFF_WORDS:
        return None
    m = _DURATION.match(t)
    if not m:
        extra = " or off" if allow_off else ""
        raise UsageError(f"{what} {text!r} is not a duration such as 90s, 15m, 12h, 3d or 2w{extra}")
    return float(m.group(1)) * _DURATION_UNITS[(m.group(2) or "").lower()]


def format_duration(seconds: float | None) -> str:
    """The inverse of parse_duration for messages: 259200 -> '3d', None -> 'off'."""
    if seconds is None:
        return "off"
    for unit, size in (("w", 7 * 86400), ("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def parse_size(text: str, *, what: str = "size") -> int:
    """'64MiB', '64m', '65536' -> bytes (binary units)."""
    m = _SIZE.match(text or "")
    if not m:
        raise UsageError(f"{what} {text!r} is not a size such as 65536, 512KiB or 64MiB")
    unit = (m.group(2) or "").lower().rstrip("b").rstrip("i")
    return int(float(m.group(1)) * _UNITS[unit])


#: the eviction policies of `--eviction`
EVICTION_POLICIES = ("value", "full")
#: the default resident-document budget of full eviction
DEFAULT_MEMORY_QUOTA = 64 * 1024 * 1024
#: the data port Couchbase Server listens on, and its management REST ports (HTTP, HTTPS)
DEFAULT_PORT = 11210
DEFAULT_REST_PORT = 8091
DEFAULT_REST_TLS_PORT = 18091


@dataclass
class NodeConfig:
    """Everything a node needs to start.

    * `checkpoint_memory`: the budget of in-memory checkpoints; above it the slowest DCP
      cursor is dropped and its stream continues from disk.
    * `flush_interval`: seconds between flusher batches (each batch is one disk snapshot).
    * `expiry_pager_interval`: seconds between runs of the expiry pager.
    * `max_backfills`: disk backfills that may hold a read transaction at once.
    * `purge_age`: seconds a tombstone must have been deleted before compaction may purge
      it (the metadata purge age; kv_engine's default is 3 days).
    * `compaction_interval`: seconds between scheduled compactions of every vbucket, or
      None for compaction on demand only (COMPACT_DB).
    * `hwt_max_hold`: how long a high watermark table row may keep a tombstone that is old
      enough to be purged before the row is marked lost and stops holding anything back;
      None for no limit.
    * `hwt_default_ttl`: the lifetime of a registration that names none.
    * `eviction`: "value" keeps every document in memory; "full" keeps the documents not
      yet on disk and as many others as fit in `memory_quota` (docs/eviction.md).
    * `memory_quota`: bytes of resident documents in full eviction.
    """

    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 11210
    vbuckets: int = 1024
    bucket: str = "default"
    checkpoint_memory: int = 256 * 1024 * 1024
    checkpoint_max_items: int = 10000
    flush_interval: float = 0.02
    expiry_pager_interval: float = 10.0
    max_backfills: int = 8
    max_connections: int = 4096
    #: limits on what one client can make the node hold (see dcptool.node.connection):
    #: the largest request body (E2BIG above it), the replies a connection may leave
    #: unsent before the node stops reading its requests, how long such a connection may
    #: stay stuck without its replies draining (None: no limit), and how long a connection
    #: may stay unauthenticated (None: no limit)
    max_body: int = DEFAULT_MAX_BODY
    max_pending_output: int = 8 * 1024 * 1024
    stuck_timeout: float | None = 60.0
    auth_timeout: float | None = 10.0
    #: connections not yet authenticated: at most this many at once, and at most
    #: `max_unauth_per_address` from one client address (None: the defaults of
    #: `unauth_limits()`); above either bound the oldest such connection is closed
    max_unauth_connections: int | None = None
    max_unauth_per_address: int | None = None
    #: bytes all connections may hold at once for large frames not yet whole (None:
    #: `input_budget()`'s default)
    max_input_memory: int | None = None
    #: the longest a failed login delays the next attempt of the same user or address
    #: (None: no delay)
    auth_failure_delay: float | None = 5.0
    purge_age: float = 3 * 86400
    compaction_interval: float | None = None
    hwt_max_hold: float | None = 30 * 86400
    hwt_default_ttl: float = 7 * 86400
    #: False: answer the HWT opcodes UNKNOWN_COMMAND, as a Couchbase Server does (for
    #: testing clients against a node without dcptool's extension)
    hwt_enabled: bool = True
    #: False: answer like a data node without collections (Couchbase Server 6.x): HELLO
    #: Collections is not acknowledged and the collections commands are UNKNOWN_COMMAND, so
    #: every connection sees the default collection only (for testing clients against one)
    collections_enabled: bool = True
    #: TLS: certificate chain and private key (PEM); with both set, a second listener on
    #: `tls_port` (0 picks a free one) serves TLS 1.2 or later
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_port: int = 11207
    #: client certificates: the CA (PEM) they are verified against, and the JSON file of
    #: the rules that name a certificate's user (None: subject.cn, state enable); see
    #: dcptool/node/tlsconfig.py
    client_ca: Path | None = None
    client_auth: Path | None = None
    eviction: str = "value"
    memory_quota: int = DEFAULT_MEMORY_QUOTA
    #: the management REST port (HTTP) and, with TLS, its HTTPS port; None: the default
    #: rule of `rest_ports()`
    rest_port: int | None = None
    rest_tls_port: int | None = None

    def rest_ports(self) -> tuple[int, int | None]:
        """(REST port, HTTPS REST port or None without TLS) to listen on; 0 picks a free one.

        Unset, they are Couchbase's 8091 and 18091 when the data port is Couchbase's 11210,
        and free ports otherwise: test nodes on --port 0 and a second node on 11211 never
        compete for 8091.
        """
        standard = self.port == DEFAULT_PORT
        rest = self.rest_port if self.rest_port is not None else (
            DEFAULT_REST_PORT if standard else 0)
        if self.tls_cert is None:
            return rest, None
        tls = self.rest_tls_port if self.rest_tls_port is not None else (
            DEFAULT_REST_TLS_PORT if standard else 0)
        return rest, tls

    def input_budget(self) -> int:
        """--max-input-memory: 256 MiB by default, or four of the largest frames when
        --max-body is larger than 64 MiB."""
        if self.max_input_memory is not None:
            return self.max_input_memory
        return max(256 * 1024 * 1024, 4 * (self.max_body + 24))

    def unauth_limits(self) -> tuple[int, int]:
        """(unauthenticated connections at once, of them from one address).

        Defaults: 1024, but at most half of --max-connections, so that clients that log
        in always find room; 256 per address, but at most the first figure.
        """
        total = self.max_unauth_connections
        if total is None:
            total = max(1, min(1024, self.max_connections // 2))
        per = self.max_unauth_per_address
        if per is None:
            per = min(256, total)
        return total, min(per, total)

    def validate(self) -> None:
        if not 0 <= self.port <= 65535:
            raise UsageError(f"--port {self.port} is not a TCP port (0..65535)")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise UsageError("--tls-cert and --tls-key go together")
        if self.client_ca is not None and self.tls_cert is None:
            raise UsageError("--client-ca needs --tls-cert and --tls-key: client "
                             "certificates are asked for on the TLS listeners")
        if self.client_auth is not None and self.client_ca is None:
            raise UsageError("--client-auth needs --client-ca")
        if not 0 <= self.tls_port <= 65535:
            raise UsageError(f"--tls-port {self.tls_port} is not a TCP port (0..65535)")
        for flag, value in (("--rest-port", self.rest_port),
                            ("--rest-tls-port", self.rest_tls_port)):
            if value is not None and not 0 <= value <= 65535:
                raise UsageError(f"{flag} {value} is not a TCP port (0..65535)")
        if not 1 <= self.vbuckets <= 1024:
            raise UsageError(f"--vbuckets {self.vbuckets} must be between 1 and 1024")
        if not re.fullmatch(r"[A-Za-z0-9._%-]{1,100}", self.bucket):
            raise UsageError(f"--bucket {self.bucket!r} is not a valid bucket name "
                             "(letters, digits, . _ % -, at most 100)")
        if self.checkpoint_memory < 64 * 1024:
            raise UsageError("--checkpoint-memory must be at least 64KiB")
        if not 0.001 <= self.flush_interval <= 3600:
            raise UsageError("--flush-interval must be between 0.001 and 3600 seconds")
        if not 0.05 <= self.expiry_pager_interval <= 86400:
            raise UsageError("--expiry-pager-interval must be between 0.05 and 86400 seconds")
        if self.checkpoint_max_items < 1:
            raise UsageError("--checkpoint-max-items must be positive")
        if not 0 <= self.purge_age <= 10 * 365 * 86400:
            raise UsageError("--purge-age must be between 0 and 10 years")
        if self.compaction_interval is not None and not 0.1 <= self.compaction_interval <= 365 * 86400:
            raise UsageError("--compaction-interval must be between 0.1 s and 365 days, or off")
        if not 1 <= self.max_connections <= 1_000_000:
            raise UsageError("--max-connections must be between 1 and 1000000")
        if not 1024 <= self.max_body <= 0xFFFFFFFF:
            raise UsageError("--max-body must be between 1KiB and 4GiB-1")
        if not 64 * 1024 <= self.max_pending_output <= 1 << 32:
            raise UsageError("--max-pending-output must be between 64KiB and 4GiB")
        if self.stuck_timeout is not None and not 0.05 <= self.stuck_timeout <= 86400:
            raise UsageError("--stuck-timeout must be between 50ms and 1 day, or off")
        if self.auth_timeout is not None and not 0.05 <= self.auth_timeout <= 86400:
            raise UsageError("--auth-timeout must be between 50ms and 1 day, or off")
        if self.max_input_memory is not None and not (
                self.max_body + 24 <= self.max_input_memory <= 1 << 44):
            raise UsageError("--max-input-memory must hold at least one frame of --max-body "
                             f"({self.max_body + 24} bytes)")
        if self.max_unauth_connections is not None and not (
                1 <= self.max_unauth_connections <= self.max_connections):
            raise UsageError("--max-unauth-connections must be between 1 and "
                             f"--max-connections ({self.max_connections})")
        if self.max_unauth_per_address is not None and not 1 <= self.max_unauth_per_address:
            raise UsageError("--max-unauth-per-address must be at least 1")
        if self.auth_failure_delay is not None and not 0.01 <= self.auth_failure_delay <= 3600:
            raise UsageError("--auth-failure-delay must be between 10ms and 1 hour, or off")
        if self.hwt_max_hold is not None and not 0 < self.hwt_max_hold <= 10 * 365 * 86400:
            raise UsageError("--hwt-max-hold must be positive (at most 10 years), or off")
        if self.eviction not in EVICTION_POLICIES:
            raise UsageError(f"--eviction {self.eviction!r} is not one of value, full")
        if not 1024 <= self.memory_quota <= 1 << 40:
            raise UsageError("--memory-quota must be between 1KiB and 1TiB")
