"""TLC's printed value syntax parses to the right Python values, and back.

Under test: ``toolledger.check.tlavalues``. Oracles: the value forms TLC 2.15
actually prints (the verbatim texts below were copied from TLC runs, including
its line-wrapped pretty-printing), TLA+ equality (a record equals the function
with the same graph; a function on ``1..n`` equals the tuple), and the round
trip ``parse(serialize(v)) == v`` over generated values.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Mapping

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolledger.check.tlavalues import (
    FnValue,
    ModelValue,
    StateParser,
    TLAParseError,
    Value,
    dot_unescape,
    parse_state,
    parse_value,
    pretty,
    serialize,
)

# ---------------------------------------------------------------------------
# Every form TLC prints.


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0),
        ("42", 42),
        ("-1", -1),
        ("-123456789012345678901234567890", -123456789012345678901234567890),
        ("TRUE", True),
        ("FALSE", False),
        ('""', ""),
        ('"idle"', "idle"),
        (r'"a\"b\\c"', 'a"b\\c'),
        (r'"tab\there\nnl"', "tab\there\nnl"),
        (r'"\r\f"', "\r\f"),
        ('"a -> b, {c} /\\\\ d"', "a -> b, {c} /\\ d"),
        ("<<>>", ()),
        ("<< >>", ()),
        ("<<1>>", (1,)),
        ('<<1, "x", TRUE>>', (1, "x", True)),
        ('<<<<"dispatch", c1>>>>', (("dispatch", "c1"),)),
        ("{}", frozenset()),
        ("{1, 2, 3}", frozenset({1, 2, 3})),
        ("{{}, {{}}}", frozenset({frozenset(), frozenset({frozenset()})})),
        ("1..3", frozenset({1, 2, 3})),
        ("-1..1", frozenset({-1, 0, 1})),
        ("3..1", frozenset()),
        ("[a |-> 1]", FnValue({"a": 1})),
        ('[q |-> {}, r |-> <<>>, s |-> ""]', FnValue({"q": frozenset(), "r": (), "s": ""})),
        ("(p1 :> TRUE @@ p2 :> FALSE)", FnValue({"p1": True, "p2": False})),
        ('(0 :> "z" @@ 1 :> "o")', FnValue({0: "z", 1: "o"})),
        ("(<<1, 2>> :> 3 @@ <<0, 1>> :> 4)", FnValue({(1, 2): 3, (0, 1): 4})),
        (
            "[a |-> [b |-> (c :> <<{1}>>)]]",
            FnValue({"a": FnValue({"b": FnValue({"c": ((frozenset({1}),))})})}),
        ),
    ],
)
def test_each_value_form_parses(text: str, expected: Value) -> None:
    assert parse_value(text) == expected


def test_model_values_are_model_values_and_strings_are_not() -> None:
    v = parse_value('<<c1, "c1", 1a>>')
    assert isinstance(v, tuple)
    assert type(v[0]) is ModelValue and v[0] == "c1"
    assert type(v[1]) is str
    assert type(v[2]) is ModelValue and v[2] == "1a"
    assert serialize(v) == '<<c1, "c1", 1a>>'


def test_booleans_are_bools_and_integers_ints() -> None:
    v = parse_value("<<TRUE, 1, -0>>")
    assert isinstance(v, tuple)
    assert [type(x) for x in v] == [bool, int, int]


def test_record_keys_are_plain_strings_and_function_keys_keep_their_type() -> None:
    rec = parse_value("[a |-> 1]")
    fn = parse_value("(a :> 1)")
    assert isinstance(rec, FnValue) and isinstance(fn, FnValue)
    assert [type(k) for k in rec] == [str]
    assert [type(k) for k in fn] == [ModelValue]
    assert rec.is_record() and not fn.is_record()


def test_whitespace_and_tlc_line_wrapping_are_ignored() -> None:
    # Verbatim from TLC 2.15 (the "d" variable of a 25-entry sequence, wrapped)
    text = """<< [id |-> 1, name |-> "name", procs |-> {p1, p2}, st |-> <<1, {1}>>],
   [id |-> 2, name |-> "name", procs |-> {p1, p2}, st |-> <<2, {2}>>] >>"""
    v = parse_value(text)
    assert v == (
        FnValue(
            {"id": 1, "name": "name", "procs": frozenset({"p1", "p2"}), "st": (1, frozenset({1}))}
        ),
        FnValue(
            {"id": 2, "name": "name", "procs": frozenset({"p1", "p2"}), "st": (2, frozenset({2}))}
        ),
    )


# ---------------------------------------------------------------------------
# FnValue: TLA+ function equality, hashing, immutability.


def test_record_equals_function_with_same_graph() -> None:
    rec = parse_value("[a |-> 1, b |-> 2]")
    fn = parse_value('("b" :> 2 @@ "a" :> 1)')
    assert rec == fn
    assert hash(rec) == hash(fn)
    assert len({rec, fn}) == 1


def test_function_on_1_to_n_equals_the_tuple() -> None:
    fn = parse_value('(2 :> "b" @@ 1 :> "a")')
    assert fn == ("a", "b")
    assert operator.eq(("a", "b"), fn)  # tuple.__eq__ defers to FnValue.__eq__
    assert hash(fn) == hash(("a", "b"))
    assert FnValue({}) == ()
    assert parse_value("(1 :> 5 @@ 3 :> 6)") != (5, 6)


def test_fnvalue_differs_when_any_entry_differs() -> None:
    assert FnValue({"a": 1}) != FnValue({"a": 2})
    assert FnValue({"a": 1}) != FnValue({"a": 1, "b": 1})
    assert FnValue({"a": 1}) != 1
    assert FnValue({"a": 1}) == {"a": 1}  # any Mapping with the same items


def test_fnvalue_is_an_immutable_mapping() -> None:
    fn = FnValue({"a": 1, "b": 2})
    assert isinstance(fn, Mapping)
    assert list(fn) == ["a", "b"]
    assert dict(fn.items()) == {"a": 1, "b": 2}
    assert "a" in fn and "z" not in fn and [] not in fn
    with pytest.raises(TypeError):
        fn["a"] = 3  # type: ignore[index]
    with pytest.raises(AttributeError):
        fn.x = 1  # type: ignore[attr-defined]


def test_model_value_indexing_with_plain_strings() -> None:
    status = parse_value('(c1 :> "idle" @@ c2 :> "done")')
    assert isinstance(status, FnValue)
    assert status["c2"] == "done"
    assert repr(ModelValue("c1")) == "ModelValue('c1')"


# ---------------------------------------------------------------------------
# States.

TLC_STATE = r"""/\ status = (c1 :> "dispatched" @@ c2 :> "idle")
/\ ledger = ( c1 :> [attempts |-> 1, result |-> {}] @@
  c2 :> [attempts |-> 0, result |-> {}] )
