"""Load YAML while remembering where every value came from (line and column).

``load_with_positions`` returns plain Python data plus a map from the path of
each value (a tuple of keys and list indexes) to its 1-based ``(line, col)``.
Duplicate keys, which PyYAML silently overwrites, are reported as errors.
Only the safe YAML subset is constructed: no Python tags, no code. Where a
string was expected and YAML typed a plain scalar (``id: yes`` is a boolean),
:func:`not_a_string` says what it was read as and how to quote it.

What a file may ask of the parser is bounded, so that any file (rule files and
the routes file both come through here) is read in time and memory in
proportion to its size, and every refusal is a :class:`YamlProblem` with a
position, never another exception:

- anchors and aliases (``&name``, ``*name``, and so ``<<: *name`` merges) are
  refused: a few hundred bytes of aliases expand to billions of values (the
  "billion laughs"), and a configuration file gains nothing from them that
  writing the value out does not give;
- collections nest at most :data:`MAX_DEPTH` levels deep (the composer and the
  code that walks its result recurse once per level), and a document holds at
  most :data:`MAX_NODES` values (each costs tens of microseconds and a position);
- a scalar typed as anything but a string (a number, a boolean, a date, ...)
  is at most :data:`MAX_TYPED_SCALAR` characters: PyYAML converts some of them
  in quadratic time (``1:2:3:...`` is a base-60 integer), and a malformed one
  with an explicit tag (``!!int abc``) is a problem at its position.
"""

from __future__ import annotations

from datetime import date, datetime
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.parser import Parser
from yaml.reader import Reader
from yaml.resolver import Resolver
from yaml.scanner import Scanner

try:  # libyaml's parser, in C: ten times the pure-Python one's speed, the same events
    from yaml._yaml import CParser
except ImportError:  # pragma: no cover - PyYAML's wheels ship libyaml
    CParser = None  # type: ignore[misc,assignment]

Path = tuple[str | int, ...]
Positions = dict[Path, tuple[int, int]]

#: the deepest nesting of mappings and sequences a document may have
MAX_DEPTH = 64
#: the most values (scalars, mappings and lists) a document may hold; a rule takes about 15
MAX_NODES = 100_000
#: the longest scalar that resolves to a type other than a string
MAX_TYPED_SCALAR = 100
_STR_TAG = "tag:yaml.org,2002:str"
#: what PyYAML's safe constructors raise on a malformed explicitly tagged scalar
_CONSTRUCT_ERRORS = (ValueError, TypeError, KeyError, AttributeError, ArithmeticError)


class YamlProblem(Exception):
    def __init__(self, line: int, col: int, message: str) -> None:
        super().__init__(message)
        self.line = line
        self.col = col
        self.message = message


def _mark_pos(mark: Any) -> tuple[int, int]:
    """A PyYAML or libyaml mark (or None) as a 1-based ``(line, col)``."""
    return (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)


def _pos(node: yaml.Node) -> tuple[int, int]:
    return _mark_pos(node.start_mark)


class _BoundedComposer(Composer):
    """PyYAML's composer, in Python over either parser, refusing anchors and aliases,
    nesting past :data:`MAX_DEPTH` and more than :data:`MAX_NODES` values."""

    depth = 0
    nodes = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event = self.peek_event()  # type: ignore[attr-defined] # the parser's, mixed in below
        anchor = getattr(event, "anchor", None)
        if anchor is not None:  # an alias (*name) or a node that defines an anchor (&name)
            line, col = _mark_pos(event.start_mark)
            what = f"alias *{anchor}" if isinstance(event, yaml.AliasEvent) else f"anchor &{anchor}"
            raise YamlProblem(line, col, f"{what}: anchors and aliases are not allowed; write the value out")
        self.nodes += 1
        if self.nodes > MAX_NODES:
            line, col = _mark_pos(event.start_mark)
            msg = f"more than {MAX_NODES} values in one file (the limit); split it into several files"
            raise YamlProblem(line, col, msg)
        if not isinstance(event, yaml.CollectionStartEvent):
            return super().compose_node(parent, index)
        if self.depth >= MAX_DEPTH:
            line, col = _mark_pos(event.start_mark)
            msg = f"mappings and lists nest deeper than {MAX_DEPTH} levels (the limit)"
            raise YamlProblem(line, col, msg)
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


class PyLoader(_BoundedComposer, Reader, Scanner, Parser, SafeConstructor, Resolver):
    """PyYAML's pure-Python parser, bounded (:data:`LOADER` when PyYAML lacks libyaml)."""

    def __init__(self, text: str) -> None:
        Reader.__init__(self, text)
        Scanner.__init__(self)
        Parser.__init__(self)
        _BoundedComposer.__init__(self)
        SafeConstructor.__init__(self)
        Resolver.__init__(self)


