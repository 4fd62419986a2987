"""`redact_url`: the one way a URL (or a message quoting one) is shown to people.

URLs carry secrets: user-info (`https://user:pass@host/`) and query tokens
(presigned `X-Amz-Signature`/`X-Amz-Credential`, Azure `sig`, `token`,
`api_key`...). Error messages, logs and progress bars pass what they print
through `redact_url`, so a secret never reaches a terminal, a log file or a bug
report. Query parameters whose names do not look secret (`?v=2`) are kept: they
help tell objects apart.
"""

from __future__ import annotations

import logging
import re
from typing import Final

__all__ = ["RedactingFilter", "redact_url"]

# scheme://user:password@ -> scheme://***@. The authority runs to the LAST "@" before
# "/?#" (a password may hold "@", as requests and urllib read it); a "user:password@"
# whose password holds an unescaped "/" (raw AWS secret keys do) is redacted too, but
# not "host:port/path@x" (a port is digits before the path).
_USERINFO: Final = re.compile(
    r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?:[^/?#\s]*@|[^/?#@\s:]+:(?!\d*[/?#])[^@\s]*@)"
)
# ?name=value, &name=value, ;name=value or #name=value (OAuth puts tokens in the
# fragment) where the name looks like a credential
_SECRET_PARAM: Final = re.compile(
    r"(?P<name>[?&;#][^=&#\s]*?"
    r"(?:token|signature|sig|secret|pass|pw|key|credential|auth|session|hdnts|hmac)"
    r"[^=&#\s]*=)[^&#\s'\"<>)]*",
    re.IGNORECASE,
)


def redact_url(text: str) -> str:
    """`text` (a URL, or a message quoting URLs) with user-info and secret query values
    replaced by `***`."""
    text = _USERINFO.sub(r"\g<scheme>***@", text)
    return _SECRET_PARAM.sub(r"\g<name>***", text)


class RedactingFilter(logging.Filter):
    """Redacts each record's final message, whatever the arguments were."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = redact_url(message)
        if redacted != message:
            record.msg, record.args = redacted, ()
        return True
