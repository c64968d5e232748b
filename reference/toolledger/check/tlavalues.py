"""TLA+ values as TLC prints them, and back.

This module turns the value syntax that TLC 2.15 prints (in error traces, in
``-dump`` files and in ``-dump dot`` labels) into immutable, hashable Python
values, and turns such Python values back into TLA+ expression text.

TLA+ value          TLC prints                      Python value
------------------  ------------------------------  ------------------------
integer             ``-3``                          ``int``
Boolean             ``TRUE`` / ``FALSE``            ``bool``
string              ``"a\\"b"``                     ``str``
model value         ``c1``                          :class:`ModelValue`
sequence / tuple    ``<<1, 2>>`` / ``<< >>``        ``tuple``
set                 ``{1, 2}``                      ``frozenset``
interval            ``1..3``                        ``frozenset`` ({1, 2, 3})
record              ``[a |-> 1]``                   :class:`FnValue`
function            ``(c1 :> 1 @@ c2 :> 2)``        :class:`FnValue`

A record is a function whose domain is a set of strings, so ``[a |-> 1]`` and
``("a" :> 1)`` parse to equal :class:`FnValue` objects, as in TLA+. A function
whose domain is ``1..n`` is equal to (and hashes like) the ``tuple`` of its
values, as in TLA+; the empty function equals ``()``.

Two deliberate departures from TLA+ equality, both inherited from Python:
``True == 1`` and ``ModelValue("c1") == "c1"``. TLC never puts a Boolean and an
integer, or a string and a model value, in one set (it refuses to compare
them), so this never conflates two values of one TLC state; and it lets Python
code index a function over model values with plain strings (``f["c1"]``).

Parsing is built for volume: states are parsed by the hundred thousand from
dot dumps. :class:`StateParser` caches the parse of every ``var = value``
conjunct by its exact text (hash-consing), so the many states that share a
variable's value share one parse and one Python object.

This module must never evaluate TLA+ (no operators, no ``eval``), never
import anything outside the standard library, and never return a mutable
value from a parse: parsed values are shared between states through the cache.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, TypeAlias, Union

__all__ = [
    "FnValue",
    "ModelValue",
    "StateParser",
    "TLAParseError",
    "Value",
    "dot_unescape",
    "parse_state",
    "parse_value",
    "pretty",
    "serialize",
]


class ModelValue(str):
    """A TLC model value such as ``c1``: a ``str`` that serializes bare.

    It compares and hashes like the plain string of its name (see the module
    docstring for why); only :func:`serialize` tells the two apart.
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return f"ModelValue({str.__repr__(self)})"


Value: TypeAlias = Union[bool, int, str, tuple["Value", ...], frozenset["Value"], "FnValue"]


_NO_HASH = -1  # sentinel: hash not computed yet (a real hash of -1 is never returned by hash())


class FnValue(Mapping[Value, Value]):
    """An immutable, hashable TLA+ function or record.

    Iteration follows the order in which TLC printed the entries (or the order
    of the mapping it was built from); equality and hashing ignore order.
    Equal to any ``Mapping`` with the same items, and to the ``tuple`` of its
    values when its domain is ``1..n``.
    """

    __slots__ = ("_d", "_hash")

    _d: dict[Value, Value]
    _hash: int

    def __init__(self, items: Mapping[Any, Value] | Iterable[tuple[Value, Value]] = ()) -> None:
        # (Any keys: Mapping is invariant in its key type, so a dict[str, int]
        # would not be accepted as Mapping[Value, Value].)
        self._d = dict(items)
        self._hash = _NO_HASH

    def __getitem__(self, key: Value) -> Value:
        return self._d[key]

    def __iter__(self) -> Iterator[Value]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def __contains__(self, key: object) -> bool:
        try:
            return key in self._d
        except TypeError:  # unhashable key: certainly not in the domain
            return False

    def as_tuple(self) -> tuple[Value, ...] | None:
        """The values as a tuple if the domain is exactly ``1..n``, else ``None``."""
        d = self._d
        n = len(d)
        for i in range(1, n + 1):
            if i not in d:
                return None
        return tuple(d[i] for i in range(1, n + 1))

    def is_record(self) -> bool:
        """True if every key is a plain string that can be a record field name."""
        return bool(self._d) and all(_is_field_name(k) for k in self._d)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FnValue):
            return self._d == other._d
        if isinstance(other, tuple):
            return self.as_tuple() == other
        if isinstance(other, Mapping):
            return self._d == dict(other.items())
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self) -> int:
        h = self._hash
        if h == _NO_HASH:
            seq = self.as_tuple()
            h = hash(seq) if seq is not None else hash(frozenset(self._d.items()))
            self._hash = h
        return h

    def __repr__(self) -> str:
        return f"FnValue({self._d!r})"