#: the parser :func:`load_with_positions` uses: libyaml's (:class:`CLoader`) when PyYAML has
#: it (its wheels do), :class:`PyLoader` otherwise; both answer the same data or problems
LOADER: type[PyLoader] = PyLoader
if CParser is not None:

    class CLoader(_BoundedComposer, CParser, SafeConstructor, Resolver):
        """libyaml's parser (PyYAML's C extension), bounded."""

        def __init__(self, text: str) -> None:
            CParser.__init__(self, text)
            _BoundedComposer.__init__(self)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)

    LOADER = CLoader  # type: ignore[assignment]


def _scalar(node: yaml.ScalarNode, loader: SafeConstructor) -> Any:
    if node.tag != _STR_TAG and len(node.value) > MAX_TYPED_SCALAR:
        line, col = _pos(node)
        kind = node.tag.rsplit(":", 1)[-1]
        msg = (
            f"{kind} value of {len(node.value)} characters; the limit is {MAX_TYPED_SCALAR} "
            "(quote it if it is text)"
        )
        raise YamlProblem(line, col, msg)
    try:
        return loader.construct_object(node, deep=True)
    except _CONSTRUCT_ERRORS:
        line, col = _pos(node)
        kind = node.tag.rsplit(":", 1)[-1]
        raise YamlProblem(line, col, f"{node.value[:40]!r} is not a valid {kind}") from None


def _build(node: yaml.Node, path: Path, positions: Positions, loader: SafeConstructor) -> Any:
    positions[path] = _pos(node)
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            # keys are names: take a plain scalar as written, so `on:` stays "on"
            # instead of YAML 1.1's boolean True (the "Norway problem")
            if isinstance(key_node, yaml.ScalarNode) and not key_node.style:  # None, or '' from libyaml
                key = key_node.value
            elif isinstance(key_node, yaml.ScalarNode):
                key = _scalar(key_node, loader)
            else:
                line, col = _pos(key_node)
                raise YamlProblem(line, col, "mapping keys must be plain scalars")
            if not isinstance(key, str | int | float | bool):
                line, col = _pos(key_node)
                raise YamlProblem(line, col, "mapping keys must be plain scalars")
            if key in out:
                line, col = _pos(key_node)
                raise YamlProblem(line, col, f"duplicate key {key!r}")
            skey = str(key) if not isinstance(key, str) else key
            out[skey] = _build(value_node, (*path, skey), positions, loader)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_build(item, (*path, i), positions, loader) for i, item in enumerate(node.value)]
    if not isinstance(node, yaml.ScalarNode):  # a composed node is one of the three
        line, col = _pos(node)
        raise YamlProblem(line, col, f"unsupported YAML node {type(node).__name__}")
    return _scalar(node, loader)


def _problem(exc: yaml.YAMLError, text: str) -> YamlProblem:
    """A parser's error as a :class:`YamlProblem` at its position."""
    if isinstance(exc, yaml.MarkedYAMLError):
        line, col = _mark_pos(exc.problem_mark or exc.context_mark)
        return YamlProblem(line, col, f"invalid YAML: {exc.problem or exc}")
    if isinstance(exc, yaml.reader.ReaderError) and isinstance(exc.character, int):
        # no mark, and an index into the text (PyYAML) or into its UTF-8 (libyaml): each
        # reads the characters in order, so the first of the refused one is where it stopped
        line, col = _text_pos(text, text.find(chr(exc.character)))
        return YamlProblem(line, col, f"invalid YAML: {exc.reason}, #x{exc.character:04x}")
    return YamlProblem(1, 1, f"invalid YAML: {exc}")


def _text_pos(text: str, at: int) -> tuple[int, int]:
    """The 1-based ``(line, col)`` of ``text[at]`` (of the start when ``at`` is -1)."""
    at = max(at, 0)
    return text.count("\n", 0, at) + 1, at - text.rfind("\n", 0, at)


def load_with_positions(text: str) -> tuple[Any, Positions]:
    """Parse one YAML document. Raises :class:`YamlProblem` with the position."""
    try:
        loader = LOADER(text)  # the pure-Python reader checks every character here
    except yaml.YAMLError as exc:
        raise _problem(exc, text) from None
    except UnicodeEncodeError as exc:  # libyaml reads UTF-8: a lone surrogate has none
        line, col = _text_pos(text, exc.start)
        msg = f"invalid YAML: a lone surrogate, #x{ord(text[exc.start]):04x}"
        raise YamlProblem(line, col, msg) from None
    try:
        node = loader.get_single_node()
        if node is None:
            return None, {(): (1, 1)}
        positions: Positions = {}
        return _build(node, (), positions, loader), positions
    except yaml.YAMLError as exc:
        raise _problem(exc, text) from None
    finally:
        loader.dispose()


