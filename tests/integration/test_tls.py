"""TLS for real: a node with amqps:// and https:// listeners, certificates made here.

The test makes a CA, a server certificate for 127.0.0.1 (an IP address, no host name)
and a client certificate with openssl; the node requires the client certificate on
AMQP. The job moves and verifies over TLS with verification on; a wrong CA or a host
name the certificate does not carry is refused before anything moves.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from pyspark.sql import SparkSession

from rmq_spark.cli import main
from rmq_spark.config import load_config
from rmq_spark.devtools.local_brokers import LocalNode, start_nodes, stop_nodes
from rmq_spark.pipeline import run_transfer
from tests.support.brokers import (
    PASSWORD_ENV,
    Brokers,
    cluster_block,
    depth,
    fresh_vhost,
    seed,
)

MESSAGES = 300


@dataclass(frozen=True)
class Certificates:
    directory: Path

    def __getitem__(self, name: str) -> Path:
        return self.directory / name


@dataclass(frozen=True)
class TlsNode:
    node: LocalNode
    amqps_port: int
    https_port: int
    certificates: Certificates


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_certificates() -> Certificates:
    """A CA, a server certificate for 127.0.0.1, a client certificate, and a second CA.

    In a directory of its own that the nodes' user can read (pytest's is 0700).
    """
    directory = Path(tempfile.mkdtemp(prefix="rmq-spark-tls-"))
    directory.chmod(0o755)
    for ca in ("ca", "other-ca"):
        openssl(
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-subj", f"/CN=rmq-spark test {ca}", "-keyout", f"{ca}.key", "-out", f"{ca}.pem",
            cwd=directory,
        )  # fmt: skip
    (directory / "server.ext").write_text("subjectAltName = IP:127.0.0.1\n", encoding="ascii")
    for name, extensions in (("server", ["-extfile", "server.ext"]), ("client", [])):
        openssl(
            "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN=rmq-spark {name}",
            "-keyout", f"{name}.key", "-out", f"{name}.csr",
            cwd=directory,
        )  # fmt: skip
        openssl(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "2", "-out", f"{name}.pem", *extensions,
            cwd=directory,
        )  # fmt: skip
    for path in directory.iterdir():
        path.chmod(0o644)  # throw-away test keys; the nodes run as another user
    return Certificates(directory)


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@pytest.fixture(scope="module")
def tls_node(brokers: Brokers, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsNode]:
    certificates = make_certificates()
    amqps_port, https_port = free_ports(2)
    server = {
        "cacertfile": certificates["ca.pem"],
        "certfile": certificates["server.pem"],
        "keyfile": certificates["server.key"],
    }
    settings = {
        "listeners.ssl.default": f"127.0.0.1:{amqps_port}",
        **{f"ssl_options.{key}": str(path) for key, path in server.items()},
        "ssl_options.verify": "verify_peer",
        "ssl_options.fail_if_no_peer_cert": "true",  # AMQP clients must show a certificate
        "management.ssl.ip": "127.0.0.1",
        "management.ssl.port": str(https_port),
        **{f"management.ssl.{key}": str(path) for key, path in server.items()},
    }
    nodes = start_nodes(
        ["tls"], tmp_path_factory.mktemp("tls"), password=brokers.dr.password, settings=settings
    )
    try:
        yield TlsNode(nodes[0], amqps_port, https_port, certificates)
    finally:
        stop_nodes(nodes, remove_data=True)
        shutil.rmtree(certificates.directory, ignore_errors=True)


def tls_block(tls: TlsNode, *, host: str = "127.0.0.1", ca: str = "ca.pem") -> dict[str, Any]:
    certificates = tls.certificates
    return {
        "amqp": [f"amqps://{host}:{tls.amqps_port}"],
        "management": f"https://{host}:{tls.https_port}",
        "username": tls.node.username,
        "password_env": PASSWORD_ENV,
        "tls": {
            "ca_file": str(certificates[ca]),
            "cert_file": str(certificates["client.pem"]),
            "key_file": str(certificates["client.key"]),
            "verify": True,
        },
    }


def write_tls_config(path: Path, tls: TlsNode, brokers: Brokers, vhost: str, **block: str) -> Path:
    config = {
        "clusters": {"dr": tls_block(tls, **block), "main": cluster_block(brokers.main)},
        "routes": [
            {
                "name": "over-tls",
                "source": {"cluster": "dr", "vhosts": [vhost]},
                "destination": {"cluster": "main"},
            }
        ],
        "ledger": {"path": str(path.parent / "ledger")},
    }
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def fresh_tls_vhost(tls: TlsNode, brokers: Brokers, name: str) -> str:
    """The vhost on the TLS node (empty, seeded) and on main (emptied)."""
    vhost = fresh_vhost(Brokers(dr=tls.node, main=brokers.main), name)
    seed(tls.node, vhost, "orders", MESSAGES)  # over the node's plain port
    return vhost


def test_the_job_moves_and_verifies_over_tls_with_a_client_certificate(
    tls_node: TlsNode, brokers: Brokers, password_env: str, tmp_path: Path, spark: SparkSession
) -> None:
    vhost = fresh_tls_vhost(tls_node, brokers, "tls-move")
    config = load_config(write_tls_config(tmp_path / "job.yaml", tls_node, brokers, vhost))

    result = run_transfer(spark, config, run_id="tls-1")

    assert result.verification.verified
    assert (result.verification.messages, result.verification.lost) == (MESSAGES, 0)
    assert depth(tls_node.node, vhost, "orders") == 0
    assert depth(brokers.main, vhost, "orders") == MESSAGES


@pytest.mark.parametrize(
    "case",
    [
        # (config changes, the host the error names, what it says about the certificate)
        ({"ca": "other-ca.pem"}, "127.0.0.1", "self-signed certificate in certificate chain"),
        ({"host": "localhost"}, "localhost", "certificate is not valid for 'localhost'"),
    ],
    ids=["wrong-ca", "wrong-host-name"],
)
@pytest.mark.usefixtures("password_env", "spark")  # main() runs in the suite's session
def test_a_certificate_that_does_not_verify_is_refused_before_anything_moves(
    tls_node: TlsNode,
    brokers: Brokers,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    case: tuple[dict[str, str], str, str],
) -> None:
    block, host, reason = case
    vhost = fresh_tls_vhost(tls_node, brokers, f"tls-refused-{host}")
    path = write_tls_config(tmp_path / "job.yaml", tls_node, brokers, vhost, **block)

    code = main(["transfer", "--config", str(path), "--run-id", "tls-refused"])

    err = capsys.readouterr().err
    assert code == 2, err
    errors = [line for line in err.splitlines() if line.startswith("rmq-spark: error:")]
    assert len(errors) == 1, err
    assert "cluster dr" in err, err
    assert f"{host}:{tls_node.https_port}" in err, err
    assert reason in err, err
    assert depth(tls_node.node, vhost, "orders") == MESSAGES  # nothing moved
