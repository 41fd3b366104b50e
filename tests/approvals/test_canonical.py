"""Canonical actions: one digest per action however it is spelled, a new digest for any change.

Fixed vectors pin the RFC 8785 details (key order by UTF-16 code units, string and number
spelling) and one known refund digest, so that a library upgrade cannot silently change
what approvals are bound to.
"""

from __future__ import annotations

import copy
import hashlib
import json
import random
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from approvals.canonical.form import canonicalize, pretty
from approvals.canonical.parsing import MAX_DEPTH, MAX_SAFE_INTEGER, parse_json
from approvals.errors import InputError
from tests.conftest import REFUND_ARGS

# --- strategies -------------------------------------------------------------------------

# What the strict parser admits: no lone surrogates (category Cs) and no NUL.
texts = st.text(
    alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=12
)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-MAX_SAFE_INTEGER, MAX_SAFE_INTEGER)
    | st.sampled_from([0, 1, -1, MAX_SAFE_INTEGER, -MAX_SAFE_INTEGER])
    | texts
)
values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(texts, children, max_size=4),
    max_leaves=25,
)
arguments = st.dictionaries(texts, values, max_size=6)

PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth(v) for v in value), default=0)
    return 0


def shuffled(value: Any, rng: random.Random) -> Any:
    """The same JSON value with every object's keys in a random insertion order."""
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: shuffled(v, rng) for k, v in items}
    if isinstance(value, list):
        return [shuffled(v, rng) for v in value]
    return value


Path = tuple[str | int, ...]


