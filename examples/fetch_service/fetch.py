"""Fetching pages under trio with httpx: politeness, manual redirects, one outcome per URL.

A :class:`Fetcher` is long-lived (one per fetcher process) and owns one
``httpx.AsyncClient`` plus the per-host politeness state, so politeness holds across batches
and across batches processed at the same time.  Guarantees:

- **Politeness.**  Requests to one host (``host[:port]``) never overlap, and each starts at
  least ``politeness_delay_s`` after the previous one to that host ended (a per-host FIFO
  ``trio.Lock`` plus the end time of the last exchange; across processes, politeness is the
  caller's: the partitioned crawl gives each host to one fetcher).  Different hosts proceed
  in parallel, at most ``fetch_concurrency`` exchanges at a time.
- **Redirects** are followed by hand, each hop through the politeness of its own host,
  at most ``max_redirects`` hops.  A loop (a URL seen twice in one chain) ends the fetch with
  :attr:`ErrorKind.REDIRECT_LOOP`; a longer chain with :attr:`ErrorKind.TOO_MANY_REDIRECTS`.
- **Bounded time.**  Each hop (connect, headers, body) is bounded by ``request_timeout_s``.
- **No exception escapes for a bad URL or a bad server.**  Every URL produces exactly one
  :class:`FetchOutcome`; failures are described by an :class:`ErrorKind` and a readable
  ``error``.  Only cancellation propagates.
- **Live configuration.**  Assigning :attr:`Fetcher.config` takes effect for the next hop
  (delay, timeout, user agent, limits, allowed hosts).

The body of every response received (each hop) is handed back in :class:`FetchResult` as a
:class:`RawResponse` for storage (WARC); the small :class:`FetchOutcome` is what a fetcher
reports (it has the links, never the body; a record through :mod:`framework.records`).
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import enum
import hashlib
import http
import math
from collections.abc import Awaitable, Callable, Iterable

import attrs
import httpx
import trio

from examples.fetch_service.config import CrawlConfig
from examples.fetch_service.links import InvalidUrlError, canonicalize, extract_links, host_key
from framework.logs import get_logger

__all__ = [
    "ErrorKind",
    "FetchOutcome",
    "FetchResult",
    "Fetcher",
    "RawResponse",
    "payload_digest",
]

log = get_logger("examples.fetch_service.fetch")

REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})

class ErrorKind(enum.StrEnum):
    """Why a fetch failed (:attr:`FetchOutcome.error_kind`; ``None`` there means success)."""

    INVALID_URL = "invalid_url"  # not an absolute http(s) URL with a host
    NOT_ALLOWED = "not_allowed"  # host not in allowed_hosts (no request made)
    HTTP = "http"  # a response with status >= 400 (recorded and stored)
    REDIRECT_LOOP = "redirect_loop"  # the redirect chain came back to a URL already in it
    TOO_MANY_REDIRECTS = "too_many_redirects"  # more than max_redirects hops
    BAD_REDIRECT = "bad_redirect"  # 3xx without a usable Location
    TIMEOUT = "timeout"  # a hop took longer than request_timeout_s
    CONNECT = "connect"  # connection refused / host unreachable / name not resolved
    NETWORK = "network"  # the connection broke or the server spoke bad HTTP
    TOO_LARGE = "too_large"  # body longer than max_page_bytes (cut; no links taken)
    INTERNAL = "internal"  # a bug in the fetcher; reported rather than raised


def payload_digest(body: bytes) -> str:
    """``sha1:BASE32`` of a body: the same form as WARC's ``WARC-Payload-Digest``."""
    return "sha1:" + base64.b32encode(hashlib.sha1(body).digest()).decode("ascii")


@attrs.frozen
class RawResponse:
    """One HTTP response as received (one redirect hop), kept only for storage."""

    url: str
    status: int
    reason: str
    http_version: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    fetched_at: dt.datetime
    truncated: bool = False
    remote_ip: str | None = None


