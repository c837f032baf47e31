"""robots.txt rules per host, parsed by protego, cached in the partition's store.

The owner of a host's partition fetches ``/robots.txt`` once (through the same politeness
gate as pages, never stored in WARC) and keeps what it got in its store, so a new owner
after a failover does not fetch it again.  What an answer means (RFC 9309, section 2.3):

- 2xx: the rules apply (for our user agent, else ``*``);
- 3xx (not followed) or 4xx (no robots.txt): everything is allowed;
- 5xx or no answer at all (timeout, refused): everything is disallowed - the host is
  skipped for this crawl (its URLs are marked ``blocked``), the safe reading of the RFC's
  "complete disallow" for an unreachable robots.txt.
"""

from __future__ import annotations

import attrs
from protego import Protego

__all__ = ["RobotsRules", "robots_url"]


def robots_url(host: str, scheme: str = "http") -> str:
    return f"{scheme}://{host}/robots.txt"


@attrs.frozen
class RobotsRules:
    """What one host's robots.txt answer says; ``status`` 0 means no answer came."""

    status: int
    body: str = ""
    _parsed: Protego | None = attrs.field(default=None, eq=False, repr=False)

    @classmethod
    def from_answer(cls, status: int, body: str) -> RobotsRules:
        parsed = Protego.parse(body) if 200 <= status < 300 else None
        return cls(status, body, parsed)

    def allows(self, url: str, user_agent: str) -> bool:
        if self._parsed is not None:
            return bool(self._parsed.can_fetch(url, user_agent))
        return 300 <= self.status < 500  # a redirect we do not follow counts as no file

    def delay(self, user_agent: str) -> float | None:
        """The host's ``Crawl-delay`` for us, if it sets one."""
        if self._parsed is None:
            return None
        value = self._parsed.crawl_delay(user_agent)
        return float(value) if value is not None else None
