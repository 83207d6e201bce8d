"""The routing tree: first match wins, `continue` fans out, options are inherited."""

from __future__ import annotations

from pathlib import Path

from app.dispatch.routes import build_tree
from tests.dispatch.helpers import routes

TREE = """
route:
  receiver: ops
  group_by: [alertname]
  group_wait: 10s
  routes:
    - matchers: ['severity="critical"']
      receiver: pager
      continue: true
      group_by: ['...']
    - matchers: ['team=~"plant.*"']
      receiver: bus
      repeat_interval: 1h
    - matchers: ['team="plant-ops"']
      receiver: pager
"""


def names(tmp_path: Path, **labels: str) -> list[str]:
    return [r.receiver for r in build_tree(routes(tmp_path, TREE)).match(labels)]


def test_first_matching_child_wins_and_continue_fans_out(tmp_path: Path) -> None:
    assert names(tmp_path, severity="warning") == ["ops"]  # no child: the root itself
    assert names(tmp_path, severity="critical") == ["pager"]
    assert names(tmp_path, severity="critical", team="plant-ops") == ["pager", "bus"]
    assert names(tmp_path, severity="info", team="plant-ops") == ["bus"]  # not the third child


def test_children_inherit_unset_options_and_keys_are_stable(tmp_path: Path) -> None:
    root = build_tree(routes(tmp_path, TREE))
    pager, bus, _ = root.children
    assert (bus.group_by, bus.group_wait, bus.group_interval, bus.repeat_interval) == (
        ("alertname",), 10.0, 300.0, 3600.0,
    )  # fmt: skip
    assert pager.group_all and pager.group_labels({"a": "1"}) == {"a": "1"}
    assert bus.group_key({"alertname": "hot", "x": "y"}) == '{}/{team=~"plant.*"}[1]:{alertname="hot"}'
    assert build_tree(routes(tmp_path, TREE, "again.yaml")).children[1].key == bus.key
