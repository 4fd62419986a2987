"""What names one version of a remote object: its validators (ETag, Last-Modified and
the answer's Date), whether they can vouch for byte ranges, and the tag a partial
file of that version is named with."""

from __future__ import annotations

import hashlib
from email.utils import parsedate_to_datetime
from typing import Final, Optional, Union

import attrs

from framework.download.backend import ByteStream, RemoteInfo

__all__ = ["NO_VALIDATOR", "Validators"]

# The tag of a partial file whose bytes no validator names: it is never resumed.
NO_VALIDATOR: Final = "noetag"


def _etag_tag(etag: Optional[str]) -> str:
    if not etag:
        return NO_VALIDATOR
    return hashlib.sha256(etag.encode("utf-8")).hexdigest()[:12]


@attrs.frozen
class Validators:
    """What names one version of a remote object (HTTP ETag and Last-Modified), with
    the answer's Date, which says whether Last-Modified can vouch for byte ranges."""

    etag: Optional[str] = None
    last_modified: Optional[str] = None
    date: Optional[str] = None

    @classmethod
    def of(cls, source: Union[ByteStream, RemoteInfo]) -> Validators:
        return cls(source.etag, source.last_modified, source.date)

    @property
    def if_range(self) -> Optional[str]:
        """The value for `If-Range`, None when no validator can vouch for byte ranges.

        A strong ETag, else a strong Last-Modified (RFC 9110 8.8.2.2: one at least a
        second older than the answer's Date; an object rewritten within the second it
        was served keeps its date). A weak ETag cannot promise identical bytes."""
        if self.etag and not self.etag.startswith("W/"):
            return self.etag
        if self.last_modified and _strong_date(self.last_modified, self.date):
            return self.last_modified
        return None

    @property
    def version(self) -> Optional[str]:
        """What tells versions apart when asking whether an object changed: the ETag
        (weak ones included), else Last-Modified."""
        return self.etag or self.last_modified or None

    @property
    def tag(self) -> str:
        """A file-name-safe digest of `if_range`, and of a weak ETag beside a Last-Modified
        one: what a partial file is tagged with, and what a part's or a resumed answer's
        version is compared by. A weak ETag cannot vouch for ranges, but one that changed
        says the bytes did, whatever the date (a copy that kept the file's mtime)."""
        value = self.if_range
        if value is None:
            return NO_VALIDATOR
        if value == self.etag:
            return _etag_tag(value)
        named = value if self.etag is None else f"{value}\n{self.etag}"
        return "lm" + hashlib.sha256(named.encode("utf-8")).hexdigest()[:10]


def _strong_date(last_modified: str, date: Optional[str]) -> bool:
    """Whether `last_modified` is at least one second before the answer's `date`."""
    try:
        modified, sent = parsedate_to_datetime(last_modified), parsedate_to_datetime(date or "")
        return (sent - modified).total_seconds() >= 1
    except (TypeError, ValueError):  # a missing or unreadable date (or naive vs aware)
        return False
