"""TLS certificates for tests of HTTPS and gRPC endpoints, made with `cryptography`:
a self-signed one, or a certificate authority and the server and client certificates
it signs (mutual TLS)."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_LOCALHOST = x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])


def _builder(subject: str, issuer: str, key: ec.EllipticCurvePrivateKey) -> x509.CertificateBuilder:
    """Valid from a day ago for a day."""
    now = datetime.datetime.now(datetime.UTC)
    return (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=1)))


def _write(cert_path: Path, key_path: Path, cert: x509.Certificate,
           key: ec.EllipticCurvePrivateKey) -> tuple[Path, Path]:
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_path.chmod(0o600)
    return cert_path, key_path


def self_signed_cert(directory: Path) -> tuple[Path, Path]:
    """(cert.pem, key.pem) for localhost and 127.0.0.1, valid from a day ago for a day."""
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (_builder("localhost", "localhost", key).add_extension(_LOCALHOST, critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return _write(directory / "cert.pem", directory / "key.pem", cert, key)


@dataclass(frozen=True)
class CertificateAuthority:
    """A test CA: `cert_file` is what a peer trusts; `issue` signs server and client
    certificates."""

    name: str
    directory: Path
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def cert_file(self) -> Path:
        return self.directory / f"{self.name}.pem"

    def issue(self, name: str, *, client: bool) -> tuple[Path, Path]:
        """(cert, key) files of `name`, signed by this CA: a client certificate (TLS client
        authentication), or a server one for localhost and 127.0.0.1."""
        key = ec.generate_private_key(ec.SECP256R1())
        usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
        builder = (_builder(name, self.name, key)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
        if not client:
            builder = builder.add_extension(_LOCALHOST, critical=False)
        return _write(self.directory / f"{name}.pem", self.directory / f"{name}-key.pem",
                      builder.sign(self.key, hashes.SHA256()), key)


def certificate_authority(directory: Path, name: str = "test-ca") -> CertificateAuthority:
    """A new CA whose certificate is `directory/{name}.pem`."""
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (_builder(name, name, key)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    _write(directory / f"{name}.pem", directory / f"{name}-key.pem", cert, key)
    return CertificateAuthority(name, directory, cert, key)
