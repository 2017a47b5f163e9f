"""Certificates and SuperNode keys for a secured Flower deployment, made with ``cryptography``.

- :func:`make_tls`: an EC P-256 CA and a server certificate signed by it, whose SubjectAlternativeName
  lists every host name / IP address the SuperLink is reached at (127.0.0.1 is always included: the
  SuperLink's own SuperExec connects there). One certificate serves the Fleet API (gRPC) and the
  Control/Runtime HTTP API.
- :func:`make_node_key`: an OpenSSH ECDSA (nistp384) key pair for SuperNode authentication
  (``flwr supernode register <pub>`` on the CLI side, ``--auth-supernode-private-key <priv>`` on the node).

Command line (multi-host setup, see docs/deploy.md)::

    python -m server.deploy.tls --out certs --host superlink.example.org --host 10.0.0.5 --nodes 4
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_HOSTS = ("127.0.0.1", "localhost")


@dataclass(frozen=True)
class TlsFiles:
    """PEM files of a TLS SuperLink: the CA (given to SuperNodes and the CLI) and the server pair."""

    ca_cert: Path
    server_cert: Path
    server_key: Path


@dataclass(frozen=True)
class NodeKey:
    """An OpenSSH key pair of one SuperNode."""

    private: Path
    public: Path


def _write(path: Path, data: bytes, private: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if private:
        path.chmod(0o600)
    return path


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _san(hosts: Iterable[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):  # unique, order kept
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def make_tls(out_dir: str | Path, hosts: Iterable[str] = (), days: int = 365) -> TlsFiles:
    """Write ``ca.crt``, ``server.pem`` and ``server.key`` into ``out_dir`` (SAN: ``hosts`` + 127.0.0.1, localhost)."""
    out = Path(out_dir)
    now = dt.datetime.now(dt.UTC)
    start, end = now - dt.timedelta(minutes=5), now + dt.timedelta(days=days)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedmomentum CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )

    all_hosts = [*hosts, *DEFAULT_HOSTS]
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, all_hosts[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_san(all_hosts), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    return TlsFiles(
        ca_cert=_write(out / "ca.crt", ca_cert.public_bytes(pem)),
        server_cert=_write(out / "server.pem", cert.public_bytes(pem)),
        server_key=_write(out / "server.key", _key_pem(key), private=True),
    )


def make_node_key(out_dir: str | Path, name: str) -> NodeKey:
    """Write ``<name>`` (private, OpenSSH) and ``<name>.pub`` (``ecdsa-sha2-nistp384 ...``) into ``out_dir``."""
    out = Path(out_dir)
    key = ec.generate_private_key(ec.SECP384R1())
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return NodeKey(private=_write(out / name, private, private=True), public=_write(out / f"{name}.pub", public))


def main(argv: list[str] | None = None) -> None:
    """``python -m server.deploy.tls``: write a CA, a server certificate and N SuperNode key pairs."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="certs", help="output directory")
    parser.add_argument("--host", action="append", default=[], help="SuperLink host name or IP (repeatable)")
    parser.add_argument("--nodes", type=int, default=0, help="SuperNode key pairs to generate (node0, node1, ...)")
    parser.add_argument("--days", type=int, default=365)
    args = parser.parse_args(argv)
    files = make_tls(args.out, args.host, args.days)
    print(f"CA {files.ca_cert}\nserver cert {files.server_cert}\nserver key {files.server_key}")
    for i in range(args.nodes):
        pair = make_node_key(Path(args.out) / "nodes", f"node{i}")
        print(f"node{i}: {pair.private} (keep on the SuperNode host), {pair.public} (register)")


if __name__ == "__main__":
    main()
