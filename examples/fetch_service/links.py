"""URL canonicalisation (the key for de-duplication) and link extraction from HTML.

Two URLs that name the same resource under the rules of RFC 3986 section 6 get the same
canonical form, so the crawl fetches each page once:

- scheme and host are lower-cased, the default port (80 / 443) is dropped, a non-ASCII host
  is IDNA-encoded;
- the path gets its ``.`` / ``..`` segments removed, an empty path becomes ``/``;
- percent-escapes are upper-cased, escapes of unreserved characters (``A-Z a-z 0-9 - . _ ~``)
  are decoded, characters that must be escaped (spaces, non-ASCII...) are escaped;
- the fragment is dropped, an empty query (a bare ``?``) is dropped;
- the query keeps its parameter order (reordering can change what a server returns).

Only ``http`` and ``https`` URLs are kept.  :func:`canonicalize` raises
:class:`InvalidUrlError` (a ``ValueError``) with a message that says what is wrong;
:func:`extract_links` silently skips what cannot be crawled.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from urllib.parse import SplitResult, quote, urljoin, urlsplit, urlunsplit

from selectolax.lexbor import LexborHTMLParser

__all__ = ["InvalidUrlError", "canonicalize", "extract_links", "host_key", "try_canonicalize"]

_SCHEMES = {"http": 80, "https": 443}
_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_ESCAPE = re.compile(r"%([0-9A-Fa-f]{2})")
_LONE_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")
_PATH_SAFE = "/:@!$&'()*+,;=-._~%"
_QUERY_SAFE = _PATH_SAFE + "?"
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
    if base is not None:
        try:
            text = urljoin(base, text)
        except ValueError as exc:
            raise InvalidUrlError(f"cannot resolve {url!r} against {base!r}: {exc}") from None
    try:
        parts = urlsplit(text)
    except ValueError as exc:
        raise InvalidUrlError(f"invalid URL {url!r}: {exc}") from None
    scheme = parts.scheme.lower()
    if not scheme:
        raise InvalidUrlError(f"invalid URL {url!r}: not absolute (no scheme)")
    if scheme not in _SCHEMES:
        raise InvalidUrlError(f"invalid URL {url!r}: scheme {scheme!r} is not http or https")
    netloc = _canonical_netloc(url, scheme, parts)
    path = _remove_dot_segments(_normalize_escapes(parts.path, _PATH_SAFE)) or "/"
    if not path.startswith("/"):
        path = "/" + path
    query = _normalize_escapes(parts.query, _QUERY_SAFE)
    return urlunsplit((scheme, netloc, path, query, ""))


def try_canonicalize(url: str, base: str | None = None) -> str | None:
    """Like :func:`canonicalize` but None instead of an error."""
    try:
        return canonicalize(url, base)
    except InvalidUrlError:
        return None


def host_key(url: str) -> str:
    """``host[:port]`` of a canonical URL: the unit of politeness and of work batches."""
    return urlsplit(url).netloc.rpartition("@")[2]


def extract_links(html: str | bytes, base_url: str, *,
                  canonical: Callable[[str, str | None], str] | None = None) -> list[str]:
    """Canonical http(s) links of a page, first occurrence order, without duplicates.

    Relative links resolve against ``<base href>`` when the page has one, else ``base_url``.
    ``javascript:``, ``mailto:``, ``ftp:``... links and unparseable ones are skipped; a link
    to the page itself (after dropping the fragment) is kept, the caller de-duplicates.
    ``canonical(url, base)`` replaces :func:`canonicalize` (raising ``ValueError`` to skip).
    """
    canonical = canonical or canonicalize

    def attempt(value: str, base: str) -> str | None:
        try:
            return canonical(value, base)
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


def _canonical_netloc(url: str, scheme: str, parts: SplitResult) -> str:
    try:
        port = parts.port
    except ValueError as exc:
        raise InvalidUrlError(f"invalid URL {url!r}: {exc}") from None
    host = parts.hostname
    if not host:
        raise InvalidUrlError(f"invalid URL {url!r}: no host")
    host = host.rstrip(".").lower()
    if ":" in host:
        host = f"[{host}]"
    elif not host.isascii():
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError as exc:
            raise InvalidUrlError(f"invalid URL {url!r}: bad host name ({exc})") from None
    if any(ch in host for ch in ' <>"{}|\\^`') or not host.strip("[]."):
        raise InvalidUrlError(f"invalid URL {url!r}: bad host name {host!r}")
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = host if port is None or port == _SCHEMES[scheme] else f"{host}:{port}"
    return f"{userinfo}@{netloc}" if userinfo else netloc


def _normalize_escapes(text: str, safe: str) -> str:
    if not text:
        return ""
    text = _LONE_PERCENT.sub("%25", text)

    def fix(match: re.Match[str]) -> str:
        char = chr(int(match.group(1), 16))
        return char if char in _UNRESERVED else f"%{match.group(1).upper()}"

    return quote(_ESCAPE.sub(fix, text), safe=safe)


def _remove_dot_segments(path: str) -> str:
    """RFC 3986 section 5.2.4, on a path that is absolute or empty."""
    if "." not in path:
        return path
    output: list[str] = []
    segments = path.split("/")
    for index, segment in enumerate(segments):
        last = index == len(segments) - 1
        if segment == ".":
            if last:
                output.append("")
        elif segment == "..":
            if len(output) > 1:
                output.pop()
            if last:
                output.append("")
        else:
            output.append(segment)
    result = "/".join(output)
    if path.startswith("/") and not result.startswith("/"):
        result = "/" + result
    return result