def leaf_paths(value: Any, path: Path = ()) -> Iterator[Path]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from leaf_paths(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from leaf_paths(item, (*path, index))
    else:
        yield path


def get_at(value: Any, path: Path) -> Any:
    for step in path:
        value = value[step]
    return value


def set_at(value: Any, path: Path, new: Any) -> Any:
    changed = copy.deepcopy(value)
    parent = get_at(changed, path[:-1])
    parent[path[-1]] = new
    return changed


def same_json(a: Any, b: Any) -> bool:
    # True == 1 in Python, but true and 1 are different JSON values.
    return type(a) is type(b) and a == b


def compact(text: str) -> str:
    """Drop the whitespace between JSON tokens, keeping every character inside strings."""
    out: list[str] = []
    in_string = escaped = False
    for char in text:
        if in_string:
            out.append(char)
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
            out.append(char)
        elif char not in " \t\r\n":
            out.append(char)
    return "".join(out)


# --- properties ------------------------------------------------------------------------


@PROPERTY
@given(
    args=arguments,
    seed=st.integers(),
    indent=st.none() | st.integers(0, 6) | st.sampled_from(["\t", " \n "]),
    separators=st.sampled_from([(",", ":"), (", ", ": "), (" ,", " :\t"), (",\r\n", ":  ")]),
    ensure_ascii=st.booleans(),
    padding=st.tuples(st.text(" \t\r\n", max_size=3), st.text(" \t\r\n", max_size=3)),
)
def test_key_order_and_whitespace_never_change_the_digest(
    args: dict[str, Any],
    seed: int,
    indent: int | str | None,
    separators: tuple[str, str],
    ensure_ascii: bool,
    padding: tuple[str, str],
) -> None:
    assume(depth(args) < MAX_DEPTH - 1)
    reordered = shuffled(args, random.Random(seed))
    text = json.dumps(
        {"tool": "issue_refund", "arguments": reordered, "run_id": "r"},
        indent=indent,
        separators=separators,
        ensure_ascii=ensure_ascii,
    )

    parsed = parse_json((padding[0] + text + padding[1]).encode())

    assert parsed["arguments"] == args
    assert canonicalize("issue_refund", parsed["arguments"]) == canonicalize("issue_refund", args)


@PROPERTY
@given(args=arguments, data=st.data())
def test_changing_any_single_leaf_changes_the_digest(
    args: dict[str, Any], data: st.DataObject
) -> None:
    paths = list(leaf_paths(args))
    assume(paths)
    path = data.draw(st.sampled_from(paths))
    old = get_at(args, path)
    new = data.draw(scalars.filter(lambda v: not same_json(v, old)))

    changed = set_at(args, path, new)

    assert canonicalize("t", changed).digest != canonicalize("t", args).digest


@PROPERTY
@given(args=arguments, tool=st.sampled_from(["issue_refund", "send_message"]))
def test_digest_is_the_sha256_of_the_canonical_text(args: dict[str, Any], tool: str) -> None:
    action = canonicalize(tool, args)

    assert action.digest == hashlib.sha256(action.canonical.encode()).hexdigest()
    assert json.loads(action.canonical) == {"arguments": args, "tool": tool}
    assert compact(action.canonical) == action.canonical


@PROPERTY
@given(args=arguments, tool=st.text(min_size=1, max_size=5))
def test_changing_the_tool_changes_the_digest(args: dict[str, Any], tool: str) -> None:
    assume(tool != "issue_refund" and "\x00" not in tool)
    assume(not any(0xD800 <= ord(c) <= 0xDFFF for c in tool))

    assert canonicalize(tool, args).digest != canonicalize("issue_refund", args).digest


@PROPERTY
@given(
    args=st.dictionaries(
        texts,
        st.recursive(
            scalars | st.floats(allow_nan=False, allow_infinity=False),
            lambda c: st.lists(c, max_size=3) | st.dictionaries(texts, c, max_size=3),
            max_leaves=15,
        ),
        max_size=5,
    )
)
def test_pretty_adds_only_whitespace_to_the_canonical_text(args: dict[str, Any]) -> None:
    canonical = canonicalize("t", args).canonical

    assert compact(pretty(canonical)) == canonical


# --- fixed vectors ----------------------------------------------------------------------


def test_known_refund_has_a_known_canonical_text_and_digest() -> None:
    expected = (
        '{"arguments":{"amount_minor":8000,"currency":"EUR","payment_id":"pay_123",'
        '"reason":"Damaged parcel"},"tool":"issue_refund"}'
    )
    digest = "a4ab6ed01fc5ed1e745a75627efb5536902a6cca7fcdc98063472c06bae8b044"

    action = canonicalize("issue_refund", REFUND_ARGS)

    assert action.canonical == expected
    assert action.digest == digest == hashlib.sha256(expected.encode()).hexdigest()


def test_keys_sort_by_utf16_code_units_as_in_rfc_8785() -> None:
    # RFC 8785 section 3.2.3. The emoji (U+1F600, UTF-16 D83D DE00) sorts before
    # U+FB33 by UTF-16 code units, though after it by code point.
    keys = {
        "\u20ac": "Euro Sign",
        "\r": "Carriage Return",
        "\ufb33": "Hebrew Letter Dalet With Dagesh",
        "1": "One",
        "\U0001f600": "Emoji: Grinning Face",
        "\u0080": "Control",
        "\u00f6": "Latin Small Letter O With Diaeresis",
    }

    canonical = canonicalize("t", keys).canonical

    assert list(json.loads(canonical)["arguments"]) == [
        "\r",
        "1",
        "\u0080",
        "\u00f6",
        "\u20ac",
        "\U0001f600",
        "\ufb33",
    ]
    assert canonical == (
        '{"arguments":{"\\r":"Carriage Return","1":"One","\u0080":"Control",'
        '"\u00f6":"Latin Small Letter O With Diaeresis","\u20ac":"Euro Sign",'
        '"\U0001f600":"Emoji: Grinning Face","\ufb33":"Hebrew Letter Dalet With Dagesh"},'
        '"tool":"t"}'
    )


def test_keys_sort_by_code_unit_not_by_case_or_length() -> None:
    canonical = canonicalize("t", {"b": 1, "a": 2, "B": 3, "aa": 4, "": 5}).canonical

    assert canonical == '{"arguments":{"":5,"B":3,"a":2,"aa":4,"b":1},"tool":"t"}'


@pytest.mark.parametrize(
    ("value", "spelled"),
    [
        ("\u0000\u001f", '"\\u0000\\u001f"'),
        ('\n\t"\\/', '"\\n\\t\\"\\\\/"'),
        ("\u00e9\u2028", '"\u00e9\u2028"'),
        (1e21, "1e+21"),
        (1e-7, "1e-7"),
        (-0.0, "0"),
        (0.1, "0.1"),
        (MAX_SAFE_INTEGER, "9007199254740991"),
        (True, "true"),
        (None, "null"),
    ],
)
def test_leaves_are_spelled_as_rfc_8785_says(value: Any, spelled: str) -> None:
    expected = '{"arguments":{"v":' + spelled + '},"tool":"t"}'

    assert canonicalize("t", {"v": value}).canonical == expected


def test_unicode_is_not_normalized_so_lookalikes_get_different_digests() -> None:
    composed = canonicalize("t", {"name": "Ren\u00e9"})
    decomposed = canonicalize("t", {"name": "Rene\u0301"})

    assert composed.digest != decomposed.digest


def test_integers_beyond_2_53_cannot_be_canonicalized() -> None:
    with pytest.raises(InputError) as caught:
        canonicalize("t", {"n": MAX_SAFE_INTEGER + 1})

    assert caught.value.code == "integer_out_of_range"


def test_canonicalize_refuses_deep_nesting_instead_of_overflowing_the_stack() -> None:
    deep: list[Any] = []
    for _ in range(5000):
        deep = [deep]

    with pytest.raises(InputError) as caught:
        canonicalize("t", {"deep": deep})

    assert caught.value.code == "nested_too_deeply"


def test_pretty_keeps_the_canonical_spelling_of_numbers() -> None:
    canonical = canonicalize("t", {"small": 1e-7, "big": 1e21, "list": [1e16, {"k": []}]}).canonical

    assert pretty(canonical) == (
        "{\n"
        '  "arguments": {\n'
        '    "big": 1e+21,\n'
        '    "list": [\n'
        "      10000000000000000,\n"
        "      {\n"
        '        "k": []\n'
        "      }\n"
        "    ],\n"
        '    "small": 1e-7\n'
        "  },\n"
        '  "tool": "t"\n'
        "}"
    )


# --- the strict parser ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "code", "field"),
    [
        (b'{"a": [{"b": 1, "b": 2}]}', "duplicate_key", "a[0].b"),
        (b'{"a": {"b": [1, NaN]}}', "non_finite_number", "a.b[1]"),
        (b'{"a": -Infinity}', "non_finite_number", "a"),
        (b'{"a": [9007199254740992]}', "integer_out_of_range", "a[0]"),
        (b'{"a": -9007199254740992}', "integer_out_of_range", "a"),
        (b'{"a": "\\udc00"}', "lone_surrogate", "a"),
        (b'{"\\ud800x": 1}', "lone_surrogate", "\\ud800x"),
        (b'{"a": ["\\u0000"]}', "nul_character", "a[0]"),
        (b"NaN", "non_finite_number", None),
        (b"[1,]", "invalid_json", None),
        (b"", "invalid_json", None),
        (b"\xff", "invalid_encoding", None),
    ],
)
def test_parse_json_refusals_name_their_code_and_field(
    raw: bytes, code: str, field: str | None
) -> None:
    with pytest.raises(InputError) as caught:
        parse_json(raw)

    assert (caught.value.code, caught.value.field) == (code, field)


def test_parse_json_accepts_the_integer_bounds() -> None:
    raw = b'{"max": 9007199254740991, "min": -9007199254740991}'

    assert parse_json(raw) == {"max": MAX_SAFE_INTEGER, "min": -MAX_SAFE_INTEGER}


def test_parse_json_accepts_max_depth_and_refuses_one_more() -> None:
    at_limit = b"[" * MAX_DEPTH + b"]" * MAX_DEPTH
    over = b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1)

    assert depth(parse_json(at_limit)) == MAX_DEPTH
    with pytest.raises(InputError) as caught:
        parse_json(over)
    assert caught.value.code == "nested_too_deeply"


def test_parse_json_returns_plain_dicts_and_keeps_valid_escapes() -> None:
    parsed = parse_json(b'{"k": {"emoji": "\\ud83d\\ude00", "x": 1.5}}')

    assert type(parsed) is dict
    assert type(parsed["k"]) is dict
    assert parsed == {"k": {"emoji": "\U0001f600", "x": 1.5}}