class TLAParseError(ValueError):
    """Text that is not a TLA+ value or state as TLC prints them."""


# ----------------------------------------------------------------------------
# Tokenizer. One C-level findall per value; the parser then walks the list.
# Order matters: strings first (they may contain anything), then multi-char
# punctuation, identifiers (which may start with digits, e.g. ``1a``), ints.

_TOKEN_RE = re.compile(
    r'"(?:[^"\\]|\\.)*"'  # string (escapes are validated when decoded)
    r"|<<|>>|\|->|:>|@@|\.\."
    r"|[0-9]*[A-Za-z_][0-9A-Za-z_]*"  # identifier: TRUE, FALSE, model value, field
    r"|-?[0-9]+"  # integer
    r"|\S",  # anything else: a single character (punctuation or junk)
    re.DOTALL,
)

_STRING_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", '"': '"', "\\": "\\"}
_STRING_ESCAPE_RE = re.compile(r"\\(.)", re.DOTALL)


def _decode_escape(m: re.Match[str]) -> str:
    try:
        return _STRING_ESCAPES[m.group(1)]
    except KeyError:
        raise TLAParseError(
            f'unknown escape \\{m.group(1)} in string: TLC only writes \\" \\\\ \\n \\t \\r \\f'
        ) from None


def _decode_string(tok: str) -> str:
    body = tok[1:-1]
    if "\\" not in body:
        return body
    return _STRING_ESCAPE_RE.sub(_decode_escape, body)


_IDENT_RE = re.compile(r"[0-9]*[A-Za-z_][0-9A-Za-z_]*\Z")

# Words that cannot be model values or record field names in TLA+ text.
_RESERVED = frozenset(
    [
        "ASSUME",
        "ASSUMPTION",
        "AXIOM",
        "BOOLEAN",
        "CASE",
        "CHOOSE",
        "CONSTANT",
        "CONSTANTS",
        "DOMAIN",
        "ELSE",
        "ENABLED",
        "EXCEPT",
        "EXTENDS",
        "FALSE",
        "IF",
        "IN",
        "INSTANCE",
        "LET",
        "LOCAL",
        "MODULE",
        "OTHER",
        "SF_",
        "STRING",
        "SUBSET",
        "THEN",
        "THEOREM",
        "TRUE",
        "UNCHANGED",
        "UNION",
        "VARIABLE",
        "VARIABLES",
        "WF_",
        "WITH",
    ]
)


def _is_identifier(s: str) -> bool:
    return _IDENT_RE.match(s) is not None and s not in _RESERVED and not s.isdigit()


def _is_field_name(k: object) -> bool:
    return type(k) is str and _is_identifier(k)


# Frame kinds of the iterative parser.
_SEQ, _SET, _REC, _FN = 0, 1, 2, 3
_CLOSERS = (">>", "}", "]", ")")
_NAMES = ("sequence <<...>>", "set {...}", "record [...]", "function (... :> ...)")


class _Frame:
    """An open composite value: its kind, the elements so far, a pending key."""

    __slots__ = ("items", "key", "kind", "pairs")

    def __init__(self, kind: int, key: Value | None = None) -> None:
        self.kind = kind
        self.items: list[Value] = []  # sequence and set elements
        self.pairs: list[tuple[Value, Value]] = []  # record and function entries
        self.key = key  # record: current field; function: key awaiting ':>' value


