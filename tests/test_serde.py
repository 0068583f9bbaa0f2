"""State encoding: round trips, the allowlist, reserved keys and hostile input."""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import uuid
from pathlib import PurePosixPath
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stashpoint import serde
from stashpoint.errors import SerializationError

json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(),
    st.binary(),
    st.datetimes(timezones=st.just(dt.timezone.utc)),
    st.uuids(),
    st.decimals(allow_nan=False),
)
values = st.recursive(
    json_leaf,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.tuples(children, children),
        st.dictionaries(st.text(), children, max_size=4),
        st.dictionaries(st.integers(), children, max_size=3),
        st.frozensets(st.integers(), max_size=4),
    ),
    max_leaves=20,
)


@given(values)
def test_round_trip(value: Any) -> None:
    assert serde.decode(serde.encode(value)) == value


def test_types_survive_exactly() -> None:
    value = {
        "t": (1, 2),
        "s": {1, 2},
        "b": b"\x00\xff",
        "d": dt.date(2026, 1, 2),
        "td": dt.timedelta(days=1, seconds=2),
        "u": uuid.UUID(int=5),
        "dec": decimal.Decimal("1.10"),
        "big": 2**100,
        "nan": float("inf"),
        "p": PurePosixPath("/a/b"),
    }
    back = serde.decode(serde.encode(value))
    assert back == value
    assert type(back["t"]) is tuple and type(back["s"]) is set and str(back["dec"]) == "1.10"


def test_reserved_key_in_user_data_stays_data() -> None:
    value = {"__sp__": "bytes", "v": "AAAA"}
    assert serde.decode(serde.encode(value)) == value


def test_unsupported_type_names_itself_and_the_fix() -> None:
    class Secret:
        pass

    with pytest.raises(SerializationError, match=r"Secret.*register_type"):
        serde.encode({"x": [Secret()]})


@dataclasses.dataclass
class Plan:
    steps: list[str]
    done: int = 0


class Color(enum.Enum):
    RED = "red"


def test_registered_types_round_trip_and_unregistered_are_refused_on_load() -> None:
    serde.register_type(Plan, "tests.Plan")
    serde.register_type(Color, "tests.Color")
    value = {"plan": Plan(["a"], 1), "c": Color.RED}
    assert serde.decode(serde.encode(value)) == value
    forged = b'{"x": {"__sp__": "obj", "type": "os.system", "v": {}}}'
    with pytest.raises(SerializationError, match="not registered"):
        serde.decode(forged)


def test_depth_limit_both_ways() -> None:
    deep: Any = []
    for _ in range(serde.MAX_DEPTH + 5):
        deep = [deep]
    with pytest.raises(SerializationError, match="deeper"):
        serde.encode(deep)
    with pytest.raises(SerializationError):
        serde.decode(b"[" * 5000 + b"]" * 5000)


@pytest.mark.parametrize(
    "data",
    [b"not json", b'{"__sp__": "nope", "v": 1}', b'{"__sp__": "bytes", "v": "***"}', b"\xff\xfe"],
)
def test_hostile_input_is_a_clear_error(data: bytes) -> None:
    with pytest.raises(SerializationError):
        serde.decode(data)


@pytest.mark.parametrize(
    "data",
    [
        b'{"__sp__": "timedelta", "v": [1000000000, 0, 0]}',  # OverflowError
        b'{"__sp__": "timedelta", "v": [1e300, 0, 0]}',
        b'{"__sp__": "timedelta", "v": [0, 0, 100000000000000000000]}',
        b'{"__sp__": "timedelta", "v": ""}',  # IndexError
        b'{"__sp__": "timedelta", "v": []}',
        b'{"__sp__": "datetime", "v": "99999-01-01T00:00:00"}',
        b'{"__sp__": "date", "v": "0000-01-01"}',
        b'{"__sp__": "decimal", "v": "1e1e1"}',
        b'{"__sp__": "int", "v": "' + b"9" * 50_000 + b'"}',
        b'"caf\xa1"',  # invalid UTF-8 in a string: UnicodeDecodeError
        b'{"k\xe9y": 1}',
    ],
)
def test_out_of_range_or_invalid_tagged_values_are_a_clear_error(data: bytes) -> None:
    """Values out of a type's range (a bundle can carry any bytes) raise SerializationError,
    never OverflowError, IndexError or UnicodeDecodeError."""
    with pytest.raises(SerializationError):
        serde.decode(data)
