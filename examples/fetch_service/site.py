"""A deterministic local web site to crawl, with its ground truth.

It is served on 127.0.0.1 unless told otherwise: ``--host`` / ``$FETCH_SITE_HOST`` (where
to listen) and ``--advertise`` / ``$FETCH_SITE_ADVERTISE`` (the host its URLs name, for
crawlers on other machines) follow :mod:`framework.addresses` (default: the address of the
interface that routes to ``$FRAMEWORK_ZK_HOSTS``, loopback when that is on loopback or
unset); an address it cannot bind is one line on stderr and exit status 2.

The machine has no internet, so the crawl runs against this.  :class:`SiteSpec` (page count,
host count, random seed, ...) fully determines the link graph; the ports only change the
URLs.  So a process that did not serve the site (the demo's summary) rebuilds the same
:class:`Site` from the spec and ports (see :meth:`Site.from_manifest`) and asks it
:meth:`Site.reachable_urls`.

What the site contains (each host is one ``HOST:PORT``, "virtual hosts" by port):

- ``pages`` HTML pages: the home page ``/`` of each host and ``/sN/pID.html`` pages, forming
  a random tree plus random extra links, many of them to other hosts.  Links are written in
  many equivalent forms (relative, ``../``, ``./``, root-relative, absolute, upper-case
  scheme, ``#fragments``, repeated links) that canonicalise to the same URL.
- The seeds are the home pages of the first ``seed_hosts`` hosts; the other hosts are
  reachable only through cross-host links.
- Slow pages (``slow_fraction`` of them) answer after ``slow_delay_s``.
- Broken links: ``/sN/gone-K.html`` answers 404, ``/sN/broken-K.html`` answers 500; their
  bodies contain a link to a ``/trap/...`` page that exists but must NOT be crawled (links of
  error pages are not followed).
- Redirects that resolve: ``/r/K`` (301/302/307/308, one of them through a second hop
  ``/r/K-b``) to a page that no other page links to, sometimes on another host.
- One redirect loop: ``/loop/a.html`` -> ``/loop/b.html`` (another host) -> ``/loop/a.html``.
- A chain ``/deep/1.html`` -> ... -> ``/deep/N.html`` from the first seed, so pages lie
  beyond any small depth limit.
- Links a crawler must drop: ``mailto:``, ``javascript:``, ``ftp://`` and an external host.
- A test hook, not linked from anywhere: ``/_rendezvous/NAME/PARTIES`` answers only once
  PARTIES requests for NAME are waiting (on any hosts), which shows requests overlapped.

Ground truth (:meth:`Site.reachable_urls`): breadth-first from the seeds over the links of
2xx pages; every URL a redirect chain visits (including the loop's two URLs) is at the depth
of the link that led to the chain; a page at depth ``max_depth`` is fetched but its links are
not followed.  Those are exactly the URLs a correct crawler requests, each once, so each
should be stored once.  It assumes ``max_redirects >= 2`` and ``allowed_hosts`` = the site's
hosts.

The site is a Starlette application served by :mod:`framework.web` (hypercorn on trio, one
socket per host, no ``server`` header); the access log (:attr:`Site.access_log`) records
each request's start and end on the server's clock, for politeness checks.

Run it by hand: ``python -m examples.fetch_service.site --pages 300 --hosts 4``.
"""

from __future__ import annotations

import argparse
import itertools
import os
import posixpath
import random
import signal
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from html import escape
from pathlib import Path
from typing import Any

import attrs
import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from framework import Endpoint, choose_endpoint, records, web
from framework.errors import ConfigurationError, FrameworkError
from framework.logs import get_logger

__all__ = [
    "AccessRecord",
    "Resource",
    "Site",
    "SiteManifest",
    "SiteSpec",
    "serve_site",
    "write_record_file",
]

log = get_logger("examples.fetch_service.site")

HOST = "127.0.0.1"
#: The environment variables of ``--host`` and ``--advertise``.
HOST_ENV = "FETCH_SITE_HOST"
ADVERTISE_ENV = "FETCH_SITE_ADVERTISE"
EXTERNAL_LINKS = (
    "mailto:webmaster@example.invalid",
    "javascript:void(0)",
    "ftp://127.0.0.1/pub/file.txt",
    "http://external.invalid/elsewhere.html",
)
#: Every method reaches the site's own answer (405 with ``allow: GET, HEAD``, logged).
METHODS = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]