def position_of(positions: Positions, path: Path) -> tuple[int, int]:
    """The position of ``path``, or of its nearest ancestor that has one."""
    while path not in positions and path:
        path = path[:-1]
    return positions.get(path, (1, 1))


def _read_as(value: object) -> str | None:
    """What YAML made of a plain scalar that is not a string, in words; None for a list or a
    mapping (quoting does not make those a string)."""
    if value is None:
        return "null (no value)"
    if isinstance(value, bool):
        return f"the boolean {'true' if value else 'false'}"
    if isinstance(value, int | float):
        return f"the number {value!r}"
    if isinstance(value, datetime):
        return f"the timestamp {value.isoformat()}"
    if isinstance(value, date):
        return f"the date {value.isoformat()}"
    if isinstance(value, bytes):
        return "binary data"
    return None


def _unbalanced(text: str) -> int:
    return text.count("(") - text.count(")")


def _comma_runs(mapping: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """Where an inline ``{n: f(x, 0.5)}`` mapping was split at its commas: YAML reads it as
    ``{n: "f(x", "0.5)": null}``. Each run is the key whose value opens a ``(`` it does not
    close and the texts (its value, then the keys without a value after it) that together
    were the expression."""
    runs: list[tuple[str, list[str]]] = []
    owner: str | None = None
    parts: list[str] = []
    depth = 0
    for key, value in mapping.items():
        if owner is not None and value is None:
            parts.append(str(key))
            depth += _unbalanced(str(key))
            if depth > 0:
                continue
        if owner is not None:
            runs.append((owner, parts))
            owner = None
        if isinstance(value, str) and _unbalanced(value) > 0:
            owner, parts, depth = str(key), [value], _unbalanced(value)
    if owner is not None:
        runs.append((owner, parts))
    return runs


def _value_at(data: Any, path: Path) -> Any:
    """The value at ``path`` in loaded data (None when there is none)."""
    for step in path:
        if isinstance(data, dict) and step in data:
            data = data[step]
        elif isinstance(data, list) and isinstance(step, int) and 0 <= step < len(data):
            data = data[step]
        else:
            return None
    return data


def written(text: str, at: tuple[int, int] | None) -> str:
    """The plain scalar at ``at`` (a 1-based ``(line, col)``) as ``text`` spells it, empty when
    it cannot tell: to the end of its line, a comment, or a flow collection's ``,``, ``]`` or
    ``}`` (none of which a number, boolean, date or null holds)."""
    lines = text.split("\n")
    if at is None or not 1 <= at[0] <= len(lines):
        return ""
    rest = lines[at[0] - 1][at[1] - 1 :]
    if rest.startswith("!"):  # an explicit tag (!!int 5): the value follows it
        rest = rest.partition(" ")[2]
    for end in (" #", ",", "]", "}"):
        rest = rest.split(end, 1)[0]
    return rest.strip()


def not_a_string(text: str, positions: Positions, data: Any, path: Path, value: object) -> str | None:
    """Where a string was expected at ``path`` of a document (``text``, loaded as ``data`` with
    ``positions``) and YAML typed the scalar ``value`` instead (``id: yes``, ``description:
    2024-01-01``): what it was read as and how to quote it, or that an inline ``{...}`` mapping
    was split at a comma inside an expression; the caller names the key before it. None for a
    value quoting would not fix (a list, a mapping)."""
    if not path:
        return None
    name = path[-1]
    parent = _value_at(data, path[:-1])
    if value is None and isinstance(parent, dict):
        for owner, parts in _comma_runs(parent):
            if name in parts[1:]:
                expression = ", ".join(parts).replace("\\", "\\\\").replace('"', '\\"')
                return (
                    f"an inline {{...}} mapping splits at commas, so the value of "
                    f"'{owner}' was cut there; quote the expression: {owner}: \"{expression}\""
                )
    what = _read_as(value)
    if what is None:
        return None
    spelt = written(text, positions.get(path))
    if not spelt:
        if value is None:
            return "no value given (YAML reads that as null); a string is expected"
        return f"read as {what}, not a string; quote it"
    quoted = '"' + spelt.replace("\\", "\\\\").replace('"', '\\"') + '"'
    example = f"{name}: {quoted}" if isinstance(name, str) else quoted
    return f"read as {what}, not a string; quote it: {example}"
