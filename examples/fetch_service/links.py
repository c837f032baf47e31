"""URL canonicalisation (the key for de-duplication) and link extraction from HTML.

:func:`canonicalize` is the crawl's one canonical form: w3lib's ``canonicalize_url`` (scheme
and host lower-cased, ``.``/``..`` segments removed, escapes normalised, a non-ASCII host
IDNA-encoded, the fragment dropped, query arguments sorted) plus two rules w3lib leaves out:
the default port (80/443) is dropped, and only absolute ``http``/``https`` URLs with a host
are accepted; anything else raises :class:`InvalidUrlError` (a ``ValueError``) with the
reason.  :func:`extract_links` silently skips what cannot be crawled.
"""

from __future__ import annotations

from urllib.parse import urljoin, urlsplit, urlunsplit

from selectolax.lexbor import LexborHTMLParser
from w3lib.url import canonicalize_url

__all__ = ["InvalidUrlError", "canonicalize", "extract_links", "host_key"]

_DEFAULT_PORTS = {"http": 80, "https": 443}
# Elements whose attribute names a page the crawler may follow.
_LINK_ATTRS = (("a", "href"), ("area", "href"), ("frame", "src"), ("iframe", "src"))


class InvalidUrlError(ValueError):
    """A URL that cannot be crawled: not absolute, not http(s), no host, bad port..."""


def canonicalize(url: str, base: str | None = None) -> str:
    """The canonical absolute form of ``url`` (resolved against ``base`` when given).

    Raises :class:`InvalidUrlError` with a readable reason when the result is not a
    crawlable http(s) URL.
    """
    if not isinstance(url, str):
        raise InvalidUrlError(f"URL must be a string, got {type(url).__name__}")
    text = url.strip()
    try:
        if base is not None:
            text = urljoin(base, text)
        parts = urlsplit(text)
        scheme = parts.scheme.lower()
        if scheme not in _DEFAULT_PORTS:
            why = ("not absolute (no scheme)" if not scheme
                   else f"scheme {scheme!r} is not http or https")
            raise InvalidUrlError(f"invalid URL {url!r}: {why}")
        if not parts.hostname:
            raise InvalidUrlError(f"invalid URL {url!r}: no host")
        port = parts.port
        result = urlsplit(canonicalize_url(text))
    except ValueError as exc:
        if isinstance(exc, InvalidUrlError):
            raise
        raise InvalidUrlError(f"invalid URL {url!r}: {exc}") from None
    host = (result.hostname or "").rstrip(".")
    if ":" in host:
        host = f"[{host}]"
    netloc = host if port in (None, _DEFAULT_PORTS[scheme]) else f"{host}:{port}"
    return urlunsplit((scheme, netloc, result.path or "/", result.query, ""))


def host_key(url: str) -> str:
    """``host[:port]`` of a canonical URL: the unit of politeness and of partitioning."""
    return urlsplit(url).netloc.rpartition("@")[2]


def extract_links(html: str | bytes, base_url: str) -> list[str]:
    """Canonical http(s) links of a page, first occurrence order, without duplicates.

    Relative links resolve against ``<base href>`` when the page has one, else ``base_url``.
    ``javascript:``, ``mailto:``, ``ftp:``... links and unparseable ones are skipped; a link
    to the page itself (after dropping the fragment) is kept, the caller de-duplicates.
    """

    def attempt(value: str, base: str) -> str | None:
        try:
            return canonicalize(value, base)
        except ValueError:
            return None

    if isinstance(html, bytes):
        html = html.decode("utf-8", errors="replace")
    tree = LexborHTMLParser(html)
    base = base_url
    base_node = tree.css_first("base[href]")
    if base_node is not None:
        href = (base_node.attributes.get("href") or "").strip()
        resolved = attempt(href, base_url) if href else None
        if resolved is not None:
            base = resolved
    seen: set[str] = set()
    links: list[str] = []
    selector = ", ".join(f"{tag}[{attr}]" for tag, attr in _LINK_ATTRS)
    attr_of = dict(_LINK_ATTRS)
    for node in tree.css(selector):
        value = node.attributes.get(attr_of.get(node.tag, "href"))
        if not value:
            continue
        link = attempt(value, base)
        if link is not None and link not in seen:
            seen.add(link)
            links.append(link)
    return links