def _check(rule: str, ok: Any) -> Any:
    def validator(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
        if isinstance(value, bool) or not ok(value):
            raise ConfigurationError(f"SiteSpec.{attribute.name} must be {rule}, got {value!r}")

    return validator


def _fraction(value: Any) -> bool:
    return isinstance(value, int | float) and 0 <= value <= 1


def _int_at_least(minimum: int) -> Any:
    return lambda v: isinstance(v, int) and v >= minimum


@attrs.frozen(kw_only=True)
class SiteSpec:
    """What to generate; the same spec always gives the same site (up to the ports)."""

    pages: int = attrs.field(default=300, validator=_check("an integer >= 20", _int_at_least(20)))
    hosts: int = attrs.field(default=4, validator=_check("an integer >= 2", _int_at_least(2)))
    seed: int = attrs.field(default=1, validator=_check("an integer", _int_at_least(-(2**63))))
    seed_hosts: int = attrs.field(default=2, validator=_check("an integer >= 1", _int_at_least(1)))
    links_per_page: int = attrs.field(
        default=3, validator=_check("an integer >= 0", _int_at_least(0))
    )
    slow_fraction: float = attrs.field(
        default=0.05,
        validator=_check("a number in [0, 1]", _fraction),
    )
    slow_delay_s: float = attrs.field(
        default=0.3,
        validator=_check("a number >= 0", lambda v: isinstance(v, int | float) and v >= 0),
    )
    deep_chain: int = attrs.field(default=10, validator=_check("an integer >= 0", _int_at_least(0)))

    def __attrs_post_init__(self) -> None:
        if self.seed_hosts > self.hosts:
            raise ConfigurationError(
                f"SiteSpec.seed_hosts ({self.seed_hosts}) must be <= hosts ({self.hosts})"
            )
        if self.deep_chain > self.pages // 2:
            raise ConfigurationError(
                f"SiteSpec.deep_chain ({self.deep_chain}) must be <= pages/2 ({self.pages // 2})"
            )


@attrs.frozen
class SiteManifest:
    """The ``--manifest`` file: what another process needs to rebuild the served site (the
    spec and the ports; hosts and seeds for a reader's convenience)."""

    spec: SiteSpec
    ports: tuple[int, ...]
    hosts: tuple[str, ...] = ()
    seeds: tuple[str, ...] = ()


def write_record_file(path: str | Path, record: object) -> None:
    """Write ``record`` (through :mod:`framework.records`) as the file ``path``, whole or
    not at all (written beside it, then renamed)."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_bytes(records.encode(record) + b"\n")
    os.replace(tmp, target)


@attrs.frozen
class Target:
    """Where a link points inside the site: host index and path."""

    host: int
    path: str


@attrs.frozen
class Resource:
    """What the server answers for one (host, path).

    ``kind`` is ``page`` (200 HTML with ``links``), ``redirect`` (``status`` + ``location``),
    ``error`` (404/500 with a body whose ``links`` must not be followed) or ``trap`` (a 200
    page only linked from error bodies).
    """

    kind: str
    status: int = 200
    links: tuple[Target | str, ...] = ()
    location: Target | None = None
    slow: bool = False
    title: str = ""


@attrs.frozen
class AccessRecord:
    """One request as the server saw it, times in ``time.monotonic()`` seconds.

    ``started``: the request was received; ``finished``: the response was ready, just before
    it was sent (so a client finishes its exchange after ``finished``).
    """

    host: int
    port: int
    path: str
    status: int
    started: float
    finished: float
    user_agent: str


class Site:
    """The generated site bound to concrete ports: resources, rendered bodies, ground truth.

    Building a ``Site`` opens no socket; :func:`serve_site` serves one.
    """

    def __init__(self, spec: SiteSpec, ports: Sequence[int], host: str = HOST) -> None:
        if len(ports) != spec.hosts:
            raise ConfigurationError(f"need {spec.hosts} ports, got {len(ports)}")
        self.spec = spec
        #: the address its URLs name (the advertised host; the ports tell virtual hosts apart)
        self.host = host
        self.ports: tuple[int, ...] = tuple(ports)
        self.resources: dict[Target, Resource] = _generate(spec)
        self.seeds: tuple[str, ...] = tuple(
            self.url(Target(host, "/")) for host in range(spec.seed_hosts)
        )
        self.access_log: list[AccessRecord] = []
        self._bodies: dict[Target, bytes] = {}
        self._rendezvous: dict[str, tuple[int, trio.Event]] = {}

    # -- addressing ----------------------------------------------------------------------

    @property
    def hosts(self) -> tuple[str, ...]:
        """``HOST:PORT`` of each host (what ``CrawlConfig.allowed_hosts`` should be)."""
        return tuple(f"{self.host}:{port}" for port in self.ports)

    @property
    def roots(self) -> tuple[str, ...]:
        return tuple(f"http://{host}/" for host in self.hosts)

    def url(self, target: Target) -> str:
        return f"http://{self.host}:{self.ports[target.host]}{target.path}"

    def target_of(self, url: str) -> Target | None:
        """The (host, path) of a canonical site URL, None for other URLs."""
        prefix = f"http://{self.host}:"
        if not url.startswith(prefix):
            return None
        port_text, slash, path = url[len(prefix) :].partition("/")
        if not slash or not port_text.isdigit() or int(port_text) not in self.ports:
            return None
        return Target(self.ports.index(int(port_text)), "/" + path)

    # -- ground truth --------------------------------------------------------------------

    def reachable_urls(self, max_depth: int) -> frozenset[str]:
        """Every URL a correct crawler requests from the seeds within ``max_depth``."""
        return frozenset(self.reachable_depths(max_depth))

    def reachable_depths(self, max_depth: int) -> dict[str, int]:
        """:meth:`reachable_urls` with the depth at which each URL is reached."""
        if max_depth < 0:
            raise ConfigurationError(f"max_depth must be >= 0, got {max_depth}")
        depth: dict[Target, int] = {}
        queue: deque[Target] = deque()
        for host in range(self.spec.seed_hosts):
            seed = Target(host, "/")
            depth[seed] = 0
            queue.append(seed)
        while queue:
            node = queue.popleft()
            level = depth[node]
            final = self._follow(node, level, depth)
            resource = self.resources.get(final) if final is not None else None
            if resource is None or resource.kind != "page" or level >= max_depth:
                continue
            for link in resource.links:
                if isinstance(link, Target) and link not in depth:
                    depth[link] = level + 1
                    queue.append(link)
        return {self.url(target): level for target, level in depth.items()}

    def _follow(self, node: Target, level: int, depth: dict[Target, int]) -> Target | None:
        """Walk a redirect chain from ``node``, giving each hop ``level``; the final target."""
        current = node
        chain = {node}
        while True:
            resource = self.resources.get(current)
            if resource is None or resource.kind != "redirect":
                return current
            assert resource.location is not None
            nxt = resource.location
            if nxt in chain:
                return None  # loop: every URL in it was requested once
            chain.add(nxt)
            depth.setdefault(nxt, level)
            current = nxt

    def expected_status(self, url: str) -> int:
        """The status the server answers for ``url`` (404 for anything unknown)."""
        target = self.target_of(url)
        resource = self.resources.get(target) if target is not None else None
        return resource.status if resource is not None else 404

    def links_of(self, url: str) -> tuple[str, ...]:
        """The canonical in-site links of a page (what a fetcher should report)."""
        target = self.target_of(url)
        resource = self.resources.get(target) if target is not None else None
        if resource is None or resource.kind != "page":
            return ()
        seen: dict[str, None] = {}
        for link in resource.links:
            if isinstance(link, Target):
                seen.setdefault(self.url(link))
        return tuple(seen)

    # -- manifest (for other processes) ----------------------------------------------------

    def manifest(self) -> SiteManifest:
        return SiteManifest(self.spec, self.ports, self.hosts, self.seeds)

    def write_manifest(self, path: str | Path) -> None:
        write_record_file(path, self.manifest())

    @classmethod
    def from_manifest(cls, source: str | Path | SiteManifest) -> Site:
        """Rebuild the site another process served (to compute ground truth) from its
        manifest or manifest file; :class:`~framework.records.CorruptRecord` if the file is
        not a manifest, ``OSError`` if it cannot be read."""
        manifest = source if isinstance(source, SiteManifest) else records.decode(
            Path(source).read_bytes(), SiteManifest)
        return cls(manifest.spec, manifest.ports, manifest_host(manifest.hosts))

    # -- serving ---------------------------------------------------------------------------

    def body(self, target: Target) -> bytes:
        body = self._bodies.get(target)
        if body is None:
            body = self._bodies[target] = self._render(target)
        return body

    def _render(self, target: Target) -> bytes:
        resource = self.resources[target]
        rng = random.Random(f"{self.spec.seed}:{target.host}:{target.path}")
        items = []
        for link in resource.links:
            href = link if isinstance(link, str) else self._href(target, link, rng)
            items.append(f'<li><a href="{escape(href)}">{escape(_label(link))}</a></li>')
        title = escape(resource.title or target.path)
        return (
            '<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
            f'<title>{title}</title></head>\n<body><h1 id="top">{title}</h1>\n'
            f"<p>host {target.host}, served by the fetch-service demo site.</p>\n"
            f"<ul>\n{chr(10).join(items)}\n</ul>\n</body></html>\n"
        ).encode()

    def _href(self, source: Target, target: Target, rng: random.Random) -> str:
        """One of many spellings of the link, all canonicalising to ``self.url(target)``."""
        absolute = self.url(target)
        fragment = rng.choice(["", "", "#top", "#section-2"])
        if target.host != source.host:
            style = rng.randrange(3)
            if style == 0:
                return absolute + fragment
            if style == 1:
                return "HTTP://" + absolute[len("http://") :] + fragment
            return f"//{self.host}:{self.ports[target.host]}{target.path}{fragment}"
        source_dir = posixpath.dirname(source.path)
        style = rng.randrange(5)
        if style == 0:
            return absolute + fragment
        if style == 1:
            return target.path + fragment
        relative = posixpath.relpath(target.path, source_dir)
        if target.path.endswith("/") and not relative.endswith("/"):
            relative += "/"
        if style == 2:
            return relative + fragment
        if style == 3 and not relative.startswith("."):
            return "./" + relative + fragment
        return f"/x/..{target.path}{fragment}"

    def app(self) -> Starlette:
        """The site as a Starlette application (one route: every path, every method)."""
        return Starlette(routes=[Route("/{path:path}", self._respond, methods=METHODS)])

    async def _respond(self, request: Request) -> Response:
        started = time.monotonic()
        port = request.scope["server"][1]
        host = self.ports.index(port) if port in self.ports else -1
        path = request.scope["path"]
        status, headers, body, delay = await self._answer(host, path, request.scope)
        if delay:
            await trio.sleep(delay)  # the simulated slowness of a page, not synchronisation
        # Logged before the response is sent: when a client has the response, its record is
        # in the log and ``finished`` is earlier than the client's end of the exchange.
        self.access_log.append(AccessRecord(host, port, path, status, started,
                                            time.monotonic(),
                                            request.headers.get("user-agent", "")))
        return Response(body, status, headers={k.decode(): v.decode() for k, v in headers})

    async def _answer(
        self, host: int, path: str, scope: dict[str, Any]
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes, float]:
        html = [(b"content-type", b"text/html; charset=utf-8")]
        if scope.get("method") not in ("GET", "HEAD"):
            return 405, [(b"allow", b"GET, HEAD")], b"", 0.0
        if path.startswith("/_rendezvous/"):
            return await self._rendezvous_answer(path)
        target = Target(host, path)
        resource = self.resources.get(target) if not scope.get("query_string") else None
        if resource is None:
            return 404, html, b"<html><body><h1>404 Not Found</h1></body></html>\n", 0.0
        if resource.kind == "redirect":
            assert resource.location is not None
            location = self.url(resource.location)
            if resource.location.host == host and path.startswith("/r/"):
                location = resource.location.path  # a relative Location, resolved by the client
            return resource.status, [(b"location", location.encode())], b"", 0.0
        delay = self.spec.slow_delay_s if resource.slow else 0.0
        return resource.status, html, self.body(target), delay

    async def _rendezvous_answer(
        self, path: str
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes, float]:
        parts = path.split("/")
        if len(parts) != 4 or not parts[3].isdigit() or int(parts[3]) < 1:
            return 404, [], b"", 0.0
        name, parties = parts[2], int(parts[3])
        count, event = self._rendezvous.get(name, (0, trio.Event()))
        count += 1
        self._rendezvous[name] = (count, event)
        if count >= parties:
            event.set()
        await event.wait()
        return 200, [(b"content-type", b"text/plain")], f"met {parties}\n".encode(), 0.0


def _label(link: Target | str) -> str:
    return link if isinstance(link, str) else f"{link.host}{link.path}"


@attrs.define
class _Graph:
    """The site while :func:`_generate` builds it: its pages, their outgoing links so far and
    the resources decided so far.  Every step draws from the one seeded ``rng``, so the steps'
    order is part of the site (changing it changes every site)."""

    spec: SiteSpec
    rng: random.Random
    homes: list[Target]
    deep: list[Target]
    normal: list[Target]
    #: indexes into ``normal`` of the pages only a redirect leads to
    redirect_only: set[int]
    links: dict[Target, list[Target | str]] = attrs.field(factory=dict)
    resources: dict[Target, Resource] = attrs.field(factory=dict)

    @property
    def sources(self) -> list[Target]:
        """The pages that may carry extra links: the homes and the normal pages."""
        return self.homes + self.normal

    @property
    def linkable(self) -> list[Target]:
        """What extra links may point to: never a redirect-only page or the deep chain."""
        return self.homes + [t for i, t in enumerate(self.normal) if i not in self.redirect_only]


def _generate(spec: SiteSpec) -> dict[Target, Resource]:
    """The link graph: deterministic in ``spec`` (the module doc says what it contains)."""
    graph = _pages(spec)
    _grow_tree(graph)
    _add_random_links(graph)
    _add_deep_chain(graph)
    _add_broken_links(graph)
    _add_redirect_loop(graph)
    for external in EXTERNAL_LINKS:  # links a crawler must drop
        graph.links[graph.rng.choice(graph.sources)].append(external)
    _finish_pages(graph)
    return graph.resources


def _pages(spec: SiteSpec) -> _Graph:
    """The pages (homes, the deep chain, normal pages) and which normal pages only a
    redirect leads to; no links yet."""
    rng = random.Random(spec.seed)
    homes = [Target(h, "/") for h in range(spec.hosts)]
    deep = [Target(k % spec.hosts, f"/deep/{k}.html") for k in range(1, spec.deep_chain + 1)]
    normal_count = spec.pages - spec.hosts - spec.deep_chain
    normal = [
        Target(rng.randrange(spec.hosts), f"/s{rng.randrange(4)}/p{i}.html")
        for i in range(normal_count)
    ]
    redirect_count = max(2, spec.pages // 40)
    redirect_only = set(rng.sample(range(normal_count), min(redirect_count, normal_count // 4)))
    graph = _Graph(spec, rng, homes, deep, normal, redirect_only)
    for page in homes + deep + normal:
        graph.links[page] = []
    return graph


def _grow_tree(graph: _Graph) -> None:
    """A random recursive tree from the seed hosts' homes over the other homes and the normal
    pages keeps every page reachable; a redirect-only page hangs off the tree through a
    redirect ``/r/K``."""
    rng = graph.rng
    tree_nodes: list[Target] = graph.homes[: graph.spec.seed_hosts]
    for home in graph.homes[graph.spec.seed_hosts :]:
        graph.links[rng.choice(tree_nodes)].append(home)
        tree_nodes.append(home)
    redirects = 0
    for index, page in enumerate(graph.normal):
        parent = rng.choice(tree_nodes)
        if index in graph.redirect_only:
            graph.links[parent].append(_redirect(graph, redirects, page))
            redirects += 1
        else:
            graph.links[parent].append(page)
        tree_nodes.append(page)


def _redirect(graph: _Graph, number: int, page: Target) -> Target:
    """Redirect ``/r/NUMBER`` to ``page`` (the first one through a second hop); returns
    where a link to it points."""
    source = Target(graph.rng.randrange(graph.spec.hosts), f"/r/{number}")
    status = (301, 302, 307, 308)[number % 4]
    if number == 0:  # one chain with two hops
        middle = Target(source.host, f"/r/{number}-b")
        graph.resources[source] = Resource("redirect", status, location=middle)
        graph.resources[middle] = Resource("redirect", 302, location=page)
    else:
        graph.resources[source] = Resource("redirect", status, location=page)
    return source


def _add_random_links(graph: _Graph) -> None:
    """Extra random links (many cross-host), never to redirect-only or deep pages."""
    linkable = graph.linkable
    for page in graph.sources:
        for _ in range(graph.spec.links_per_page):
            graph.links[page].append(graph.rng.choice(linkable))


def _add_deep_chain(graph: _Graph) -> None:
    """The deep chain hangs off the first seed; each of its pages links back home."""
    home = graph.homes[0]
    for parent, child in itertools.pairwise([home, *graph.deep]):
        graph.links[parent].append(child)
        graph.links[child].append(home)


def _add_broken_links(graph: _Graph) -> None:
    """Links to pages that answer 404 or 500, each error body linking to a trap."""
    spec, rng = graph.spec, graph.rng
    for kind, status, title, count in (("gone", 404, "404 Not Found", spec.pages // 30),
                                       ("broken", 500, "500 Internal Error", spec.pages // 50)):
        for k in range(max(1, count)):
            error = Target(rng.randrange(spec.hosts), f"/s{rng.randrange(4)}/{kind}-{k}.html")
            graph.links[rng.choice(graph.sources)].append(error)
            trap = Target(error.host, f"/trap/{kind}-{k}.html")
            graph.resources[error] = Resource("error", status, links=(trap,), title=title)
            graph.resources[trap] = Resource("trap", 200, title="must not be crawled")


def _add_redirect_loop(graph: _Graph) -> None:
    """One redirect loop across two hosts, linked from two pages."""
    hosts = graph.spec.hosts
    loop_a, loop_b = Target(1 % hosts, "/loop/a.html"), Target(2 % hosts, "/loop/b.html")
    graph.resources[loop_a] = Resource("redirect", 302, location=loop_b)
    graph.resources[loop_b] = Resource("redirect", 302, location=loop_a)
    for page in graph.rng.sample(graph.sources, 2):
        graph.links[page].append(loop_a)


def _finish_pages(graph: _Graph) -> None:
    """The pages' resources: a normal page's links shuffled (sometimes one repeated), a
    fraction of the normal pages slow."""
    rng = graph.rng
    slow = set(rng.sample(range(len(graph.normal)),
                          int(len(graph.normal) * graph.spec.slow_fraction)))
    for index, page in enumerate(graph.normal):
        links = graph.links[page]
        rng.shuffle(links)
        if links and rng.random() < 0.2:  # a repeated link (the same URL twice on a page)
            links.append(links[0])
        graph.resources[page] = Resource(
            "page", links=tuple(links), slow=index in slow, title=f"page {index}"
        )
    for home in graph.homes:
        graph.resources[home] = Resource("page", links=tuple(graph.links[home]),
                                         title=f"home {home.host}")
    for page in graph.deep:
        graph.resources[page] = Resource("page", links=tuple(graph.links[page]), title=page.path)


def site_endpoint(host: str | None = None, advertise: str | None = None) -> Endpoint:
    """Where a demo site listens and the host its URLs name (see the module doc); ``None``
    takes ``$FETCH_SITE_HOST`` / ``$FETCH_SITE_ADVERTISE``.  Ports come from ``--port``."""
    return choose_endpoint(host if host is not None else os.environ.get(HOST_ENV),
                           advertise if advertise is not None else os.environ.get(ADVERTISE_ENV),
                           what="--host")


def add_address_options(parser: argparse.ArgumentParser) -> None:
    """``--host`` and ``--advertise`` of a site's command line."""
    parser.add_argument("--host", default=None, metavar="HOST",
                        help=f"address to listen on (${HOST_ENV}; default: the interface "
                             "towards $FRAMEWORK_ZK_HOSTS, else 127.0.0.1; 0.0.0.0: all)")
    parser.add_argument("--advertise", default=None, metavar="HOST",
                        help=f"host the URLs name (${ADVERTISE_ENV}; default: where it listens)")


def manifest_host(hosts: Sequence[str]) -> str:
    """The host the URLs of a manifest's ``hosts`` (``HOST:PORT`` each) name."""
    return hosts[0].rpartition(":")[0] if hosts else HOST


@asynccontextmanager
async def serve_site(spec: SiteSpec, *, ports: Sequence[int] | None = None,
                     host: str | None = None,
                     advertise: str | None = None) -> AsyncIterator[Site]:
    """Serve the site for the duration of the block; yields the :class:`Site` (listening).

    ``ports`` fixes the port of each host (default: free ports chosen by the kernel);
    ``host``/``advertise`` where to listen and what the URLs name (:func:`site_endpoint`).
    The sockets are bound before the ``Site`` exists, so its URLs are final when it is
    yielded.  Raises :class:`FrameworkError` (one line) when an address cannot be bound.
    """
    endpoint = site_endpoint(host, advertise)
    listener = web.listen(endpoint.listen_host,
                          ports=ports if ports is not None else [0] * spec.hosts,
                          what="site", graceful_timeout=0.2, keep_alive_timeout=30.0,
                          server_header=False)
    site = Site(spec, listener.ports, endpoint.advertise_host)
    async with trio.open_nursery() as nursery:
        await nursery.start(web.serve, site.app(), listener)
        log.info("site.serving", hosts=list(site.hosts), seeds=list(site.seeds))
        try:
            yield site
        finally:
            nursery.cancel_scope.cancel()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m examples.fetch_service.site",
        description="Serve the fetch-service demo web site until Ctrl-C. "
        "Prints the seed URLs, one per line, then READY.",
    )
    parser.add_argument("--pages", type=int, default=300, help="HTML pages (default 300)")
    parser.add_argument("--hosts", type=int, default=4, help="virtual hosts/ports (default 4)")
    parser.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    parser.add_argument("--seed-hosts", type=int, default=2, help="hosts whose / is a seed")
    parser.add_argument("--slow-delay", type=float, default=0.3, help="slow page delay (s)")
    parser.add_argument("--slow-fraction", type=float, default=0.05)
    parser.add_argument(
        "--port", type=int, default=0, help="first port; host i uses PORT+i (default: free)"
    )
    parser.add_argument("--manifest", type=Path, help="write spec/ports/seeds JSON here")
    add_address_options(parser)
    args = parser.parse_args(argv)
    try:
        spec = SiteSpec(
            pages=args.pages,
            hosts=args.hosts,
            seed=args.seed,
            seed_hosts=args.seed_hosts,
            slow_delay_s=args.slow_delay,
            slow_fraction=args.slow_fraction,
        )
    except ConfigurationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    ports = [args.port + i for i in range(spec.hosts)] if args.port else None
    return serve_until_signal(lambda: serve_site(spec, ports=ports, host=args.host,
                                                 advertise=args.advertise), args.manifest,
                              lambda site: site.seeds)


def serve_until_signal(serving: Callable[[], AbstractAsyncContextManager[Any]],
                       manifest: Path | None,
                       lines: Callable[[Any], Iterable[str]] = lambda site: ()) -> int:
    """A site's command line: serve until SIGINT or SIGTERM; once listening, write the
    manifest (when given), print ``lines(site)`` and ``READY``.  The exit status: 0, or 2
    with one line on stderr when a port cannot be listened on."""

    async def run() -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with serving() as site:
                if manifest is not None:
                    site.write_manifest(manifest)
                for line in lines(site):
                    print(line)
                print("READY", flush=True)
                async for signum in signals:
                    log.info("site.stopping", signal=signal.Signals(signum).name)
                    break

    try:
        trio.run(run)
    except (ConfigurationError, FrameworkError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0

if __name__ == "__main__":
    sys.exit(main())
