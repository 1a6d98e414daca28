"""The hot-path JSON codec means what the standard library means, including what orjson refuses."""

from __future__ import annotations

import json

import pytest

from polar_env import fastjson


@pytest.mark.parametrize(
    "value",
    [
        {"n": 2**70},  # a tool argument the model sampled past 64 bits
        {"s": "\ud800"},  # a lone surrogate a client sent escaped
        {"ids": [1, 2, 3], "text": "é"},
    ],
)
def test_dumps_round_trips_what_loads_reads(value):
    encoded = fastjson.dumps(value)
    assert isinstance(encoded, bytes)
    assert fastjson.loads(encoded) == value == json.loads(encoded)


def test_loads_keeps_the_standard_librarys_error_for_bad_json():
    with pytest.raises(json.JSONDecodeError):
        fastjson.loads(b"{not json")


def test_a_jsonl_line_of_a_row_orjson_refuses_is_still_one_line():
    from polar_env.trajectory.export import jsonl_line

    line = jsonl_line({"content": "\ud800", "ids": [1, 2]})
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert json.loads(line) == {"content": "\ud800", "ids": [1, 2]}
    assert jsonl_line({"ids": [1, 2]}) == b'{"ids":[1,2]}\n'
