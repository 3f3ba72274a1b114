"""Where and how to connect to a node: a picklable value shared by commands and Spark tasks.

`ConnOptions` holds no socket or SSL context, so a Spark driver can ship it to its tasks;
`connect()` and `consumer()` open what a task needs. The password is kept out of repr().

The password comes from the caller, else from the first line of the file named by
DCPTOOL_PASSWORD_FILE, else from a prompt on a terminal.

`snappy` negotiates Snappy (HELLO feature 0x0a) on every connection, and DCP connections
then ask the node to send every value compressed (DCP_CONTROL force_value_compression):
fewer bytes on the wire for more CPU on both ends. The caller's choice, else
DCPTOOL_SNAPPY, else DEFAULT_SNAPPY. Compressed values are decompressed as they arrive
whether or not it was asked for (see dcptool.client.session).
"""
from __future__ import annotations

import getpass
import os
import ssl
import sys
from dataclasses import dataclass, field
from pathlib import Path

from dcptool.errors import UsageError
from dcptool.procs import run_secret_command
from dcptool.protocol.constants import Feature

from .connection import DEFAULT_FEATURES, Connection, parse_cluster_url
from .consumer import DcpConsumer, collections_features
from .session import SessionConfig

DEFAULT_USERNAME = "Administrator"
PASSWORD_FILE_ENV = "DCPTOOL_PASSWORD_FILE"
PASSWORD_COMMAND_ENV = "DCPTOOL_PASSWORD_COMMAND"
CLIENT_CERT_ENV = "DCPTOOL_CLIENT_CERT"
CLIENT_KEY_ENV = "DCPTOOL_CLIENT_KEY"
CLIENT_KEY_PASSPHRASE_FILE_ENV = "DCPTOOL_CLIENT_KEY_PASSPHRASE_FILE"
SNAPPY_ENV = "DCPTOOL_SNAPPY"
#: whether connections negotiate Snappy unless told: off, as a backup from a local node ran
#: at 0.75-0.80x the items/s with every value compressed (the node compresses, the task
#: decompresses, for 0.71x the bytes on the wire; `python -m benchmarks run --only snappy`,
#: docs/performance.md "Snappy"); a slow network between node and backup is where it pays
DEFAULT_SNAPPY = False

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def snappy_from_env() -> bool:
    """DCPTOOL_SNAPPY as a boolean (1/true/yes/on or 0/false/no/off); DEFAULT_SNAPPY unset."""
    text = os.environ.get(SNAPPY_ENV)
    if text is None:
        return DEFAULT_SNAPPY
    word = text.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise UsageError(f"{SNAPPY_ENV}={text!r}: expected 1/true/yes/on or 0/false/no/off")


def read_password_file(path: str | Path, *, what: str = "--password-file") -> str:
    """The first line of `path` (without its line end): a password kept off the command line.

    Errors name the file, never its content.
    """
    try:
        with open(path, "rb") as f:
            first = f.readline()
    except OSError as exc:
        raise UsageError(f"{what} {path}: {exc.strerror or exc}") from None
    try:
        text = first.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{what} {path}: the first line is not UTF-8 text") from None
    password = text.rstrip("\r\n")
    if not password:
        raise UsageError(f"{what} {path}: the first line is empty",
                         hint="put the password on the file's first line")
    return password


def read_secret_file(path: str | Path, *, what: str) -> bytes:
    """The first line of a file as bytes (a private key's passphrase)."""
    return read_password_file(path, what=what).encode("utf-8")


def choose_password(password: str | None, path: str | Path, *, password_given: bool = False,
                    file_given: bool = False, file_label: str = "--password-file") -> str:
    """The password to run with when a password file is named as well as, maybe, a password.

    `password_given` / `file_given`: whether each came from the command line (not from
    DCPTOOL_PASSWORD / DCPTOOL_PASSWORD_FILE). Precedence: the password given on the command
    line, then the file given on the command line, then DCPTOOL_PASSWORD, then the file named
    by DCPTOOL_PASSWORD_FILE; both on the command line is a usage error. `file_label` names
    the file's source in errors.
    """
    if password is not None and password_given and file_given:
        raise UsageError("give --password or --password-file, not both")
    if password is not None and (password_given or not file_given):
        return password  # -p, or DCPTOOL_PASSWORD over DCPTOOL_PASSWORD_FILE
    return read_password_file(path, what=file_label)


def _encrypted_key(path: str) -> bool:
    try:
        head = Path(path).read_bytes()[:1 << 16]
    except OSError:
        return False
    return b"ENCRYPTED" in head


