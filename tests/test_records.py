"""The record's own initializer (records._init_by_slots) against the one dataclasses writes."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest

from llamacpp_exporter.records import RequestRecord

FIELDS = dataclasses.fields(RequestRecord)
# the same fields in a dataclass left as the decorator makes it
TWIN = dataclasses.make_dataclass(
    "Twin", [(f.name, f.type, dataclasses.field(default=f.default)) for f in FIELDS], frozen=True, slots=True
)


def _values(rec: object) -> tuple[object, ...]:
    return tuple(getattr(rec, f.name) for f in FIELDS)


def test_defaults_and_every_field_given_come_out_as_the_dataclass_makes_them() -> None:
    required: dict[str, Any] = {"epoch": 3, "slot": 1, "task": 9}
    assert _values(RequestRecord(**required)) == _values(TWIN(**required))
    given: dict[str, Any] = {f.name: (i, f.name) for i, f in enumerate(FIELDS)}  # a distinct value for each
    assert _values(RequestRecord(**given)) == _values(TWIN(**given)) == tuple(given.values())
    positional = tuple(given.values())
    assert RequestRecord(*positional) == RequestRecord(**given)  # the events store reads so


def test_its_signature_is_the_dataclass_one_and_it_stays_frozen() -> None:
    def params(cls: type) -> list[tuple[str, object, object]]:
        return [(p.name, p.kind, p.default) for p in inspect.signature(cls).parameters.values()]

    assert params(RequestRecord) == params(TWIN)
    with pytest.raises(TypeError):
        RequestRecord(epoch=0, slot=0)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        RequestRecord(epoch=0, slot=0, task=1, no_such_field=1)  # type: ignore[call-arg]
    rec = RequestRecord(epoch=0, slot=0, task=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        rec.task = 2  # type: ignore[misc]
    assert hash(rec) == hash(RequestRecord(epoch=0, slot=0, task=1))
    assert repr(rec).startswith("RequestRecord(epoch=0, slot=0, task=1, model=''")
