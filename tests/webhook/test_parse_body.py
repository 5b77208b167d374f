"""`jsontext.parse_body` answers what json.loads answers (types included: 1, 1.0 and True stay apart), for any JSON
document and for the inputs where orjson alone would differ: integers beyond 64 bits, NaN and Infinity, lone
surrogates, other encodings and a BOM, and bodies that are not JSON (the same exception type)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainhook.webhook.admission.jsondiff import same
from trainhook.webhook.admission.jsontext import may_hold_a_long_number, parse_body

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2 ** 70), max_value=2 ** 70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5),
    max_leaves=30)


@settings(max_examples=400, deadline=None)
@given(JSON)
def test_any_json_document_parses_as_json_loads_parses_it(value):
    raw = json.dumps(value).encode()
    assert same(parse_body(raw), json.loads(raw))


@pytest.mark.parametrize("raw", [
    b'{"a": 18446744073709551616}', b'{"a": -9223372036854775809}', b'{"a": 9223372036854775807}',
    b'{"a": [1, {"b": 123456789012345678901234567890}]}', b'{"name": "1234567890123456789"}',
    b'{"a": 1.0, "b": 1, "c": true, "d": -0.0, "e": 1e5}', b'{"a": 1, "a": 2}',
    b'{"a": "\\ud800"}', b'\xef\xbb\xbf{"a": 1}', '{"a": 1}'.encode("utf-16"), b'  [1, 2]  ',
])
def test_the_inputs_where_orjson_alone_differs_parse_as_json_loads_parses_them(raw):
    assert same(parse_body(raw), json.loads(raw))


def test_nan_and_infinity_parse_as_json_loads_parses_them():
    assert json.dumps(parse_body(b'[NaN, Infinity, -Infinity, 1e400]')) == json.dumps(
        json.loads(b'[NaN, Infinity, -Infinity, 1e400]'))


@pytest.mark.parametrize("raw", [b"", b"{", b'{"a": }', b"\xff\xfe\xfa", b'{"a": 1} x', b"[" * 5000 + b"]" * 5000])
def test_what_is_not_json_raises_what_json_loads_raises(raw):
    with pytest.raises(Exception) as expected:
        json.loads(raw)
    with pytest.raises(type(expected.value)):
        parse_body(raw)


# Strings full of digit runs (hex digests, digits after separators) beside integers beyond 64 bits.
DIGITY = st.recursive(
    st.integers(min_value=-(2 ** 80), max_value=2 ** 80) | st.text(alphabet="0123456789abcdef :,[-.e", max_size=70),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=4), children, max_size=4),
    max_leaves=12)


@settings(max_examples=400, deadline=None)
@given(DIGITY, st.sampled_from([None, 0, 2]))
def test_documents_with_digit_runs_in_strings_and_numbers_parse_as_json_loads_parses_them(value, indent):
    raw = json.dumps(value, indent=indent).encode()
    assert same(parse_body(raw), json.loads(raw))


@pytest.mark.parametrize("raw", [
    b'{"p": "v1 973d44309863303bf347213684885692161429e08282aee10213fb846e6f42dc"}',
    b'{"p": "1234567890123456789012"}', b'{"p": "abc1234567890123456789012"}', b'["x", "a-1234567890123456789012"]',
])
def test_a_digit_run_that_cannot_be_a_number_takes_the_fast_path(raw):
    """A pod list holds hundreds of hex HMACs, some with 19 digits in a row: they must not send it to json.loads."""
    assert not may_hold_a_long_number(raw)
    assert same(parse_body(raw), json.loads(raw))


@pytest.mark.parametrize("raw", [
    b"12345678901234567890123", b"  -12345678901234567890123", b'[1, 12345678901234567890123]',
    b'{"a":\n  -12345678901234567890123}', b'[1.5e1234567890123456789]', b'[0.1234567890123456789012]',
    b'{"a": "x: 12345678901234567890"}', b'{"a": "12", "b": 1234567890123456789012}',
])
def test_a_digit_run_that_may_be_a_number_goes_to_json_loads(raw):
    assert may_hold_a_long_number(raw)
