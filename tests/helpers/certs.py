"""Test certificates made with the ``openssl`` command: a CA and a certificate it signed
whose subjectAltName lists the given IP addresses (servers and clients use the same one), and
a second, unrelated CA with its own certificate (a client "without the right certificate")."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

import attrs


@attrs.frozen
class Certs:
    ca: Path
    cert: Path
    key: Path
    other_cert: Path  # signed by another CA
    other_key: Path

    def env(self, prefix: str, *, mutual: bool = True) -> dict[str, str]:
        """The ``<prefix>_TLS_*`` variables of a process using the right certificate."""
        return {f"{prefix}_TLS_CA": str(self.ca), f"{prefix}_TLS_CERT": str(self.cert),
                f"{prefix}_TLS_KEY": str(self.key),
                f"{prefix}_TLS_MUTUAL": "1" if mutual else "0"}


def _openssl(*argv: str | Path) -> None:
    subprocess.run(["openssl", *map(str, argv)], check=True, capture_output=True)


def _ca(directory: Path, name: str) -> tuple[Path, Path]:
    key, cert = directory / f"{name}.key", directory / f"{name}.pem"
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", key, "-out", cert, "-days", "2", "-subj", f"/CN={name}",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    return cert, key


def _leaf(directory: Path, name: str, ca: tuple[Path, Path],
          ips: Sequence[str]) -> tuple[Path, Path]:
    key, csr, cert = (directory / f"{name}.key", directory / f"{name}.csr",
                      directory / f"{name}.pem")
    ext = directory / f"{name}.ext"
    ext.write_text("subjectAltName=" + ",".join(f"IP:{ip}" for ip in ips) + "\n"
                   "basicConstraints=CA:FALSE\n")
    _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", key, "-out", csr, "-subj", f"/CN={name}")
    _openssl("x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1], "-CAcreateserial",
             "-out", cert, "-days", "2", "-extfile", ext)
    return cert, key


def make_certs(directory: Path, ips: Sequence[str]) -> Certs:
    """A CA, a certificate for ``ips`` (plus 127.0.0.1) and one from another CA."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = _ca(directory, "ca")
    cert, key = _leaf(directory, "node", ca, [*ips, "127.0.0.1"])
    other = _ca(directory, "other-ca")
    other_cert, other_key = _leaf(directory, "intruder", other, [*ips, "127.0.0.1"])
    return Certs(ca[0], cert, key, other_cert, other_key)
