"""bench/ledger_store.py: the store's requests counted from its server's log."""

from __future__ import annotations

from pathlib import Path

from bench.ledger_store import StoreUsage, count_requests

# Lines as moto's server writes them: some responses' method and path in ANSI colours,
# a start-up banner and a warning between them.
LOG = (
    "\x1b[31m\x1b[1mWARNING: This is a development server.\x1b[0m\n"
    " * Running on http://127.0.0.1:49295\n"
    '127.0.0.1 - - [28/Nov/2026 19:01:36] "POST / HTTP/1.1" 200 -\n'
    '127.0.0.1 - - [28/Nov/2026 19:02:02] "\x1b[35m\x1b[1mDELETE /b/led/x.parquet '
    'HTTP/1.1\x1b[0m" 204 -\n'
    '127.0.0.1 - - [28/Nov/2026 19:02:02] "PUT /b/led/intents/run_id=r/ HTTP/1.1" 200 -\n'
    "Traceback (most recent call last):\n"
    '127.0.0.1 - - [28/Nov/2026 19:02:03] "\x1b[33mGET /b/led/missing HTTP/1.1\x1b[0m" 404 -\n'
)


def test_every_request_line_counts_and_nothing_else(tmp_path: Path) -> None:
    log = tmp_path / "s3-server.log"
    log.write_text(LOG, encoding="utf-8")
    assert count_requests(log) == 4


def test_usage_since_is_the_difference() -> None:
    used = StoreUsage(1_500, 12.345).since(StoreUsage(500, 2.0))
    assert used == StoreUsage(1_000, 10.35)