@attrs.frozen
class FetchOutcome:
    """What happened to one URL; small, a record of :mod:`framework.records`.

    - ``url``: the URL asked for (canonical when it could be parsed);
    - ``final_url``: the last URL of the redirect chain that was tried (``url`` when there
      was no redirect); ``redirects``: the URLs after ``url`` in the chain;
    - ``status``: the HTTP status of ``final_url`` (None when it got no response: bad URL,
      refused, timed out...); ``responses``: how many responses were received (and stored);
    - ``error``: a readable reason, None on success; ``error_kind``: why, None on success
      (:attr:`ErrorKind.HTTP` for a 4xx/5xx answer);
    - ``bytes`` and ``digest`` (``sha1:BASE32``, as in WARC): of ``final_url``'s body;
    - ``elapsed``: seconds in HTTP exchanges; ``waited``: seconds in politeness delays;
    - ``links``: canonical, allowed links of a 2xx HTML page (empty otherwise).
    """

    url: str
    final_url: str
    status: int | None
    error: str | None
    error_kind: ErrorKind | None = None
    bytes: int = 0
    elapsed: float = 0.0
    waited: float = 0.0
    links: tuple[str, ...] = ()
    redirects: tuple[str, ...] = ()
    responses: int = 0
    digest: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def requested(self) -> tuple[str, ...]:
        """The URLs that got a response in this fetch (each is stored once), in order."""
        return (self.url, *self.redirects)[: self.responses]

    @property
    def chain(self) -> tuple[str, ...]:
        """Every URL this fetch tried: ``url`` then ``redirects`` (mark them all seen)."""
        return (self.url, *self.redirects)


@attrs.frozen
class FetchResult:
    """The outcome plus the responses received, in hop order (empty when none came)."""

    outcome: FetchOutcome
    responses: tuple[RawResponse, ...] = ()


@attrs.define
class _Host:
    lock: trio.Lock = attrs.field(factory=trio.Lock)
    last_end: float = -math.inf


