"""One codec for every record kept in ZooKeeper or sent on a wire: attrs classes through cattrs.

A record is an attrs class; :func:`encode` turns it into compact JSON bytes and :func:`decode`
builds it back.  The same :data:`converter` turns records into plain values
(:func:`unstructure`, :func:`structure`) for a wire format other than JSON (the broker's
msgpack frames).

Contract:

* enums travel as their values, tuples as lists (and come back as tuples), ``None`` as null;
  a ``bytes`` field is structured only from bytes (a wire format that has them: msgpack);
* a field may travel under a shorter name: ``attrs.field(metadata=wire("k"))``, or not at
  all: ``attrs.field(metadata=local())`` (it takes its default when decoded);
* :func:`decode` ignores keys the class does not know (a newer writer's fields) and fills the
  defaults of keys that are missing (an older writer's record);
* :func:`decode` and :func:`structure` raise :class:`CorruptRecord` (a ``ValueError``) when
  the bytes are not JSON or do not fit the class, never a cattrs or ``KeyError`` internal.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

import attrs
import cattrs
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override

from framework.errors import FrameworkError

T = TypeVar("T")

#: The metadata key naming a field's name on the wire (see :func:`wire`).
WIRE_NAME = "framework.wire"
#: The metadata key of a field that stays in the process (see :func:`local`).
LOCAL = "framework.local"


class CorruptRecord(FrameworkError, ValueError):
    """Bytes that are not a valid record of the expected class."""


def wire(name: str) -> dict[str, str]:
    """Field metadata: travel under ``name`` (``attrs.field(metadata=wire("k"))``)."""
    return {WIRE_NAME: name}


def local() -> dict[str, bool]:
    """Field metadata: never on the wire (decoded records get the field's default)."""
    return {LOCAL: True}


def _overrides(cls: type) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for field in attrs.fields(cls):
        if field.metadata.get(LOCAL):
            found[field.name] = override(omit=True)
        elif WIRE_NAME in field.metadata:
            found[field.name] = override(rename=field.metadata[WIRE_NAME])
    return found


def _make_converter() -> cattrs.Converter:
    made = cattrs.Converter()

    def renamed(cls: type) -> bool:
        return attrs.has(cls) and any(
            WIRE_NAME in f.metadata or LOCAL in f.metadata for f in attrs.fields(cls))

    made.register_unstructure_hook_factory(
        renamed, lambda cls: make_dict_unstructure_fn(cls, made, **_overrides(cls))
    )
    made.register_structure_hook_factory(
        renamed, lambda cls: make_dict_structure_fn(cls, made, **_overrides(cls))
    )
    made.register_structure_hook(bytes, _strict_bytes)
    return made


def _strict_bytes(value: Any, _cls: type) -> bytes:
    """Bytes only from bytes (cattrs' default would turn the integer 5 into five zero
    bytes)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"expected bytes, got {type(value).__name__}")


#: The converter every record goes through (register hooks for new types here, once).
converter = _make_converter()


def unstructure(record: Any) -> Any:
    """``record`` as plain values (dicts, lists, str, numbers, bools, ``None``)."""
    return converter.unstructure(record)


def structure(value: Any, cls: type[T]) -> T:
    """Plain values back into ``cls``; :class:`CorruptRecord` if they do not fit."""
    try:
        return converter.structure(value, cls)
    except (cattrs.BaseValidationError, KeyError, TypeError, ValueError, AttributeError) as exc:
        detail = "; ".join(cattrs.transform_error(exc)) if isinstance(
            exc, cattrs.BaseValidationError) else str(exc)
        raise CorruptRecord(f"not a {cls.__name__} record: {detail}") from None


def encode(record: Any) -> bytes:
    """``record`` as compact JSON bytes (``TypeError``/``ValueError`` if a value in it is
    not JSON)."""
    return json.dumps(converter.unstructure(record), separators=(",", ":")).encode()


def decode(data: bytes, cls: type[T]) -> T:
    """A ``cls`` record from JSON bytes; :class:`CorruptRecord` if they are not one."""
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CorruptRecord(f"not a {cls.__name__} record: not JSON ({exc})") from None
    return structure(value, cls)
