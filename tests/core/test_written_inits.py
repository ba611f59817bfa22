"""Dataclasses whose `__init__` is written out (so that the compiled core runs it natively:
`CycleResult`, `RunningAttempt`) initialise every field as the generated one would: each field
left out gets its declared default (a fresh object from its factory), each field given is kept as
given, positionally or by name, and `dataclasses.replace` builds the same value."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.core.decisions import CycleResult, Reason, Reasons, Why
from corral.core.jobs import PendingJob, RunningAttempt
from corral.core.model import JobId, JobSpec, QueueName

_REQUIRED: dict[type, tuple[object, ...]] = {
    CycleResult: (1.5,),
    RunningAttempt: (PendingJob(JobSpec(JobId("j"), QueueName("a"))), 2, [(0, 3)], 4.0, 5.0, 6.0),
}


def _default(f: dataclasses.Field[Any]) -> object:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


@pytest.mark.parametrize("cls", [CycleResult, RunningAttempt])
def test_fields_left_out_get_their_defaults(cls: type) -> None:
    required = _REQUIRED[cls]
    one, two = cls(*required), cls(*required)
    for i, f in enumerate(dataclasses.fields(cls)):
        got = getattr(one, f.name)
        if i < len(required):
            assert _same(got, required[i])
        else:
            assert got == _default(f)
            if f.default_factory is not dataclasses.MISSING:
                assert got is not getattr(two, f.name)  # a fresh object each time


def _values(cls: type, draw: st.DrawFn) -> dict[str, object]:
    """A value of its type for every field (the compiled classes check types)."""
    if cls is CycleResult:
        return {
            "now": draw(st.floats(0, 10)),
            "starts": [],
            "preemptions": [],
            "nominations": [],
            "reservations": [],
            "rejections": [],
            "reasons": Reasons(),
            "others": draw(st.sampled_from([None, Reason(Why.CAPACITY, "full")])),
            "considered": draw(st.integers(0, 9)),
            "next_wake": draw(st.floats(0, 10)),
            "checkpoint_wakes": {},
            "quiet": None,
        }
    return {
        "job": _REQUIRED[RunningAttempt][0],
        "attempt": draw(st.integers(0, 9)),
        "placement": [(0, 1)],
        "start": draw(st.floats(0, 10)),
        "limit_end": draw(st.floats(0, 10)),
        "last_checkpoint": draw(st.floats(0, 10)),
        "cpus": draw(st.integers(0, 9)),
        "memory_gib": draw(st.floats(0, 10)),
        "exclusive": draw(st.booleans()),
        "preempting_deadline": draw(st.sampled_from([None, 3.5])),
        "preempted_by": draw(st.sampled_from([None, JobId("p")])),
        "end_key": draw(st.sampled_from([None, (1.0, 2, JobId("e"))])),
        "candidate": draw(st.integers(0, 2)),
        "estimated_end": draw(st.floats(0, 10)),
        "estimate": None,
        "estimate_key": draw(st.sampled_from([None, (1.0, -2, JobId("e"))])),
    }


def _same(got: object, value: object) -> bool:
    """Containers kept as given (the same object); numbers, strings and tuples equal."""
    return got is value if isinstance(value, (list, dict, Reasons)) else got == value


@pytest.mark.parametrize("cls", [CycleResult, RunningAttempt])
@settings(max_examples=50, deadline=None)
@given(data=st.data())
def test_fields_given_are_kept(cls: type, data: st.DataObject) -> None:
    fields = dataclasses.fields(cls)
    values = _values(cls, data.draw)
    assert [f.name for f in fields] == list(values)
    required = [values[f.name] for f in fields[: len(_REQUIRED[cls])]]
    given_ = {f.name: values[f.name] for f in fields[len(required) :] if data.draw(st.booleans())}
    made = cls(*required, **given_)
    for name, value in given_.items():
        assert _same(getattr(made, name), value)
    made = cls(*values.values())
    assert all(_same(getattr(made, name), value) for name, value in values.items())
    copy = dataclasses.replace(made)
    assert all(_same(getattr(copy, name), value) for name, value in values.items())