class _Failure(Exception):
    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class Fetcher:
    """Fetches URLs politely; ``async with Fetcher(config) as f: await f.fetch_batch(urls)``.

    Pass ``client`` to share an ``httpx.AsyncClient`` (then the caller closes it); otherwise
    the fetcher makes one on entry and closes it on exit.

    """

    def __init__(self, config: CrawlConfig, *, client: httpx.AsyncClient | None = None) -> None:
        self._config = config
        self._client = client
        self._owns_client = client is None
        self._hosts: dict[str, _Host] = {}
        self._limiter = trio.CapacityLimiter(config.fetch_concurrency)

    @property
    def config(self) -> CrawlConfig:
        return self._config

    @config.setter
    def config(self, config: CrawlConfig) -> None:
        """Apply a new configuration; it takes effect at the next hop."""
        self._config = config
        self._limiter.total_tokens = config.fetch_concurrency

    async def __aenter__(self) -> Fetcher:
        if self._client is None:
            self._client = httpx.AsyncClient(
                follow_redirects=False,
                trust_env=False,
                timeout=httpx.Timeout(self._config.request_timeout_s),
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
            )
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._owns_client and self._client is not None:
            with trio.CancelScope(shield=True):
                await self._client.aclose()
            self._client = None

    async def fetch_batch(
        self,
        urls: Iterable[str],
        *,
        on_result: Callable[[FetchResult], Awaitable[None]] | None = None,
    ) -> list[FetchOutcome]:
        """Fetch ``urls`` concurrently; outcomes in input order, one per URL.

        ``on_result`` (e.g. a WARC writer's ``store``) is awaited for each result as soon as
        it is ready, before the batch returns; an exception from it propagates (storage
        failure is not a fetch outcome).  Politeness and ``fetch_concurrency`` bound what
        runs at once.
        """
        items = list(urls)
        outcomes: list[FetchOutcome | None] = [None] * len(items)

        async def one(index: int, url: str) -> None:
            result = await self.fetch(url)
            if on_result is not None:
                await on_result(result)
            outcomes[index] = result.outcome

        async with trio.open_nursery() as nursery:
            for index, url in enumerate(items):
                nursery.start_soon(one, index, url)
        return [outcome for outcome in outcomes if outcome is not None]

    async def fetch(self, url: str) -> FetchResult:
        """Fetch one URL following redirects; never raises except ``trio.Cancelled``.

        (And ``RuntimeError`` when used outside ``async with Fetcher(...)``.)
        """
        if self._client is None:
            raise RuntimeError("use the fetcher inside 'async with Fetcher(config) as fetcher'")
        config = self._config
        try:
            current = canonicalize(url)
        except InvalidUrlError as exc:
            return self._failed(url, ErrorKind.INVALID_URL, str(exc))
        if not config.allows(current):
            return self._failed(
                current, ErrorKind.NOT_ALLOWED, f"host {host_key(current)} is not in allowed_hosts"
            )
        chain = [current]
        responses: list[RawResponse] = []
        timing = [0.0, 0.0]  # elapsed, waited
        try:
            while True:
                response = await self._exchange(current, timing)
                responses.append(response)
                target = self._redirect_target(response)
                if target is None:
                    return self._finished(chain, responses, timing)
                if target in chain:
                    loop = " -> ".join([*chain[chain.index(target) :], target])
                    raise _Failure(ErrorKind.REDIRECT_LOOP, f"redirect loop: {loop}")
                if len(chain) > self._config.max_redirects:
                    raise _Failure(
                        ErrorKind.TOO_MANY_REDIRECTS,
                        f"more than {self._config.max_redirects} redirects from {chain[0]}",
                    )
                if not self._config.allows(target):
                    raise _Failure(
                        ErrorKind.NOT_ALLOWED,
                        f"redirect to host {host_key(target)} which is not in allowed_hosts",
                    )
                chain.append(target)
                current = target
        except _Failure as failure:
            outcome = self._outcome(chain, responses, timing, failure.kind, str(failure))
            log.debug("fetch.failed", url=chain[0], kind=failure.kind, error=str(failure))
            return FetchResult(outcome, tuple(responses))

    # -- one hop --------------------------------------------------------------------------

    def _slot(self, host: str) -> _Host:
        slot = self._hosts.get(host)
        if slot is None:
            slot = self._hosts[host] = _Host()
        return slot

    async def _exchange(self, url: str, timing: list[float]) -> RawResponse:
        host = host_key(url)
        slot = self._slot(host)
        async with slot.lock:
            before = trio.current_time()
            await trio.sleep_until(slot.last_end + self._config.politeness_delay_s)
            async with self._limiter:
                start = trio.current_time()
                timing[1] += start - before
                try:
                    return await self._request(url)
                finally:
                    slot.last_end = trio.current_time()
                    timing[0] += slot.last_end - start

    async def _request(self, url: str) -> RawResponse:
        config = self._config
        headers = {"User-Agent": config.user_agent, "Accept-Encoding": "identity"}
        timeout = httpx.Timeout(config.request_timeout_s)
        fetched_at = dt.datetime.now(dt.UTC)
        with trio.move_on_after(config.request_timeout_s) as scope:
            try:
                async with self._client.stream(
                    "GET", url, headers=headers, timeout=timeout
                ) as response:
                    body, truncated = await _read_body(response, config.max_page_bytes)
                    return RawResponse(
                        url=url,
                        status=response.status_code,
                        reason=response.reason_phrase or _phrase(response.status_code),
                        http_version=response.http_version,
                        headers=tuple(
                            (k.decode("latin-1"), v.decode("latin-1"))
                            for k, v in response.headers.raw
                        ),
                        body=body,
                        fetched_at=fetched_at,
                        truncated=truncated,
                        remote_ip=_remote_ip(response),
                    )
            except httpx.TimeoutException as exc:
                raise _Failure(
                    ErrorKind.TIMEOUT,
                    f"timed out after {config.request_timeout_s:g}s ({_why(exc)})",
                ) from None
            except httpx.ConnectError as exc:
                raise _Failure(
                    ErrorKind.CONNECT, f"cannot connect to {host_key(url)}: {_why(exc)}"
                ) from None
            except httpx.InvalidURL as exc:
                raise _Failure(ErrorKind.INVALID_URL, f"invalid URL {url!r}: {_why(exc)}") from None
            except (httpx.TransportError, httpx.DecodingError, OSError) as exc:
                raise _Failure(ErrorKind.NETWORK, f"{host_key(url)}: {_why(exc)}") from None
            except Exception as exc:
                log.exception("fetch.internal_error", url=url)
                raise _Failure(ErrorKind.INTERNAL, f"fetcher error: {_why(exc)}") from None
        assert scope.cancelled_caught
        raise _Failure(ErrorKind.TIMEOUT, f"timed out after {config.request_timeout_s:g}s")

    # -- results ----------------------------------------------------------------------

    def _redirect_target(self, response: RawResponse) -> str | None:
        if response.status not in REDIRECT_STATUSES:
            return None
        location = _header(response, "location")
        if not location:
            raise _Failure(ErrorKind.BAD_REDIRECT,
                           f"{response.status} from {response.url} has no Location")
        try:
            return canonicalize(location, response.url)
        except InvalidUrlError as exc:
            raise _Failure(ErrorKind.BAD_REDIRECT, f"{response.url} redirects to {exc}") from None

    def _finished(
        self, chain: list[str], responses: list[RawResponse], timing: list[float]
    ) -> FetchResult:
        final = responses[-1]
        kind: ErrorKind | None = None
        error: str | None = None
        links: tuple[str, ...] = ()
        if final.truncated:
            kind = ErrorKind.TOO_LARGE
            error = f"body larger than {self._config.max_page_bytes} bytes (cut)"
        elif final.status >= 400:
            kind = ErrorKind.HTTP
            error = f"HTTP {final.status} {final.reason}".rstrip()
        elif 200 <= final.status < 300 and _is_html(final):
            found = extract_links(_decode(final), final.url)
            links = tuple(link for link in found if self._config.allows(link))
        outcome = self._outcome(chain, responses, timing, kind, error, links)
        log.debug("fetch.done", url=chain[0], status=final.status, error=error)
        return FetchResult(outcome, tuple(responses))

    @staticmethod
    def _outcome(
        chain: list[str],
        responses: list[RawResponse],
        timing: list[float],
        kind: ErrorKind | None,
        error: str | None,
        links: tuple[str, ...] = (),
    ) -> FetchOutcome:
        final = responses[-1] if len(responses) == len(chain) else None
        return FetchOutcome(
            url=chain[0],
            final_url=chain[-1],
            status=final.status if final is not None else None,
            error=error,
            error_kind=kind,
            bytes=len(final.body) if final is not None else 0,
            elapsed=timing[0],
            waited=timing[1],
            links=links,
            redirects=tuple(chain[1:]),
            responses=len(responses),
            digest=payload_digest(final.body) if final is not None else None,
        )

    @staticmethod
    def _failed(url: str, kind: ErrorKind, error: str) -> FetchResult:
        log.debug("fetch.failed", url=url, kind=kind, error=error)
        return FetchResult(
            FetchOutcome(url=url, final_url=url, status=None, error=error, error_kind=kind)
        )


