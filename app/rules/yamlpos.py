"""Load YAML while remembering where every value came from (line and column).

``load_with_positions`` returns plain Python data plus a map from the path of
each value (a tuple of keys and list indexes) to its 1-based ``(line, col)``.
Duplicate keys, which PyYAML silently overwrites, are reported as errors.
Only the safe YAML subset is constructed: no Python tags, no code.
"""

from __future__ import annotations

from typing import Any

import yaml

Path = tuple[str | int, ...]
Positions = dict[Path, tuple[int, int]]


class YamlProblem(Exception):
    def __init__(self, line: int, col: int, message: str) -> None:
        super().__init__(message)
        self.line = line
        self.col = col
        self.message = message


def _pos(node: yaml.Node) -> tuple[int, int]:
    return node.start_mark.line + 1, node.start_mark.column + 1


def _build(node: yaml.Node, path: Path, positions: Positions, loader: yaml.SafeLoader) -> Any:
    positions[path] = _pos(node)
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            # keys are names: take a plain scalar as written, so `on:` stays "on"
            # instead of YAML 1.1's boolean True (the "Norway problem")
            if isinstance(key_node, yaml.ScalarNode) and key_node.style is None:
                key = key_node.value
            else:
                key = loader.construct_object(key_node, deep=True)
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
    return loader.construct_object(node, deep=True)


def load_with_positions(text: str) -> tuple[Any, Positions]:
    """Parse one YAML document. Raises :class:`YamlProblem` with the position."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, {(): (1, 1)}
        positions: Positions = {}
        return _build(node, (), positions, loader), positions
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        raise YamlProblem(line, col, f"invalid YAML: {exc.problem or exc}") from None
    except yaml.YAMLError as exc:
        raise YamlProblem(1, 1, f"invalid YAML: {exc}") from None
    finally:
        loader.dispose()


def position_of(positions: Positions, path: Path) -> tuple[int, int]:
    """The position of ``path``, or of its nearest ancestor that has one."""
    while path not in positions and path:
        path = path[:-1]
    return positions.get(path, (1, 1))
