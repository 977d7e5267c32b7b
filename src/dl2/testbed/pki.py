"""Credentials for the local control plane: a CA, the API server's serving certificate, the
service-account signing key and a static bearer token, written into the testbed folder."""

from __future__ import annotations

import datetime
import ipaddress
import secrets
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from dl2.paths import write_text_atomic

ADMIN_USER = "dl2-admin"


@dataclass(frozen=True)
class Credentials:
    ca: Path
    cert: Path
    key: Path
    sa_key: Path
    sa_pub: Path
    token_file: Path
    token: str
    client_cert: Path  # the admin's client certificate (group system:masters), for certificate logins
    client_key: Path


def _pem_key(key: ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def _cert(subject: str, public_key, issuer: x509.Name, signer, ca: bool, sans: list[x509.GeneralName],
          group: str | None = None) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    name = [x509.NameAttribute(NameOID.COMMON_NAME, subject)]
    if group:  # the API server reads a client certificate's organization as the user's group
        name.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, group))
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name(name))
               .issuer_name(issuer)
               .public_key(public_key)
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=365))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(signer, hashes.SHA256())


def generate(folder: Path) -> Credentials:
    """A fresh CA, a serving certificate for 127.0.0.1/localhost, a service-account key pair, and the admin's
    token and client certificate."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dl2-testbed-ca")])
    ca = _cert("dl2-testbed-ca", ca_key.public_key(), ca_name, ca_key, True, [])
    key = ec.generate_private_key(ec.SECP256R1())
    sans = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    cert = _cert("kube-apiserver", key.public_key(), ca_name, ca_key, False, sans)
    sa_key = ec.generate_private_key(ec.SECP256R1())
    token = secrets.token_hex(24)
    client_key = ec.generate_private_key(ec.SECP256R1())
    client = _cert(ADMIN_USER, client_key.public_key(), ca_name, ca_key, False, [], group="system:masters")
    creds = Credentials(folder / "ca.crt", folder / "apiserver.crt", folder / "apiserver.key", folder / "sa.key",
                        folder / "sa.pub", folder / "tokens.csv", token, folder / "admin.crt", folder / "admin.key")
    write_text_atomic(creds.ca, ca.public_bytes(serialization.Encoding.PEM).decode())
    write_text_atomic(creds.cert, cert.public_bytes(serialization.Encoding.PEM).decode())
    write_text_atomic(creds.key, _pem_key(key))
    write_text_atomic(creds.sa_key, _pem_key(sa_key))
    write_text_atomic(creds.sa_pub, sa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode())
    write_text_atomic(creds.token_file, f"{token},{ADMIN_USER},{ADMIN_USER},system:masters\n")
    write_text_atomic(creds.client_cert, client.public_bytes(serialization.Encoding.PEM).decode())
    write_text_atomic(creds.client_key, _pem_key(client_key))
    return creds
