"""TLS for the local server: a fresh self-signed certificate for 127.0.0.1, ::1 and localhost, or the user's.

The certificate is its own trust anchor (a CA with path length 0 that also carries serverAuth), so a client
passes its one PEM file as ``verify=`` and strict X.509 checking (Python 3.13's default) accepts it. A new key
and certificate are made for every server run in a private temporary folder, removed when the server stops.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import shutil
import ssl
import tempfile
from dataclasses import dataclass

from llmchat.core.errors import UsageError


@dataclass(frozen=True)
class TLSFiles:
    """The PEM files the server loads, and the one a client should trust."""

    certfile: str
    keyfile: str
    trust_path: str
    temp_dir: str | None = None
    """The folder to remove when the server stops (only for a self-signed certificate)."""

    def cleanup(self) -> None:
        """Remove the self-signed certificate's folder; a user's files are left alone. Never raises."""
        if self.temp_dir:
            shutil.rmtree(self.temp_dir, ignore_errors=True)


def self_signed() -> TLSFiles:
    """Make a key and a self-signed certificate valid for a year in a new private temp folder.

    Fails with OSError if the temp folder cannot be written.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    public = key.public_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "llmchat local server")])
    now = datetime.datetime.now(datetime.UTC)
    usage = x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=True,
        crl_sign=False,
        encipher_only=False,
        decipher_only=False,
    )
    alt_names = x509.SubjectAlternativeName(
        [
            x509.DNSName("localhost"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            x509.IPAddress(ipaddress.ip_address("::1")),
        ]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))  # tolerate a little clock skew
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(alt_names, critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(usage, critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    folder = tempfile.mkdtemp(prefix="llmchat-tls-")  # mode 0700: the key stays private
    certfile = os.path.join(folder, "cert.pem")
    keyfile = os.path.join(folder, "key.pem")
    with open(certfile, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    with open(os.open(keyfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
        f.write(key_pem)
    return TLSFiles(certfile=certfile, keyfile=keyfile, trust_path=certfile, temp_dir=folder)


def user_files(certfile: str, keyfile: str) -> TLSFiles:
    """The user's certificate and key, checked by loading them; raises UsageError naming the file and fix."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(certfile, keyfile)
    except FileNotFoundError as exc:
        raise UsageError(
            f"--certfile/--keyfile: {exc.filename} does not exist; give the path of a PEM file"
        ) from None
    except (ssl.SSLError, OSError) as exc:
        raise UsageError(
            f"--certfile {certfile} / --keyfile {keyfile} cannot be loaded ({exc.__class__.__name__}); "
            "give a PEM certificate and its matching unencrypted private key"
        ) from None
    return TLSFiles(certfile=certfile, keyfile=keyfile, trust_path=certfile)
