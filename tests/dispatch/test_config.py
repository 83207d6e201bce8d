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
    assert f"{path}:6:13: unknown key 'timeot'" in text
    assert f"{path}:10:15: 'group_wait': expected a duration" in text
    assert f"{path}:12:18: 'matchers': bad regex" in text
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
