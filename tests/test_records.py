"""The one record codec (framework.records): round trips, renames, old and new writers,
and a clear error for bytes that are not a record."""

from __future__ import annotations

import enum

import attrs
import pytest

from framework import records


class Kind(enum.Enum):
    FIRST = "first"
    SECOND = "second"


@attrs.frozen
class Sample:
    id: str
    kind: Kind = Kind.FIRST
    key: str | None = attrs.field(default=None, metadata=records.wire("k"))
    tags: tuple[str, ...] = ()
    seen: int = attrs.field(default=0, metadata=records.local())


def test_round_trip_keeps_enums_tuples_and_renamed_fields() -> None:
    record = Sample("a", Kind.SECOND, "key-1", ("x", "y"))
    data = records.encode(record)
    assert data == b'{"id":"a","kind":"second","k":"key-1","tags":["x","y"]}'
    assert records.decode(data, Sample) == record


def test_local_fields_stay_off_the_wire() -> None:
    data = records.encode(Sample("e", seen=3))
    assert b"seen" not in data
    assert records.decode(data, Sample).seen == 0


def test_unknown_keys_are_ignored_and_missing_ones_take_defaults() -> None:
    assert records.decode(b'{"id":"b","newer":1}', Sample) == Sample("b")


@pytest.mark.parametrize("data", [b"not json", b'{"id":"c","kind":"third"}', b"{}", b"[1]",
                                  b"\xff"])
def test_bytes_that_are_not_a_record_raise_corrupt_record(data: bytes) -> None:
    with pytest.raises(records.CorruptRecord, match="not a Sample record"):
        records.decode(data, Sample)


def test_plain_values_for_other_wire_formats() -> None:
    record = Sample("d", tags=("t",))
    assert records.structure(records.unstructure(record), Sample) == record


@attrs.frozen
class Blob:
    data: bytes


def test_bytes_come_only_from_bytes() -> None:
    assert records.structure({"data": b"ab"}, Blob) == Blob(b"ab")
    with pytest.raises(records.CorruptRecord, match="not a Blob record"):
        records.structure({"data": 5}, Blob)