/\ log = <<<<"dispatch", c1>>>>
/\ up = TRUE
"""


def test_parse_state_block() -> None:
    state = parse_state(TLC_STATE)
    assert list(state) == ["status", "ledger", "log", "up"]
    assert state["status"] == {"c1": "dispatched", "c2": "idle"}
    ledger = state["ledger"]
    assert isinstance(ledger, FnValue)
    assert ledger["c1"] == {"attempts": 1, "result": frozenset()}
    assert state["log"] == (("dispatch", "c1"),)
    assert state["up"] is True


def test_parse_single_variable_state() -> None:
    assert parse_state("x = 0\n") == {"x": 0}
    assert parse_state("x = <<1,\n   2>>") == {"x": (1, 2)}


def test_state_parser_shares_values_between_states() -> None:
    p = StateParser()
    s1 = p.parse_state('/\\ x = [a |-> 1]\n/\\ y = "big"')
    s2 = p.parse_state('/\\ x = [a |-> 2]\n/\\ y = "big"')
    assert s1["y"] is s2["y"]
    assert s1["x"] != s2["x"]
    assert (p.hits, p.misses) == (1, 3)


def test_parse_dot_label_unescapes_only_what_dot_escaped() -> None:
    # Verbatim node label text from a TLC 2.15 -dump dot file
    label = r"/\\ s = \"a\\\"b\\\\c\"\n/\\ t = {<<1, TRUE>>}\n/\\ x = -1"
    assert StateParser().parse_dot_label(label) == {
        "s": 'a"b\\c',
        "t": frozenset({(1, True)}),
        "x": -1,
    }
    assert StateParser().parse_dot_label("x = 0") == {"x": 0}
    assert dot_unescape(r"a\\b\"c\nd") == 'a\\b"c\nd'


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty text"),
        ("   \n", "empty text"),
        ("/\\ x = 1\n/\\ x = 2", "variable 'x' appears twice"),
        ("/\\ x 1", "expected 'variable = value'"),
        ("/\\ x = <<1", "in the value of variable 'x': unexpected end of text inside sequence"),
    ],
)
def test_malformed_state_is_rejected(text: str, message: str) -> None:
    with pytest.raises(TLAParseError, match=re.escape(message)):
        parse_state(text)


# ---------------------------------------------------------------------------
# Malformed values: a clear message with the offset of the problem.


@pytest.mark.parametrize(
    ("text", "message", "offset"),
    [
        ("", "expected a TLA+ value, got empty text", None),
        ("<<1, 2", "unexpected end of text inside sequence <<...>>", 6),
        ("<<1 2>>", "expected ',' or '>>' in sequence", 4),
        ("{1 2}", "expected ',' or '}' in set", 3),
        ("[a |-> 1,]", "expected 'field |->' in record", 9),
        ("[1 |-> 2]", "expected 'field |->' after '['", 1),
        ("[a |-> 1 b |-> 2]", "expected ',' or ']' in record", 9),
        ("(a :> 1 b)", "expected '@@' or ')' in function", 8),
        ("(a 1)", "expected ':>' after a function key", 3),
        ('"abc', "unterminated string", 0),
        ("1 2", "unexpected '2' after a complete value", 2),
        ("-", "unexpected '-': expected a value", 0),
        ("<<1>> >>", "unexpected '>>' after a complete value", 6),
        ("1..", "expected an integer after '..'", 3),
        ("x + 1", "unexpected '+' after a complete value", 2),
        ("#", "unexpected '#': expected a value", 0),
        (r'"\q"', r"unknown escape \q in string", None),
    ],
)
def test_malformed_value_is_rejected_with_position(
    text: str, message: str, offset: int | None
) -> None:
    with pytest.raises(TLAParseError) as err:
        parse_value(text)
    assert message in str(err.value)
    if offset is not None:
        assert f"at offset {offset}:" in str(err.value)
        # the caret line points at the offending offset in the quoted snippet
        lines = str(err.value).splitlines()
        assert lines[-1].index("^") - 2 == offset


def test_parse_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        parse_value("<<")


# ---------------------------------------------------------------------------
# Serializer.


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (True, "TRUE"),
        (False, "FALSE"),
        (-7, "-7"),
        ('a"b\\c\n\t', r'"a\"b\\c\n\t"'),
        (ModelValue("c1"), "c1"),
        ((), "<<>>"),
        ((1, "x"), '<<1, "x">>'),
        ([1, 2], "<<1, 2>>"),
        (frozenset({3, 1, 2}), "{1, 2, 3}"),
        ({"b", "a"}, '{"a", "b"}'),
        (FnValue({"a": 1, "b": frozenset()}), "[a |-> 1, b |-> {}]"),
        (FnValue({ModelValue("c2"): 1, ModelValue("c1"): 2}), "(c1 :> 2 @@ c2 :> 1)"),
        (FnValue({"not an identifier": 1}), '("not an identifier" :> 1)'),
        (FnValue({"TRUE": 1}), '("TRUE" :> 1)'),
        (FnValue({2: "b", 1: "a"}), '<<"a", "b">>'),
        (FnValue({}), "<<>>"),
        ({0: 1}, "(0 :> 1)"),
    ],
)
def test_serialize(value: object, text: str) -> None:
    assert serialize(value) == text


def test_serialize_rejects_what_tla_cannot_express() -> None:
    with pytest.raises(ValueError, match="not a TLA\\+ identifier"):
        serialize(ModelValue("not ok"))
    with pytest.raises(ValueError, match="not a TLA\\+ identifier"):
        serialize(ModelValue("TRUE"))
    with pytest.raises(TypeError, match="cannot write a float"):
        serialize(1.5)
    with pytest.raises(TypeError, match="cannot write a NoneType"):
        serialize((1, None))


def test_serialize_is_canonical_for_equal_values() -> None:
    a = FnValue({ModelValue("c1"): frozenset({3, 1}), ModelValue("c2"): ()})
    b = FnValue({ModelValue("c2"): (), ModelValue("c1"): frozenset({1, 3})})
    assert serialize(a) == serialize(b) == "(c1 :> {1, 3} @@ c2 :> <<>>)"


# ---------------------------------------------------------------------------
# Round trips over generated values.

_identifiers = st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True)
_scalars: st.SearchStrategy[Value] = st.one_of(
    st.integers(min_value=-(10**20), max_value=10**20),
    st.booleans(),
    st.text(max_size=8),
    st.text(alphabet='"\\\n\t\r\fab /', max_size=8),
    _identifiers.map(ModelValue),
)


def _composites(inner: st.SearchStrategy[Value]) -> st.SearchStrategy[Value]:
    return st.one_of(
        st.lists(inner, max_size=4).map(tuple),
        st.frozensets(inner, max_size=4),
        st.dictionaries(_identifiers, inner, min_size=1, max_size=4).map(FnValue),  # records
        st.dictionaries(inner, inner, min_size=1, max_size=4).map(FnValue),  # functions
    )


values: st.SearchStrategy[Value] = st.recursive(_scalars, _composites, max_leaves=12)


@given(values)
def test_round_trip_parse_serialize(v: Value) -> None:
    text = serialize(v)
    back = parse_value(text)
    assert back == v
    assert serialize(back) == text  # canonical text is stable


@given(values, st.integers(min_value=10, max_value=60))
def test_round_trip_pretty(v: Value, width: int) -> None:
    assert parse_value(pretty(v, width=width)) == v


def _tlc_state_text(state: dict[str, Value]) -> str:
    return "\n".join(f"/\\ {k} = {pretty(v, width=40)}" for k, v in state.items())


def _dot_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@given(st.dictionaries(_identifiers, values, min_size=1, max_size=5))
def test_round_trip_state_and_dot_label(state: dict[str, Value]) -> None:
    text = _tlc_state_text(state)
    assert parse_state(text) == state
    parser = StateParser()
    assert parser.parse_dot_label(_dot_escape(text)) == state
    assert parser.parse_dot_label(_dot_escape(text)) == state  # second time from the cache
    assert parser.hits == len(state)
