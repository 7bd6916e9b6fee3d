"""The CLI's logging: text or JSON lines on stderr, quiet libraries, passwords masked.

Set up once per command by `cli` (`setup_logging`, then `mask_secrets_in_logs` once the
config is loaded); library code only logs through `logging.getLogger(__name__)`.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Sequence
from datetime import UTC, datetime

from rmq_spark.config import JobConfig

_QUIET_LOGGERS = ("pika", "py4j", "great_expectations", "urllib3")


class SecretMaskingFilter(logging.Filter):
    """Defence in depth: replaces any configured password that reaches a log line."""

    def __init__(self, secrets_to_mask: Sequence[str]) -> None:
        super().__init__()
        self._secrets = [s for s in secrets_to_mask if s]

    def filter(self, record: logging.LogRecord) -> bool:
        if self._secrets:
            message = record.getMessage()
            if any(secret in message for secret in self._secrets):
                for secret in self._secrets:
                    message = message.replace(secret, "***")
                record.msg, record.args = message, None
        return True


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line, for log collectors: time (UTC), level, logger, message,
    and the traceback as `exception` when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def setup_logging(level: str = "INFO", log_format: str = "text") -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if log_format == "json":
        for handler in logging.getLogger().handlers:
            handler.setFormatter(JsonLogFormatter())
    for name in _QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    if logging.getLogger().level > logging.DEBUG:
        # The driver turns every pika failure into one rmq-spark error; pika's own
        # ERROR lines and tracebacks would bury it.
        logging.getLogger("pika").setLevel(logging.CRITICAL)


_masked_secrets: list[str] = []


def mask_secrets_in_logs(config: JobConfig) -> None:
    secrets_to_mask = [cluster.password.get_secret_value() for cluster in config.clusters.values()]
    # An object-store ledger's keys (ledger.storage_options' *_env variables).
    secrets_to_mask += [s.get_secret_value() for s in config.ledger.storage_secrets.values()]
    _masked_secrets.extend(secret for secret in secrets_to_mask if secret)
    masking = SecretMaskingFilter(secrets_to_mask)
    for handler in logging.getLogger().handlers:
        handler.addFilter(masking)


def mask_known_secrets(text: str) -> str:
    """`text` with every password `mask_secrets_in_logs` has seen replaced by ***."""
    for secret in _masked_secrets:
        text = text.replace(secret, "***")
    return text
