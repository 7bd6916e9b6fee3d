"""Why a management HTTP call failed, said in a few words a user can act on.

Kept apart from the client (`management.py`): turning requests' exceptions and the
API's error bodies into short causes is a concept of its own, and never includes a
secret (the URL's credentials are never part of what is said).
"""

from __future__ import annotations

import re

import requests

CERTIFICATE_REFUSED = re.compile(r"certificate verify failed: ([^(\"]+)")


def json_reason(response: requests.Response) -> str:
    """The `reason` the management API gives in a JSON error body, or ''."""
    try:
        body = response.json()
    except ValueError:
        return ""
    return str(body.get("reason") or "") if isinstance(body, dict) else ""


def reason(exc: requests.RequestException) -> str:
    """A short cause: 'connection refused', 'timed out after 5s', ... (never a secret)."""
    if isinstance(exc, requests.ConnectTimeout):
        return "connect timed out"
    if isinstance(exc, requests.Timeout):
        return "no answer in time"
    if isinstance(exc, requests.exceptions.SSLError):
        refused = CERTIFICATE_REFUSED.search(repr(exc))
        if refused:
            said = refused.group(1).replace("\\'", "'").strip()  # repr escapes quotes
            return f"TLS: the server's certificate was not accepted: {said}"
        return "TLS handshake failed"
    text = repr(exc)
    for known, said in (
        ("Connection refused", "connection refused"),
        ("Name or service not known", "host name not resolved"),
        ("Temporary failure in name resolution", "host name not resolved"),
        ("No route to host", "no route to host"),
        (
            "Connection aborted",
            "the connection was cut without an HTTP answer; is it the management port?",
        ),
    ):
        if known in text:
            return said
    return type(exc).__name__
