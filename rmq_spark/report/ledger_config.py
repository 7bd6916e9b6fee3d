"""A job config's ledger, for commands that read the ledger and never connect (`report`)."""

from __future__ import annotations

import os

from rmq_spark.config import load_config


def ledger_path_of(config_file: str) -> str:
    """The config's ledger.path, its object-store options registered (`use_ledger`), the
    config validated as for a transfer but without its passwords: a variable named by a
    `password_env` that is not set gets an empty placeholder (a report never connects, so
    the placeholder is never used)."""
    import yaml

    from rmq_spark.ledger.store import use_ledger

    try:
        with open(config_file, encoding="utf-8") as text:
            parsed = yaml.safe_load(text)
        clusters = parsed.get("clusters") if isinstance(parsed, dict) else None
    except (OSError, yaml.YAMLError):
        clusters = None  # load_config names the problem
    names = [
        cluster["password_env"]
        for cluster in (clusters.values() if isinstance(clusters, dict) else [])
        if isinstance(cluster, dict) and isinstance(cluster.get("password_env"), str)
    ]
    environ = {**{name: "" for name in names}, **os.environ}
    return use_ledger(load_config(config_file, environ).ledger)