def _describe(text: str, index: int, message: str) -> TLAParseError:
    """Build an error naming the offset of token ``index`` in ``text``."""
    spans = [m.start() for m in _TOKEN_RE.finditer(text)]
    offset = spans[index] if index < len(spans) else len(text)
    lo = max(0, offset - 30)
    prefix = "..." if lo else ""
    snippet = prefix + text[lo : offset + 30].replace("\n", " ")
    caret = " " * (offset - lo + len(prefix))
    return TLAParseError(f"{message} at offset {offset}:\n  {snippet}\n  {caret}^")


def _parse_tokens(toks: list[str], text: str) -> Value:
    """Parse one value spanning all of ``toks`` (the tokens of ``text``).

    Iterative (an explicit stack of open frames), so deep nesting cannot hit
    Python's recursion limit, and cheap per token.
    """
    n = len(toks)
    if n == 0:
        raise TLAParseError("expected a TLA+ value, got empty text")
    stack: list[_Frame] = []
    i = 0
    while True:
        # ---- one value, or the opening of a composite, starts at toks[i] ----
        if i >= n:
            raise _describe(text, i, "unexpected end of text: expected a value")
        t = toks[i]
        i += 1
        c = t[0]
        value: Value
        if c == '"':
            if len(t) == 1:
                raise _describe(text, i - 1, "unterminated string")
            value = _decode_string(t)
        elif "0" <= c <= "9" or (c == "-" and len(t) > 1):
            try:
                value = int(t)
            except ValueError:  # an identifier that starts with a digit, e.g. 1a
                value = ModelValue(t)
            else:
                if i < n and toks[i] == "..":
                    try:
                        hi = int(toks[i + 1])
                    except (IndexError, ValueError):
                        raise _describe(text, i + 1, "expected an integer after '..'") from None
                    value = frozenset(range(value, hi + 1))
                    i += 2
        elif t == "<<":
            if i < n and toks[i] == ">>":
                i += 1
                value = ()
            else:
                stack.append(_Frame(_SEQ))
                continue
        elif t == "{":
            if i < n and toks[i] == "}":
                i += 1
                value = frozenset()
            else:
                stack.append(_Frame(_SET))
                continue
        elif t == "[":
            if i + 1 < n and toks[i + 1] == "|->" and _IDENT_RE.match(toks[i]):
                stack.append(_Frame(_REC, toks[i]))
                i += 2
                continue
            raise _describe(text, i, "expected 'field |->' after '[' (records are [a |-> 1, ...])")
        elif t == "(":
            stack.append(_Frame(_FN))
            continue
        elif t == "TRUE":
            value = True
        elif t == "FALSE":
            value = False
        elif c == "_" or c.isalpha():
            value = ModelValue(t)
        else:
            raise _describe(text, i - 1, f"unexpected {t!r}: expected a value")

        # ---- hand the value to the enclosing frames; close what ends here ----
        while True:
            if not stack:
                if i != n:
                    raise _describe(text, i, f"unexpected {toks[i]!r} after a complete value")
                return value
            frame = stack[-1]
            kind = frame.kind
            if i >= n:
                raise _describe(text, i, f"unexpected end of text inside {_NAMES[kind]}")
            sep = toks[i]
            i += 1
            if kind <= _SET:
                frame.items.append(value)
                if sep == ",":
                    break
                if sep != _CLOSERS[kind]:
                    raise _describe(
                        text, i - 1, f"expected ',' or {_CLOSERS[kind]!r} in {_NAMES[kind]}"
                    )
                stack.pop()
                value = tuple(frame.items) if kind == _SEQ else frozenset(frame.items)
                continue
            if kind == _REC:
                frame.pairs.append((frame.key, value))  # type: ignore[arg-type]
                if sep == ",":
                    if i + 1 < n and toks[i + 1] == "|->" and _IDENT_RE.match(toks[i]):
                        frame.key = toks[i]
                        i += 2
                        break
                    raise _describe(text, i, "expected 'field |->' in record [...]")
                if sep != "]":
                    raise _describe(text, i - 1, "expected ',' or ']' in record [...]")
                stack.pop()
                value = FnValue(frame.pairs)
                continue
            # function: keys and values alternate; parsed values are never None
            if frame.key is None:
                if sep != ":>":
                    raise _describe(text, i - 1, "expected ':>' after a function key")
                frame.key = value
                break
            frame.pairs.append((frame.key, value))
            frame.key = None
            if sep == "@@":
                break
            if sep != ")":
                raise _describe(text, i - 1, "expected '@@' or ')' in function (... :> ...)")
            stack.pop()
            value = FnValue(frame.pairs)
            continue


