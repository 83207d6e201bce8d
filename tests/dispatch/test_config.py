"""The routes file: the shipped default loads; every problem is reported as file:line:col."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.dispatch.config import RoutesConfigError, load_routes
from app.dispatch.routes import build_tree
from app.runtime.settings import PROJECT_ROOT
from tests.dispatch.helpers import SECRET


def test_the_shipped_routes_file_loads_with_the_documented_defaults() -> None:
    cfg = load_routes(PROJECT_ROOT / "config" / "routes.yaml", {"APP_WEBHOOK_URL": "http://x.example/h"})
    assert cfg.receivers[0].name == "default"
    assert cfg.receivers[0].url == "http://x.example/h"  # type: ignore[union-attr]
    assert cfg.receivers[0].secret.get_secret_value().startswith("whsec_")  # type: ignore[union-attr]
    assert build_tree(cfg).receiver == "default"


def test_every_problem_is_listed_with_its_position(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        f"""receivers:
  - name: ops
    type: webhook
    url: ${{NOT_SET_ANYWHERE}}
    secret: "{SECRET}"
    timeot: 5s
  - {{name: ops, type: kafka}}
route:
  receiver: ops
  group_wait: soon
  routes:
    - matchers: ['severity=~"("']
      receiver: nobody
    - receiver: ops
      escalate: {{after: 5m, to: ghost}}
"""
    )
    with pytest.raises(RoutesConfigError) as info:
        load_routes(path, {})
    text = str(info.value)
    assert f"{path}:4:10: environment variable NOT_SET_ANYWHERE is not set" in text
    assert f"{path}:6:13: receivers 1: unknown key 'timeot'" in text
    assert f"{path}:10:15: 'group_wait': expected a duration" in text
    assert f"{path}:12:18: matchers 1: bad regex" in text
    assert len(info.value.problems) == 4  # semantic checks wait until the file parses


def test_semantic_problems_name_the_receiver(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        f"""receivers:
  - {{name: ops, type: webhook, url: "http://a/b", secret: "{SECRET}"}}
  - {{name: ops, type: kafka}}
route:
  receiver: ops
  routes:
    - {{receiver: nobody}}
    - {{escalate: {{after: 5m, to: ghost}}}}
"""
    )
    with pytest.raises(RoutesConfigError) as info:
        load_routes(path, {})
    assert info.value.problems == [
        f"{path}:3:12: duplicate receiver name 'ops'",
        f"{path}:7:18: unknown receiver 'nobody'",
        f"{path}:8:34: unknown receiver 'ghost'",
    ]


def test_yaml_errors_and_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("route: [\n")
    with pytest.raises(RoutesConfigError, match=r"broken.yaml:2:1: invalid YAML"):
        load_routes(path, {})
    with pytest.raises(RoutesConfigError, match="cannot read routes file"):
        load_routes(tmp_path / "missing.yaml", {})


RECEIVER = "receivers:\n  - {name: ops, type: kafka}\n"


@pytest.mark.parametrize(
    ("route", "expected"),
    [
        ("  storm_threshold: many\n", "5:20: 'storm_threshold': expected a whole number, got text 'many'"),
        ("  group_interval: 0s\n", "5:19: 'group_interval' must be above 0 (got '0s')"),
        ("  group_by: alertname\n", "5:13: 'group_by': expected a list, got text 'alertname'"),
        ("  routes:\n    - {receiver: yes}\n", "6:18: 'receiver': read as the boolean true, not a string"),
        ("  routes:\n    - {receiver: ops, continue: maybe}\n", "6:33: 'continue': expected true or false"),
        ("  routes:\n    - {receiver: ops, matchers: [a=b, sev]}\n", "6:39: matchers 2: expected a matcher"),
        ("  escalate: {after: 5m}\n", "5:13: 'escalate': missing required key 'to'"),
    ],
)
def test_a_routes_problem_is_named_in_the_words_of_rules_check(
    tmp_path: Path, route: str, expected: str
) -> None:
    """The routes file's pydantic errors go through the rule files' wording (app/rules/problems.py):
    the value given and the key at fault, instead of pydantic's 'Input should be a valid integer'."""
    path = tmp_path / "routes.yaml"
    path.write_text(RECEIVER + "route:\n  receiver: ops\n" + route)
    with pytest.raises(RoutesConfigError) as info:
        load_routes(path, {})
    (problem,) = info.value.problems
    assert problem.startswith(f"{path}:{expected}"), problem


def test_past_a_hundred_problems_the_rest_are_counted(tmp_path: Path) -> None:
    path = tmp_path / "routes.yaml"
    routes = "".join(f"    - {{receiver: ops, storm_threshold: x{i}}}\n" for i in range(105))
    path.write_text(RECEIVER + "route:\n  receiver: ops\n  routes:\n" + routes)
    with pytest.raises(RoutesConfigError) as info:
        load_routes(path, {})
    problems = info.value.problems
    assert len(problems) == 101
    assert problems[0].startswith(f"{path}:6:")  # in the file's order
    assert problems[-1] == f"{path}:1:1: 5 more problem(s) in this file; only the first 100 are listed"
