"""JSON text in and out, fast, with json's answers: the API server's reviews and answers are parsed here (admission's
bodies, the notary's API reads and its namespaces' pod lists and watch events), and admission's answers written.

One home, so that every reader keeps json.loads' answer (integers beyond 64 bits stay ints) while the common case
costs orjson's time: a 10,000-pod list is megabytes, decoded on a thread that shares the event loop's GIL.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

# Every byte a digit -> b"0", every other byte -> b" ": a run of 19 zeros in the translation is a run of 19 digits.
_DIGITS = bytes(ord("0") if chr(b).isdigit() and b < 128 else ord(" ") for b in range(256))
_LONG_NUMBER = b"0" * 19
_NUMBER_BYTES = frozenset(b"0123456789.eE+-")
_WHITESPACE = frozenset(b" \t\r\n")
_BEFORE_A_VALUE = frozenset(b":[,")


def parse_body(raw: bytes) -> Any:
    """JSON text (bytes) as json.loads parses it, in about a third of its time (orjson: ~4 of a pod review's ~12 us).

    orjson would turn an integer of more than 64 bits into a float (json.loads keeps it an int), so a body that may
    hold a number with a run of 19 or more digits (the longest integer orjson keeps exact for both signs has 19) is
    parsed by json.loads (`may_hold_a_long_number`); so is whatever orjson refuses and json.loads may accept (NaN,
    Infinity, lone surrogates, UTF-16/32 or a BOM, nesting past orjson's 1,024 levels): json.loads then answers as
    it always did, its JSONDecodeError or RecursionError included."""
    if may_hold_a_long_number(raw):
        return json.loads(raw)
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)


def may_hold_a_long_number(raw: bytes) -> bool:
    """Whether some run of 19 or more digits in `raw` could be part of a JSON number: the characters a number is
    made of ([0-9.eE+-]) back from the run, then any whitespace, start the text or follow a `:`, `[` or `,`. A run
    inside a string whose characters before it say otherwise (a hex digest's, most often: a 64-hex-digit HMAC has
    such a run once in ~170, so every large pod list had several, and was parsed by json.loads at three times
    orjson's CPU) does not count; one that only looks like a number (`"x: 1234...`) does, which costs time, never
    a wrong answer."""
    digits = raw.translate(_DIGITS)
    at = digits.find(_LONG_NUMBER)
    while at >= 0:
        start = at
        while start > 0 and raw[start - 1] in _NUMBER_BYTES:
            start -= 1
        while start > 0 and raw[start - 1] in _WHITESPACE:
            start -= 1
        if start == 0 or raw[start - 1] in _BEFORE_A_VALUE:
            return True
        end = digits.find(b" ", at)
        if end < 0:
            return False
        at = digits.find(_LONG_NUMBER, end)
    return False


def json_bytes(value: Any) -> bytes:
    """JSON text of a parsed document: orjson (about 8x faster than json.dumps on a patch), and json.dumps for
    what orjson refuses and json.loads accepts (integers beyond 64 bits, lone surrogates). Only NaN and
    Infinity would change (to null); no API server sends them (Go's encoding/json cannot). Bodies are parsed by
    `parse_body`, which keeps json.loads' answer."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return json.dumps(value).encode()
