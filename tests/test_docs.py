"""The README documents every setting, every event field and every topic the code defines."""

from __future__ import annotations

from app.events import SCHEMAS
from app.runtime.settings import ENV_DOCS, PROJECT_ROOT
from app.topics import TOPICS

README = (PROJECT_ROOT / "README.md").read_text()


def test_readme_starts_with_the_two_commands() -> None:
    head = README.split("## ", 1)[0]
    assert "make run" in head and "make test" in head


def test_every_environment_variable_is_documented() -> None:
    missing = [name for name in ENV_DOCS if f"| `{name}` |" not in README]
    assert missing == []


def test_every_event_field_and_topic_is_documented() -> None:
    missing = [f"{s.source}.{f}" for s in SCHEMAS.values() for f in s.fields if f"`{f}`" not in README]
    missing += [t.name for t in TOPICS if f"`{t.name}`" not in README]
    assert missing == []