def parse_value(text: str) -> Value:
    """Parse one TLA+ value as TLC prints it, e.g. ``[a |-> <<1, "x">>]``.

    Raises :class:`TLAParseError` (a ``ValueError``) with the offending offset
    if ``text`` is not exactly one value.
    """
    return _parse_tokens(_TOKEN_RE.findall(text), text)


# ----------------------------------------------------------------------------
# States.

_DOT_SEP = "\\n/\\\\ "  # "\n/\ " as escaped inside a dot label
_DOT_FIRST = "/\\\\ "  # "/\ " as escaped inside a dot label
_DOT_ESCAPE_RE = re.compile(r"\\(.)", re.DOTALL)


def _dot_unescape_char(m: re.Match[str]) -> str:
    ch = m.group(1)
    return "\n" if ch == "n" else ch


def dot_unescape(label: str) -> str:
    r"""Undo the escaping TLC applies to a dot label (``\\``, ``\"``, ``\n``)."""
    if "\\" not in label:
        return label
    return _DOT_ESCAPE_RE.sub(_dot_unescape_char, label)


class StateParser:
    """Parses TLC state blocks, caching each ``var = value`` conjunct.

    Keep one parser per batch of related states (one dump, one trace): the
    cache grows with the number of distinct conjunct texts and is released
    with the parser. ``hits``/``misses`` count cache use.
    """

    __slots__ = ("_cache", "_dot_cache", "hits", "misses")

    def __init__(self) -> None:
        self._cache: dict[str, tuple[str, Value]] = {}
        self._dot_cache: dict[str, tuple[str, Value]] = {}
        self.hits = 0
        self.misses = 0

    def _conjunct(self, conj: str) -> tuple[str, Value]:
        name, eq, rest = conj.partition("=")
        name = name.strip()
        if not eq or not _IDENT_RE.match(name):
            raise TLAParseError(f"expected 'variable = value', got {conj[:80]!r}")
        try:
            return name, parse_value(rest)
        except TLAParseError as e:
            raise TLAParseError(f"in the value of variable {name!r}: {e}") from None

    def parse_state(self, text: str) -> dict[str, Value]:
        r"""Parse a state block: ``/\ x = 1`` lines, or one ``x = 1`` line."""
        text = text.strip()
        if not text:
            raise TLAParseError("expected a state ('/\\ var = value' lines), got empty text")
        cache = self._cache
        parts = text[2:].split("\n/\\") if text.startswith("/\\") else [text]
        state: dict[str, Value] = {}
        for part in parts:
            hit = cache.get(part)
            if hit is None:
                self.misses += 1
                hit = self._conjunct(part)
                cache[part] = hit
            else:
                self.hits += 1
            if hit[0] in state:
                raise TLAParseError(f"variable {hit[0]!r} appears twice in one state")
            state[hit[0]] = hit[1]
        return state

    def parse_dot_label(self, label: str) -> dict[str, Value]:
        r"""Parse a state from the still-escaped text of a TLC dot node label.

        The conjuncts are split and looked up in the cache *before*
        unescaping; only cache misses pay for unescaping and parsing.
        """
        parts = (
            label[len(_DOT_FIRST) :].split(_DOT_SEP) if label.startswith(_DOT_FIRST) else [label]
        )
        cache = self._dot_cache
        get = cache.get
        state: dict[str, Value] = {}
        misses = 0
        for part in parts:
            hit = get(part)
            if hit is None:
                misses += 1
                hit = cache[part] = self._conjunct(dot_unescape(part))
            state[hit[0]] = hit[1]
        self.misses += misses
        self.hits += len(parts) - misses
        if len(state) != len(parts):
            raise TLAParseError(f"a variable appears twice in dot label {label[:80]!r}")
        return state