@dataclass(frozen=True)
class ConnOptions:
    host: str
    port: int
    username: str
    password: str = field(repr=False)
    bucket: str = "default"
    tls: bool = False
    cacert: str | None = None
    verify: bool = True
    timeout: float = 10.0
    snappy: bool = DEFAULT_SNAPPY
    #: client certificate and key (PEM paths) for couchbases://: the node logs the
    #: connection in as the user the certificate names, no SASL (and no password) needed
    client_cert: str | None = None
    client_key: str | None = None
    client_key_password: bytes | None = field(default=None, repr=False)

    @classmethod
    def from_cli(cls, cluster: str | None, username: str | None, password: str | None,
                 bucket: str = "default", cacert: Path | None = None, no_verify: bool = False,
                 timeout: float = 10.0, *, prompt: bool = True,
                 password_file: str | Path | None = None,
                 snappy: bool | None = None, client_cert: Path | str | None = None,
                 client_key: Path | str | None = None,
                 client_key_passphrase_file: Path | str | None = None) -> "ConnOptions":
        if not cluster:
            raise UsageError("no node given", hint="use -c/--cluster or set DCPTOOL_CLUSTER")
        host, port, tls = parse_cluster_url(cluster)
        user = username or DEFAULT_USERNAME
        key_password = None
        if client_cert is None and client_key is not None:
            raise UsageError("--client-key needs --client-cert")
        if client_cert is not None:
            if not tls:
                raise UsageError("--client-cert needs a TLS address (couchbases://HOST)")
            for flag, f in (("--client-cert", client_cert), ("--client-key", client_key)):
                if f is not None and not Path(f).is_file():
                    raise UsageError(f"{flag}: file {f} not found")
            if client_key_passphrase_file is not None:
                key_password = read_secret_file(client_key_passphrase_file,
                                                what="--client-key-passphrase-file")
            if password is None and password_file is None:
                password = ""  # the certificate logs in: no password asked for
        if password is None and os.environ.get(PASSWORD_COMMAND_ENV) and password_file is None \
                and not os.environ.get(PASSWORD_FILE_ENV):
            password = run_secret_command(os.environ[PASSWORD_COMMAND_ENV],
                                          what=PASSWORD_COMMAND_ENV)
        if password is None and password_file is not None:
            password = read_password_file(password_file)
        if password is None and os.environ.get(PASSWORD_FILE_ENV):
            password = read_password_file(os.environ[PASSWORD_FILE_ENV], what=PASSWORD_FILE_ENV)
        if password is None:
            if prompt and sys.stdin.isatty():
                try:
                    password = getpass.getpass(f"Password for {user}@{host}:{port}: ")
                except (EOFError, KeyboardInterrupt):
                    raise UsageError("no password given") from None
            else:
                raise UsageError("no password given",
                                 hint="set DCPTOOL_PASSWORD, pass --password-file FILE, or run "
                                      "on a terminal to be prompted")
        if cacert is not None and not Path(cacert).is_file():
            raise UsageError(f"--cacert: file {cacert} not found")
        if timeout <= 0:
            raise UsageError("--timeout must be positive")
        opts = cls(host, port, user, password, bucket or "default", tls,
                   str(cacert) if cacert else None, not no_verify, timeout,
                   snappy_from_env() if snappy is None else bool(snappy),
                   str(client_cert) if client_cert else None,
                   str(client_key) if client_key else None, key_password)
        if client_cert is not None:
            opts.ssl_context()  # a key that does not load is one line now, not in a task
        return opts

    @property
    def login_password(self) -> str | None:
        """The SASL password, None when a client certificate logs the connection in."""
        return None if self.client_cert else self.password

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def features(self) -> tuple[int, ...]:
        """The HELLO features every connection asks for."""
        return DEFAULT_FEATURES + ((Feature.SNAPPY,) if self.snappy else ())

    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.tls:
            return None
        if self.cacert:
            try:
                ctx = ssl.create_default_context(cafile=self.cacert)
            except (ssl.SSLError, OSError) as exc:
                raise UsageError(f"--cacert {self.cacert}: {exc}") from None
        else:
            ctx = ssl.create_default_context()
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.client_cert:
            try:
                # a callable, never None: OpenSSL would prompt on the terminal itself
                ctx.load_cert_chain(self.client_cert, self.client_key or None,
                                    password=lambda: self.client_key_password or b"")
            except (ssl.SSLError, OSError, TypeError) as exc:
                if _encrypted_key(self.client_key or self.client_cert):
                    what = ("the passphrase does not open the encrypted key"
                            if self.client_key_password else
                            "the key is encrypted: give --client-key-passphrase-file FILE")
                    raise UsageError(f"--client-key {self.client_key or self.client_cert}: "
                                     f"{what}") from None
                raise UsageError(f"--client-cert {self.client_cert}: cannot load the "
                                 f"certificate and key ({getattr(exc, 'strerror', None) or exc})"
                                 ) from None
        if not self.verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        return ctx

    def connect(self, *, bucket: str | None = ..., collections: bool = False) -> Connection:
        """An authenticated connection with the bucket selected; `collections` asks for
        HELLO Collections too (`conn.collections` says whether the node accepted)."""
        features = self.features
        if collections:
            features = collections_features(features)
        return Connection.open(self.host, self.port, username=self.username,
                               password=self.login_password,
                               bucket=self.bucket if bucket is ... else bucket,
                               tls=self.ssl_context(), timeout=self.timeout,
                               features=features)

    def consumer(self, config: SessionConfig | None = None, **kw) -> DcpConsumer:
        """A started DCP consumer session (see dcptool.client.DcpConsumer)."""
        return DcpConsumer.open(self.host, self.port, username=self.username,
                                password=self.login_password, bucket=self.bucket,
                                tls=self.ssl_context(), timeout=self.timeout, config=config,
                                features=self.features, **kw)
