"""The conformance suite shares the Spark test session."""

from tests.spark.conftest import spark  # noqa: F401 - the session-scoped fixture
