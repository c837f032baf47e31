"""A large deterministic web site generated on demand, for crawls of 10^5 pages and more.

Nothing is built up front: page ``i`` (``0 <= i < pages``) and its links are a pure function
of ``(spec, i)``, rendered when asked for, so the site costs no memory and any process
rebuilds the same site (and its ground truth) from the spec and the ports.

Shape (host ``h`` is ``HOST:ports[h]``, ``HOST`` 127.0.0.1 unless ``--host`` /
``--advertise`` say otherwise, as for :mod:`examples.fetch_service.site`):

- page ``i`` lives on host ``i % hosts`` at ``/p/<i>.html`` (page 0, the seed, at ``/``);
- its links: its ``fanout`` children ``fanout*i+1 .. fanout*i+fanout`` (a tree: every page is
  reachable from the seed, within ``depth_bound()`` links), ``extra_links`` pseudo-random
  pages (mostly on other hosts), its parent, written in many equivalent spellings (absolute,
  upper-case scheme, scheme-relative, root-relative, ``../``, ``./``, ``/x/..``, fragments);
- every ``gone_every``-th page links to ``/gone/<i>.html`` (404: requested and stored, not
  followed);
- every ``private_every``-th page links to ``/private/<i>.html``, a 200 page that the
  site's ``/robots.txt`` disallows (``User-agent: *`` / ``Disallow: /private/``): a crawler
  that obeys robots.txt never requests it;
- links a crawler must drop (``mailto:``, ``javascript:``, an external host).

Served as a Starlette application by :mod:`framework.web` (one socket per host, no ``server``
header): :func:`serve_lazy_site`, or ``python -m examples.fetch_service.lazysite``.

Ground truth (:meth:`LazySite.expected_urls`): every page and every ``/gone/`` URL, plus the
``/private/`` pages when robots.txt is ignored (``max_depth >= depth_bound()``).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from examples.fetch_service.fetch import payload_digest
from examples.fetch_service.site import (
    HOST,
    add_address_options,
    manifest_host,
    serve_until_signal,
    site_endpoint,
    write_record_file,
)
from framework import records, web
from framework.errors import ConfigurationError
from framework.logs import get_logger

__all__ = ["Access", "LazyManifest", "LazySite", "LazySpec", "serve_lazy_site"]

log = get_logger("examples.fetch_service.lazysite")

ROBOTS = b"User-agent: *\nDisallow: /private/\n"
_DROPPED = ("mailto:webmaster@example.invalid", "javascript:void(0)",
            "http://external.invalid/elsewhere.html")


def _at_least(minimum: int) -> Any:
    def check(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigurationError(
                f"LazySpec.{attribute.name} must be an integer >= {minimum}, got {value!r}")

    return check


@attrs.frozen(kw_only=True)
class LazySpec:
    pages: int = attrs.field(default=10_000, validator=_at_least(2))
    hosts: int = attrs.field(default=32, validator=_at_least(1))
    seed: int = attrs.field(default=1, validator=_at_least(0))
    fanout: int = attrs.field(default=6, validator=_at_least(2))
    extra_links: int = attrs.field(default=3, validator=_at_least(0))
    gone_every: int = attrs.field(default=97, validator=_at_least(1))
    private_every: int = attrs.field(default=89, validator=_at_least(1))


@attrs.frozen
class LazyManifest:
    """The ``--manifest`` file: the spec and the ports rebuild the served site (hosts and
    seeds for a reader's convenience)."""

    lazy: LazySpec
    ports: tuple[int, ...]
    hosts: tuple[str, ...] = ()
    seeds: tuple[str, ...] = ()


@attrs.frozen
class Access:
    """One request as the server saw it, times in ``time.monotonic()`` seconds: ``started``
    when it was received, ``finished`` when the response was ready, just before it was sent
    (so the client ends its exchange after ``finished``)."""

    url: str
    started: float
    finished: float


class LazySite:
    """The site bound to ports (see the module doc).  Opens no socket itself.

    ``requests`` counts the requests per URL; with ``access_log=True`` every request is also
    kept as an :class:`Access` (tests check politeness with it; off for large crawls).
    """

    def __init__(self, spec: LazySpec, ports: Sequence[int], *,
                 access_log: bool = False, host: str = HOST) -> None:
        if len(ports) != spec.hosts:
            raise ConfigurationError(f"need {spec.hosts} ports, got {len(ports)}")
        self.spec = spec
        #: the address its URLs name (the advertised host; ports tell virtual hosts apart)
        self.host = host
        self.ports = tuple(ports)
        self._host_of_port = {port: index for index, port in enumerate(self.ports)}
        self.requests: Counter[str] = Counter()
        self.access_log: list[Access] | None = [] if access_log else None
        self._requested = trio.Event()

    async def wait_requests(self, count: int) -> None:
        """Return once the site has answered ``count`` requests in all."""
        while self.requests.total() < count:
            await self._requested.wait()

    # -- addressing and ground truth ------------------------------------------------------

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(f"{self.host}:{port}" for port in self.ports)

    @property
    def seeds(self) -> tuple[str, ...]:
        return (self.page_url(0),)

    def page_path(self, i: int) -> str:
        return "/" if i == 0 else f"/p/{i}.html"

    def page_url(self, i: int) -> str:
        return f"http://{self.host}:{self.ports[i % self.spec.hosts]}{self.page_path(i)}"

    def _side_url(self, kind: str, i: int) -> str:
        return f"http://{self.host}:{self.ports[i % self.spec.hosts]}/{kind}/{i}.html"

    def depth_bound(self) -> int:
        """Every page is at most this many links from the seed (the tree's height)."""
        depth, last = 0, 0
        while last < self.spec.pages - 1:
            last = last * self.spec.fanout + self.spec.fanout
            depth += 1
        return depth + 1

    def iter_expected(self, *, obey_robots: bool = True) -> Iterator[str]:
        spec = self.spec
        for i in range(spec.pages):
            yield self.page_url(i)
            if i % spec.gone_every == 0:
                yield self._side_url("gone", i)
            if not obey_robots and i % spec.private_every == 0:
                yield self._side_url("private", i)

    def expected_urls(self, *, obey_robots: bool = True) -> frozenset[str]:
        """Every URL a correct crawl requests (with ``max_depth >= depth_bound()``)."""
        return frozenset(self.iter_expected(obey_robots=obey_robots))

    def private_urls(self) -> frozenset[str]:
        return frozenset(self._side_url("private", i)
                         for i in range(0, self.spec.pages, self.spec.private_every))

    def links(self, i: int) -> list[int]:
        """The pages page ``i`` links to (children, pseudo-random extras, parent)."""
        spec = self.spec
        out = [c for c in range(spec.fanout * i + 1, spec.fanout * i + spec.fanout + 1)
               if c < spec.pages]
        for k in range(spec.extra_links):
            out.append(_mix(spec.seed, i, k) % spec.pages)
        if i > 0:
            out.append((i - 1) // spec.fanout)
        return out

    # -- manifest -------------------------------------------------------------------------

    def manifest(self) -> LazyManifest:
        return LazyManifest(self.spec, self.ports, self.hosts, self.seeds)

    def write_manifest(self, path: str | Path) -> None:
        write_record_file(path, self.manifest())

    @classmethod
    def from_manifest(cls, path: str | Path) -> LazySite:
        """The site another process serves, from its manifest;
        :class:`~framework.records.CorruptRecord` if the file is not one."""
        manifest = records.decode(Path(path).read_bytes(), LazyManifest)
        return cls(manifest.lazy, manifest.ports, host=manifest_host(manifest.hosts))

    # -- serving --------------------------------------------------------------------------

    def render(self, i: int) -> bytes:
        spec, host = self.spec, i % self.spec.hosts
        items = [self._href(i, host, j, n) for n, j in enumerate(self.links(i))]
        if i % spec.gone_every == 0:
            items.append(f"/gone/{i}.html")
        if i % spec.private_every == 0:
            items.append(f"/private/{i}.html#top")
        items.append(_DROPPED[i % len(_DROPPED)])
        body = "".join(f'<li><a href="{href}">link {n}</a></li>' for n, href in enumerate(items))
        return (f"<!DOCTYPE html><html><head><title>page {i}</title></head><body>"
                f"<h1>page {i}</h1><ul>{body}</ul></body></html>").encode()

    def _href(self, source: int, source_host: int, target: int, n: int) -> str:
        """One of several spellings of the link, all canonicalising to ``page_url(target)``."""
        absolute = self.page_url(target)
        path = self.page_path(target)
        style = _mix(self.spec.seed, source * 7 + n, 99) % 7
        fragment = "#s" if style % 2 else ""
        if target % self.spec.hosts != source_host or style == 0:
            if style in (1, 2):
                return "HTTP://" + absolute[len("http://"):] + fragment
            if style in (3, 4):
                return absolute[len("http:"):] + fragment
            return absolute + fragment
        if style in (1, 2):
            return path + fragment
        if style == 3 and target != 0:
            return f"../p/{target}.html" if source != 0 else f"p/{target}.html"
        if style == 4 and target != 0 and source != 0:
            return f"./{target}.html{fragment}"
        return f"/x/..{path}{fragment}"

    def digest_of(self, url: str) -> str | None:
        """The payload digest of what the site answers for ``url`` (as WARC records it);
        None for a URL that is not on the site's hosts."""
        prefix = f"http://{self.host}:"
        port_text, slash, path = url[len(prefix):].partition("/")
        if not url.startswith(prefix) or not slash or not port_text.isdigit():
            return None
        host = self._host_of_port.get(int(port_text))
        if host is None:
            return None
        return payload_digest(self.answer(host, "/" + path)[2])

    def answer(self, host: int, path: str) -> tuple[int, bytes, bytes]:
        """``(status, content type, body)`` for a request to ``host``'s ``path``."""
        html = b"text/html; charset=utf-8"
        if path == "/robots.txt":
            return 200, b"text/plain", ROBOTS
        page = 0 if path == "/" and host == 0 else _number(path, "/p/")
        if page is not None and 0 <= page < self.spec.pages and page % self.spec.hosts == host \
                and (page != 0 or path == "/"):
            return 200, html, self.render(page)
        private = _number(path, "/private/")
        if private is not None and private % self.spec.hosts == host:
            return 200, html, b"<html><body>private: robots.txt disallows this</body></html>"
        return 404, html, b"<html><body><h1>404 Not Found</h1></body></html>"

    def app(self) -> Starlette:
        """The site as a Starlette application (GET and HEAD of every path)."""
        return Starlette(routes=[Route("/{path:path}", self._respond)])

    async def _respond(self, request: Request) -> Response:
        started = time.monotonic()
        port = request.scope["server"][1]
        path = request.scope["path"]
        url = f"http://{self.host}:{port}{path}"
        status, kind, body = self.answer(self._host_of_port.get(port, -1), path)
        if self.access_log is not None:
            self.access_log.append(Access(url, started, time.monotonic()))
        self.requests[url] += 1
        self._requested.set()
        self._requested = trio.Event()
        return Response(body, status, headers={"content-type": kind.decode()})


def _mix(seed: int, a: int, b: int) -> int:
    digest = hashlib.blake2b(f"{seed}:{a}:{b}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def _number(path: str, prefix: str) -> int | None:
    if not (path.startswith(prefix) and path.endswith(".html")):
        return None
    text = path[len(prefix):-len(".html")]
    return int(text) if text.isdigit() else None


@asynccontextmanager
async def serve_lazy_site(spec: LazySpec, *, ports: Sequence[int] | None = None,
                          access_log: bool = False, host: str | None = None,
                          advertise: str | None = None) -> AsyncIterator[LazySite]:
    """Serve the site for the duration of the block (free ports unless ``ports``; ``host``
    and ``advertise`` as for :func:`~examples.fetch_service.site.serve_site`); an address
    that cannot be bound raises :class:`FrameworkError` (one line)."""
    endpoint = site_endpoint(host, advertise)
    listener = web.listen(endpoint.listen_host,
                          ports=ports if ports is not None else [0] * spec.hosts,
                          what="site", graceful_timeout=0.2, keep_alive_timeout=60.0,
                          server_header=False)
    site = LazySite(spec, listener.ports, access_log=access_log,
                    host=endpoint.advertise_host)
    async with trio.open_nursery() as nursery:
        await nursery.start(web.serve, site.app(), listener)
        log.info("lazysite.serving", pages=spec.pages, hosts=len(site.hosts))
        try:
            yield site
        finally:
            nursery.cancel_scope.cancel()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m examples.fetch_service.lazysite",
        description="Serve a large generated site until Ctrl-C (127.0.0.1 unless --host); "
                    "prints READY.")
    parser.add_argument("--pages", type=int, default=10_000)
    parser.add_argument("--hosts", type=int, default=32)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--manifest", type=Path, help="write spec/ports/seeds JSON here")
    add_address_options(parser)
    args = parser.parse_args(argv)
    try:
        spec = LazySpec(pages=args.pages, hosts=args.hosts, seed=args.seed)
    except ConfigurationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return serve_until_signal(lambda: serve_lazy_site(spec, host=args.host,
                                                      advertise=args.advertise), args.manifest)

if __name__ == "__main__":
    sys.exit(main())
