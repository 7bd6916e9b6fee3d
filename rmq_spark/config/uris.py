"""URIs in the config: telling one from a path, and masking the password in one."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

# A scheme of two letters or more: `C:\\ledger` (one letter) stays a path.
URI_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):")


def mask_uri(uri: str) -> str:
    """The URI with any password replaced by ***, for logs and errors."""
    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()
