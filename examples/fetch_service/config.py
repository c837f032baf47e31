"""The crawl configuration that the master publishes and every fetcher follows.

:class:`CrawlConfig` is an immutable attrs class.  Every field is checked when an instance is
made (directly, by :meth:`CrawlConfig.evolve`, or from JSON), and a bad value raises
:class:`framework.errors.ConfigurationError` whose message names the field, the rule and the
value, so a CLI can print it as it is.  The JSON form is what travels through ZooKeeper: it
is written by :mod:`framework.records` (:meth:`CrawlConfig.to_json`) and read back by a
stricter copy of the same converter (:meth:`CrawlConfig.from_json`): unlike other records,
unknown keys are refused and numbers are not coerced, so a typo in a live change is a
:class:`ConfigurationError`, never a setting silently without effect.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import SplitResult, urlsplit

import attrs
import cattrs
from cattrs.errors import ClassValidationError, ForbiddenExtraKeysError

from framework import records
from framework.errors import ConfigurationError

__all__ = ["CrawlConfig", "normalize_host", "url_host"]


def normalize_host(value: str) -> str:
    """``"Example.COM:80"`` -> ``"example.com"``; ``"127.0.0.1:8001"`` stays as it is.

    Accepts a bare ``host[:port]`` or a site root URL (its scheme only decides which port is
    the default one that is dropped).  Raises :class:`ConfigurationError` for anything else.
    """
    text = value.strip()
    if not text:
        raise ConfigurationError("allowed host must not be empty")
    parsed = urlsplit(text if "://" in text else f"http://{text}")
    if parsed.path not in ("", "/") or parsed.query or parsed.fragment:
        raise ConfigurationError(
            f"allowed host {value!r} must be 'host' or 'host:port' (or a site root URL)"
        )
    key = _host_key(parsed)
    if key is None:
        raise ConfigurationError(f"allowed host {value!r} has no host name or a bad port")
    return key


def url_host(url: str) -> str | None:
    """The ``host[:port]`` key of an absolute URL (default port dropped), or None."""
    try:
        return _host_key(urlsplit(url.strip()))
    except ValueError:
        return None


def _host_key(parsed: SplitResult) -> str | None:
    try:
        port = parsed.port
    except ValueError:
        return None
    host = (parsed.hostname or "").lower()
    if not host:
        return None
    if ":" in host:
        host = f"[{host}]"
    default = 443 if parsed.scheme.lower() == "https" else 80
    return host if port is None or port == default else f"{host}:{port}"


def _hosts(value: Iterable[str] | str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [part for part in value.split(",") if part.strip()]
    return tuple(sorted({normalize_host(v) for v in value}))


def _check(rule: str, ok: Any) -> Any:
    def validator(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
        if isinstance(value, bool) or not ok(value):
            raise ConfigurationError(f"CrawlConfig.{attribute.name} must be {rule}, got {value!r}")

    return validator


def _number(value: Any) -> bool:
    return isinstance(value, int | float)


def _positive(value: Any) -> bool:
    return _number(value) and value > 0


def _non_negative(value: Any) -> bool:
    return _number(value) and value >= 0


def _count(minimum: int) -> Any:
    return lambda value: isinstance(value, int) and value >= minimum


def _user_agent(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= 200 and value.isprintable()


@attrs.frozen(kw_only=True)
class CrawlConfig:
    """Everything a fetcher needs to know about the crawl; immutable and validated.

    - ``politeness_delay_s``: minimum pause between the end of one request to a host and the
      start of the next one to the same host (requests to one host never overlap).
    - ``max_depth``: seeds are depth 0; a page at depth ``max_depth`` is fetched but its
      links are not followed.
    - ``request_timeout_s``: bound on each HTTP exchange (connect + headers + body) of one hop.
    - ``max_redirects``: redirect hops followed within one fetch (the site needs >= 2).
    - ``max_page_bytes``: bodies are cut (and the outcome marked ``too_large``) beyond this.
    - ``fetch_concurrency``: fetches in flight at once in one fetcher (across hosts).
    - ``user_agent``: the ``User-Agent`` header.
    - ``allowed_hosts``: ``host[:port]`` keys a fetcher may contact; empty means any host.
    - ``warc_max_bytes``: a WARC file is closed and a new one started past this size.
    """

    politeness_delay_s: float = attrs.field(
        default=0.2, validator=_check("a number >= 0", _non_negative)
    )
    max_depth: int = attrs.field(default=5, validator=_check("an integer >= 0", _count(0)))
    request_timeout_s: float = attrs.field(
        default=10.0, validator=_check("a number > 0", _positive)
    )
    max_redirects: int = attrs.field(default=5, validator=_check("an integer >= 0", _count(0)))
    max_page_bytes: int = attrs.field(
        default=2_000_000, validator=_check("an integer >= 1", _count(1))
    )
    fetch_concurrency: int = attrs.field(default=8, validator=_check("an integer >= 1", _count(1)))
    user_agent: str = attrs.field(
        default="framework-fetch-service/0.1 (+local demo crawler)",
        validator=_check("a printable string of 1..200 characters", _user_agent),
    )
    allowed_hosts: tuple[str, ...] = attrs.field(default=(), converter=_hosts)
    warc_max_bytes: int = attrs.field(
        default=1_000_000, validator=_check("an integer >= 1024", _count(1024))
    )

    def allows(self, url: str) -> bool:
        """True when ``url``'s host (``host[:port]``) may be fetched under this config."""
        if not self.allowed_hosts:
            return True
        return url_host(url) in self.allowed_hosts

    def evolve(self, **changes: Any) -> CrawlConfig:
        """A copy with ``changes`` applied and validated (unknown names are refused)."""
        unknown = sorted(set(changes) - set(_FIELDS))
        if unknown:
            raise ConfigurationError(_unknown_message(unknown))
        return attrs.evolve(self, **changes)

    def with_overrides(self, pairs: Mapping[str, str] | Iterable[str]) -> CrawlConfig:
        """Apply textual overrides from a CLI: ``["max_depth=3"]`` or ``{"max_depth": "3"}``.

        Values are parsed by the field's type (``allowed_hosts`` as a comma-separated list).
        """
        items: dict[str, str] = {}
        if isinstance(pairs, Mapping):
            items.update(pairs)
        else:
            for pair in pairs:
                name, sep, text = pair.partition("=")
                if not sep:
                    raise ConfigurationError(f"expected NAME=VALUE, got {pair!r}")
                items[name.strip()] = text.strip()
        changes = {name: _parse_text(name, text) for name, text in items.items()}
        return self.evolve(**changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain values (what the runtime's configuration store publishes)."""
        return records.unstructure(self)

    def to_json(self) -> bytes:
        """The record's compact JSON (the same bytes for the same config)."""
        return records.encode(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CrawlConfig:
        """The config in plain values (missing keys take their defaults);
        :class:`ConfigurationError` naming the field, the rule and the value for a bad one,
        or the unknown keys."""
        if not isinstance(data, Mapping):
            raise ConfigurationError(
                f"crawl config must be a JSON object, got {type(data).__name__}"
            )
        unknown = sorted(set(data) - set(_FIELDS))
        if unknown:
            raise ConfigurationError(_unknown_message(unknown))
        try:
            return _converter.structure(dict(data), cls)
        except ConfigurationError:
            raise
        except ClassValidationError as exc:
            details = "; ".join(
                cattrs.transform_error(
                    exc, path="CrawlConfig", format_exception=lambda e, _type: str(e)
                )
            ).replace(" @ CrawlConfig;", ";")
            details = details.removesuffix(" @ CrawlConfig")
            raise ConfigurationError(f"bad crawl config: {details}") from None
        except ForbiddenExtraKeysError as exc:  # pragma: no cover - caught above
            raise ConfigurationError(_unknown_message(sorted(exc.extra_fields))) from None

    @classmethod
    def from_json(cls, data: bytes | str) -> CrawlConfig:
        """:meth:`from_dict` of JSON text (:class:`ConfigurationError` if it is not JSON)."""
        try:
            decoded = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ConfigurationError(f"crawl config is not valid JSON: {exc}") from None
        return cls.from_dict(decoded)


_FIELDS = {field.name: field for field in attrs.fields(CrawlConfig)}


def _unknown_message(names: list[str]) -> str:
    known = ", ".join(sorted(_FIELDS))
    return f"unknown crawl config setting(s) {', '.join(names)}; known: {known}"


def _parse_text(name: str, text: str) -> Any:
    field = _FIELDS.get(name)
    if field is None:
        raise ConfigurationError(_unknown_message([name]))
    kind = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", "")
    try:
        if kind == "int":
            return int(text)
        if kind == "float":
            return float(text)
    except ValueError:
        what = "an integer" if kind == "int" else "a number"
        raise ConfigurationError(f"CrawlConfig.{name} must be {what}, got {text!r}") from None
    return text  # str, and allowed_hosts (its converter splits on commas)


def _make_converter() -> cattrs.Converter:
    """:data:`framework.records.converter`, strict: extra keys refused, no coercion."""
    converter = records.converter.copy(forbid_extra_keys=True)

    def strict_number(kind: type) -> Any:
        def structure(value: Any, _: type) -> Any:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigurationError(f"expected a number, got {value!r}")
            if kind is int and not (isinstance(value, int) or float(value).is_integer()):
                raise ConfigurationError(f"expected an integer, got {value!r}")
            return kind(value)

        return structure

    def strict_str(value: Any, _: type) -> str:
        if not isinstance(value, str):
            raise ConfigurationError(f"expected a string, got {value!r}")
        return value

    def hosts(value: Any, _: type) -> tuple[str, ...]:
        if isinstance(value, str) or not isinstance(value, list | tuple):
            raise ConfigurationError(f"expected a list of 'host:port' strings, got {value!r}")
        return tuple(strict_str(v, str) for v in value)

    converter.register_structure_hook(int, strict_number(int))
    converter.register_structure_hook(float, strict_number(float))
    converter.register_structure_hook(str, strict_str)
    converter.register_structure_hook_func(lambda kind: kind == tuple[str, ...], hosts)
    return converter


_converter = _make_converter()