async def _read_body(response: httpx.Response, limit: int) -> tuple[bytes, bool]:
    """The body, and whether it was cut: at most ``limit`` bytes are kept."""
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        # Known to be too long: read nothing (the connection is closed, not drained).
        return b"", True
    chunks: list[bytes] = []
    size = 0
    async with contextlib.aclosing(response.aiter_raw()) as stream:
        async for chunk in stream:
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                return b"".join(chunks)[:limit], True
    return b"".join(chunks), False


def _phrase(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return ""


def _header(response: RawResponse, name: str) -> str | None:
    for key, value in response.headers:
        if key.lower() == name:
            return value
    return None


def _is_html(response: RawResponse) -> bool:
    kind = (_header(response, "content-type") or "text/html").lower()
    return "html" in kind


def _decode(response: RawResponse) -> str:
    kind = _header(response, "content-type") or ""
    charset = "utf-8"
    for part in kind.split(";")[1:]:
        key, _, value = part.strip().partition("=")
        if key.lower() == "charset" and value:
            charset = value.strip("\"' ")
    try:
        return response.body.decode(charset, errors="replace")
    except LookupError:
        return response.body.decode("utf-8", errors="replace")


def _remote_ip(response: httpx.Response) -> str | None:
    stream = response.extensions.get("network_stream")
    if stream is None:
        return None
    try:
        address = stream.get_extra_info("server_addr")
    except Exception:
        return None
    if isinstance(address, tuple) and address:
        return str(address[0])
    return None


def _why(exc: BaseException) -> str:
    """A readable reason, also for exceptions whose str() is empty."""
    text = str(exc).strip()
    cause = exc.__cause__ or exc.__context__
    if not text and cause is not None:
        text = str(cause).strip()
    return text or type(exc).__name__