def parse_state(text: str) -> dict[str, Value]:
    r"""Parse one state as TLC prints it (``/\ var = value`` lines) into a dict."""
    return StateParser().parse_state(text)


# ----------------------------------------------------------------------------
# Serializer.

_STRING_OUT = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r", "\f": "\\f"}
_STRING_OUT_RE = re.compile(r'[\\"\n\t\r\f]')


def _quote(s: str) -> str:
    return '"' + _STRING_OUT_RE.sub(lambda m: _STRING_OUT[m.group(0)], s) + '"'


def _sort_key(v: object) -> tuple[int, object]:
    # Deterministic order for set elements and function keys: by kind, then
    # naturally for scalars and by text for composite values.
    if isinstance(v, bool):
        return (0, int(v))
    if isinstance(v, int):
        return (1, v)
    if isinstance(v, ModelValue):
        return (3, str(v))
    if isinstance(v, str):
        return (2, v)
    return (4, serialize(v))


def serialize(value: object) -> str:
    """TLA+ expression text for a Python value; the inverse of :func:`parse_value`.

    Also accepts ``list`` (as a sequence), ``set`` and any ``Mapping``. Records
    are written ``[a |-> 1]``; other functions ``(k :> v @@ ...)``, which needs
    ``EXTENDS TLC`` where the text is used. Sets and function entries are
    sorted, so equal values give equal text.
    """
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, ModelValue):
        if not _is_identifier(value):
            raise ValueError(
                f"model value {str(value)!r} is not a TLA+ identifier: "
                "use letters, digits and '_' (with at least one letter)"
            )
        return str(value)
    if isinstance(value, str):
        return _quote(value)
    if isinstance(value, (tuple, list)):
        return "<<" + ", ".join(serialize(v) for v in value) + ">>"
    if isinstance(value, (frozenset, set)):
        return "{" + ", ".join(serialize(v) for v in sorted(value, key=_sort_key)) + "}"
    if isinstance(value, Mapping):
        fn = value if isinstance(value, FnValue) else FnValue(value)
        if not fn:
            return "<<>>"
        seq = fn.as_tuple()
        if seq is not None:
            return serialize(seq)
        if fn.is_record():
            return "[" + ", ".join(f"{k} |-> {serialize(v)}" for k, v in fn.items()) + "]"
        entries = sorted(fn.items(), key=lambda kv: _sort_key(kv[0]))
        return "(" + " @@ ".join(f"{serialize(k)} :> {serialize(v)}" for k, v in entries) + ")"
    raise TypeError(
        f"cannot write a {type(value).__name__} as a TLA+ value: use int, bool, str, "
        "ModelValue, tuple/list, frozenset/set, or a Mapping/FnValue"
    )


def pretty(value: object, width: int = 80, indent: int = 0) -> str:
    """Like :func:`serialize`, but breaks composite values that exceed ``width``
    into one element per line (continuation lines indented by ``indent + 2``).
    """
    flat = serialize(value)
    if len(flat) + indent <= width or isinstance(value, (bool, int, str)):
        return flat
    pad = " " * (indent + 2)
    inner = indent + 2
    if isinstance(value, (tuple, list)):
        parts, open_, close = [pretty(v, width, inner) for v in value], "<<", ">>"
    elif isinstance(value, (frozenset, set)):
        parts, open_, close = (
            [pretty(v, width, inner) for v in sorted(value, key=_sort_key)],
            "{",
            "}",
        )
    elif isinstance(value, Mapping):
        fn = value if isinstance(value, FnValue) else FnValue(value)
        seq = fn.as_tuple()
        if seq is not None:
            return pretty(seq, width, indent)
        if fn.is_record():
            parts = [f"{k} |-> {pretty(v, width, inner)}" for k, v in fn.items()]
            open_, close = "[", "]"
        else:
            entries = sorted(fn.items(), key=lambda kv: _sort_key(kv[0]))
            parts = [f"{serialize(k)} :> {pretty(v, width, inner)}" for k, v in entries]
            return "( " + f"\n{pad}@@ ".join(parts) + " )"
    else:
        return flat
    return open_ + " " + f",\n{pad}".join(parts) + " " + close
