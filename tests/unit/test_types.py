"""Struct layouts and per-version struct sizes against the tables measured with g++ on each CUPTI header."""

import ctypes
import json
from pathlib import Path

import pytest

from gpuscope.cupti import _types as T

LAYOUTS = json.loads((Path(__file__).parent / "data" / "cupti_layouts.json").read_text())
VERSIONS = [(12, 6), (12, 8), (12, 9), (13, 0), (13, 1), (13, 2), (13, 3), (13, 4), (13, 5)]


def _expected_size(table: dict, version) -> int | None:
    """The STRUCT_SIZE of the newest entry at or before *version*."""
    best = None
    for since, size in table.items():
        if tuple(int(x) for x in since.split(".")) <= version:
            best = size
    return best


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_offsets_and_sizeof(name):
    cls = getattr(T, name)
    expected = LAYOUTS[name]
    assert ctypes.sizeof(cls) == expected["sizeof"], name
    assert [f[0] for f in cls._fields_] == [row[3] for row in expected["fields"]]
    for off, size, _ctype, field, _since in expected["fields"]:
        desc = getattr(cls, field)
        assert (desc.offset, desc.size) == (off, size), f"{name}.{field}"


# every (struct, version) where the struct exists
SIZED = [
    (name, v, _expected_size(layout["struct_size"], v))
    for name, layout in sorted(LAYOUTS.items())
    for v in VERSIONS
    if _expected_size(layout["struct_size"], v) is not None
]


@pytest.mark.parametrize("name,version,expected", SIZED, ids=lambda x: "%d.%d" % x if isinstance(x, tuple) else None)
def test_struct_size_per_version(name, version, expected):
    assert getattr(T, name).struct_size(version) == expected


def test_new_sets_size_field():
    p = T.CUpti_Profiler_GetCounterAvailability_Params.new((12, 6), ctx=5)
    assert (p.structSize, p.ctx) == (40, 5)
    q = T.CUpti_PCSamplingGetDataParams.new((13, 1))
    assert q.size == 32


def test_struct_size_is_not_sizeof():
    # STRUCT_SIZE = offsetof(last) + sizeof(last): 41, while sizeof is 48 (tail padding).
    assert T.CUpti_RangeProfiler_Stop_Params.struct_size((13, 5)) == 41
    assert ctypes.sizeof(T.CUpti_RangeProfiler_Stop_Params) == 48
