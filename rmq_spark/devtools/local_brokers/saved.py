"""The started nodes saved as `nodes.json` (what `stop` and the demo read back)."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rmq_spark.devtools.local_brokers.node import NODES_FILE_NAME, LocalBrokerError, LocalNode
from rmq_spark.devtools.rabbitmq_roots import HOST_VERSION


def node_to_dict(node: LocalNode) -> dict[str, Any]:
    """JSON-ready form of a node (includes the password: keep the file private)."""
    return {
        "node_name": node.node_name,
        "amqp_port": node.amqp_port,
        "management_port": node.management_port,
        "dist_port": node.dist_port,
        "base_dir": str(node.base_dir),
        "version": node.version,
        "root": None if node.root is None else str(node.root),
        "epmd_port": node.epmd_port,
        "username": node.username,
        "password": node.password,
        "amqp_uri": node.amqp_uri,
        "management_url": node.management_url,
    }


def save_nodes(nodes: Sequence[LocalNode], base_dir: Path) -> Path:
    """Write ``base_dir/nodes.json`` (label -> node details) atomically with mode 0600."""
    base_dir.mkdir(parents=True, exist_ok=True)
    target = base_dir / NODES_FILE_NAME
    tmp = base_dir / f".{NODES_FILE_NAME}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump({n.label: node_to_dict(n) for n in nodes}, fh, indent=2)
            fh.write("\n")
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return target


def load_nodes(base_dir: Path) -> list[LocalNode]:
    """Read the nodes listed in ``base_dir/nodes.json`` (written by ``main start``)."""
    path = Path(base_dir) / NODES_FILE_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as exc:
        raise LocalBrokerError(f"cannot read {path}: {exc}") from exc
    try:
        return [
            LocalNode(
                label=label,
                node_name=str(d["node_name"]),
                amqp_port=int(d["amqp_port"]),
                management_port=int(d["management_port"]),
                dist_port=int(d["dist_port"]),
                base_dir=Path(d["base_dir"]),
                username=str(d["username"]),
                password=str(d["password"]),
                version=str(d.get("version", HOST_VERSION)),
                root=None if d.get("root") is None else Path(d["root"]),
                epmd_port=None if d.get("epmd_port") is None else int(d["epmd_port"]),
            )
            for label, d in data.items()
        ]
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise LocalBrokerError(f"{path} is malformed: {exc!r}") from exc
