"""Test-time X.509 with the `cryptography` package: a CA, an RSA server certificate for
127.0.0.1, and client certificates naming a user in their subject CN or SAN."""
from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass
class Issued:
    cert: Path
    key: Path


class CA:
    def __init__(self, d: Path, name: str = "dcptool test client CA") -> None:
        self.dir = Path(d)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.timezone.utc)
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self.cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
                     .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(now - dt.timedelta(minutes=5))
                     .not_valid_after(now + dt.timedelta(days=2))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
                     .add_extension(x509.KeyUsage(False, False, False, False, False, True, True,
                                                  False, False), True)
                     .sign(self.key, hashes.SHA256()))
        self.path = self.dir / (name.replace(" ", "-") + ".pem")
        self.path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, stem: str, *, cn: str | None = None, emails: tuple[str, ...] = (),
              dns: tuple[str, ...] = (), ips: tuple[str, ...] = (), server: bool = False,
              rsa_key: bool = False, passphrase: bytes | None = None) -> Issued:
        key = (rsa.generate_private_key(65537, 2048) if rsa_key
               else ec.generate_private_key(ec.SECP256R1()))
        now = dt.datetime.now(dt.timezone.utc)
        names = [x509.NameAttribute(NameOID.COMMON_NAME, cn)] if cn else []
        b = (x509.CertificateBuilder().subject_name(x509.Name(names))
             .issuer_name(self.cert.subject).public_key(key.public_key())
             .serial_number(x509.random_serial_number())
             .not_valid_before(now - dt.timedelta(minutes=5))
             .not_valid_after(now + dt.timedelta(days=2))
             .add_extension(x509.BasicConstraints(ca=False, path_length=None), True)
             .add_extension(x509.ExtendedKeyUsage(
                 [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]),
                 False))
        sans = ([x509.RFC822Name(e) for e in emails] + [x509.DNSName(d) for d in dns]
                + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips])
        if sans:
            b = b.add_extension(x509.SubjectAlternativeName(sans), False)
        cert = b.sign(self.key, hashes.SHA256())
        enc = (serialization.BestAvailableEncryption(passphrase) if passphrase
               else serialization.NoEncryption())
        cpath, kpath = self.dir / f"{stem}.pem", self.dir / f"{stem}.key"
        cpath.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        kpath.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                            serialization.PrivateFormat.PKCS8, enc))
        kpath.chmod(0o600)
        return Issued(cpath, kpath)
