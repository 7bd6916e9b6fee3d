"""Helpers the tests share: the only place a test imports helpers from (no test_* here)."""
