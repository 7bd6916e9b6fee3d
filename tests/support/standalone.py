"""A Spark standalone cluster's ports and workers, for the tests that start one."""

from __future__ import annotations

import socket

import requests


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def alive_workers(ui_port: int) -> int:
    try:
        state = requests.get(f"http://127.0.0.1:{ui_port}/json/", timeout=5).json()
    except (requests.RequestException, ValueError):
        return 0
    return sum(1 for worker in state.get("workers", []) if worker.get("state") == "ALIVE")
