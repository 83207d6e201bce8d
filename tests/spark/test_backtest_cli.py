"""`python -m app backtest --engine spark`: the Faust-engine backtest's output, from a file
and from a topic range on the real broker."""

from __future__ import annotations

import bz2
import gzip
from pathlib import Path

import orjson
import pytest
from pyspark.sql import SparkSession

from app.cli.main import main
from app.kafka.broker import KafkaBroker
from tests.conformance.threshold_cases import RULES, crafted
from tests.kafka_helpers import produce

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def backtest(tmp_path: Path, name: str, *args: str) -> list[str]:
    out = tmp_path / f"{name}.jsonl"
    assert main(["backtest", "--rules", str(RULES), "--out", str(out), *args]) == 0
    return out.read_text().splitlines()


def late_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The summary's late-events line of the last command, without its engine's label."""
    (line,) = [x for x in capsys.readouterr().err.splitlines() if "late event" in x]
    return line.split(": ", 1)[1]


def per_device(lines: list[str]) -> list[str]:
    return sorted(line for line in lines if orjson.loads(line)["rule"] != "fleet-hot-pair")


def test_file_and_topic_backtests_on_spark_print_the_faust_engines_lines(
    spark: SparkSession, broker: KafkaBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    events = [orjson.dumps(e) for e in crafted()]
    path = tmp_path / "crafted.jsonl"
    path.write_bytes(b"\n".join([*events, b"{broken"]) + b"\n")
    faust = backtest(tmp_path, "faust", "--input", str(path))
    late = late_line(capsys)  # the summary's count of late events: the same on every engine and plan
    assert late.startswith("5 late events not used by a rule")
    on_spark = backtest(tmp_path, "spark", "--input", str(path), "--engine", "spark")
    assert len(faust) >= 4 and sorted(on_spark) == sorted(faust)
    assert late_line(capsys) == late
    monkeypatch.setenv("APP_SPARK_DECODE", "jvm")  # the records decoded in Spark SQL: the same lines
    assert backtest(tmp_path, "spark-jvm", "--input", str(path), "--engine", "spark") == on_spark
    assert late_line(capsys) == late
    monkeypatch.delenv("APP_SPARK_DECODE")
    monkeypatch.setenv("APP_SPARK_BACKTEST_PLANS", "native")  # the native plans: the same lines
    assert backtest(tmp_path, "spark-native", "--input", str(path), "--engine", "spark") == on_spark
    assert late_line(capsys) == late
    monkeypatch.delenv("APP_SPARK_BACKTEST_PLANS")

    produce(broker.bootstrap, "events.sensors", [(orjson.loads(e)["device_id"].encode(), e) for e in events])
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", broker.bootstrap)
    from_topic = backtest(tmp_path, "topic", "--topic", "events.sensors", "--engine", "spark")
    faust_topic = backtest(tmp_path, "faust-topic", "--topic", "events.sensors")
    # both engines read a topic range in record-timestamp order, then topic, partition and
    # offset: every line in the same order, the rule whose one group spans partitions included
    # (the Faust engine kept records of one millisecond in the order its fetches brought them)
    assert from_topic == faust_topic
    # the file is in another order than the topic's timestamps: there the rule whose single
    # group spans devices is left out; every per-device rule must agree exactly
    assert per_device(from_topic) == per_device(faust) == per_device(faust_topic)
    assert len(per_device(from_topic)) >= 4
    assert SparkSession.getActiveSession() is not None, "the command must not stop a session it did not start"


UNMARKED = """\
rules:
  - id: hot
    source: sensors
    where: temperature > 100
    group_by: [device_id]
  - id: ten-minutes
    source: sensors
    group_by: [device_id]
    window: {type: tumbling, size: 10m}
    aggregate: {avg_t: avg(temperature)}
    having: avg_t > 90
"""


def test_backtest_on_spark_runs_rules_that_say_no_engine(spark: SparkSession, tmp_path: Path) -> None:
    """No ``engine:`` key (so ``faust``): the Spark backtest still runs both rules, with the
    Faust engine's lines (same rule versions too), never a silent 0 transitions."""
    rules = tmp_path / "unmarked.yaml"
    rules.write_text(UNMARKED)
    path = tmp_path / "crafted.jsonl"
    path.write_bytes(b"\n".join(orjson.dumps(e) for e in crafted()) + b"\n")
    lines = {}
    for engine in ("faust", "spark"):
        out = tmp_path / f"{engine}.jsonl"
        args = ["--rules", str(rules), "--input", str(path), "--out", str(out), "--engine", engine]
        assert main(["backtest", *args]) == 0
        lines[engine] = out.read_text().splitlines()
    assert {orjson.loads(line)["rule"] for line in lines["faust"]} == {"hot", "ten-minutes"}
    assert lines["spark"] == lines["faust"]  # the same lines in the same order


def test_backtest_on_spark_runs_expect_from_with_the_given_registry(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Absence of registry keys never seen (``expect_from``) runs on Spark too, with the
    ``--table`` rows, and gives the Faust engine's lines: the never-seen device fires (one
    partition: the crafted events move its clock 56 minutes)."""
    rules = tmp_path / "registry.yaml"
    rules.write_text(
        UNMARKED
        + """\
  - id: silent
    source: sensors
    group_by: [device_id]
    absent_for: 30m
    expect_from: devices
"""
    )
    registry = tmp_path / "devices.csv"
    registry.write_text("device_id,site\ncrafted-1,lab\nnever-seen-7,lab\n")
    path = tmp_path / "crafted.jsonl"
    path.write_bytes(b"\n".join(orjson.dumps(e) for e in crafted()) + b"\n")
    lines = {}
    for engine in ("faust", "spark"):
        out = tmp_path / f"{engine}.jsonl"
        args = ["--rules", str(rules), "--input", str(path), "--table", f"devices={registry}"]
        args += ["--partitions", "1"]
        assert main(["backtest", *args, "--out", str(out), "--engine", engine]) == 0
        lines[engine] = out.read_text().splitlines()
    silent = {orjson.loads(line)["labels"]["device_id"] for line in lines["spark"] if '"silent"' in line}
    assert "never-seen-7" in silent
    assert lines["spark"] == lines["faust"]  # the same lines in the same order


def test_a_wrong_app_spark_decode_or_backtest_plans_is_refused_before_spark_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 2 naming the variable, before the session (whose start takes seconds) and before
    the output file is opened."""
    events = tmp_path / "in.jsonl"
    events.write_bytes(b"\n".join(orjson.dumps(e) for e in crafted()) + b"\n")
    monkeypatch.setenv("APP_SPARK_DECODE", "java")
    out = tmp_path / "out.jsonl"
    args = ["backtest", "--rules", str(RULES), "--input", str(events), "--out", str(out), "--engine", "spark"]
    assert main(args) == 2
    assert "APP_SPARK_DECODE='java': expected python" in capsys.readouterr().err
    assert not out.exists()
    monkeypatch.delenv("APP_SPARK_DECODE")
    monkeypatch.setenv("APP_SPARK_BACKTEST_PLANS", "sql")
    assert main(args) == 2
    assert "APP_SPARK_BACKTEST_PLANS='sql': expected evaluator" in capsys.readouterr().err
    assert not out.exists()


HOT = """\
rules:
  - {id: hot, source: sensors, where: temperature > 30, group_by: [device_id]}
"""


def _reading(device: bytes, second: int) -> bytes:
    return b'{"device_id": "%s", "ts": "2026-03-01T00:00:%02dZ", "temperature": 31}' % (device, second)


def test_a_file_backtest_on_spark_reads_the_lines_the_faust_backtest_reads(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Lines as the Faust-engine backtest reads the file (in binary): split at ``\\n`` only,
    each line's own bytes, and blank lines skipped without a problem but numbered. Spark's
    text reader made two events of a line with a lone ``\\r`` in it (an alert the Faust
    engine never raised, and every later line number one off), accepted a line that is not
    UTF-8 with its bad bytes replaced (an alert for device ``a\\ufffd\\ufffd``), and counted
    blank lines as invalid."""
    rules = tmp_path / "hot.yaml"
    rules.write_text(HOT)
    lines = [
        _reading(b"a", 0),
        b"",
        b"  \t ",
        b"\x0b\x0c",
        _reading(b"a", 1) + b"\r",  # CRLF
        _reading(b"a", 2) + b"\r" + _reading(b"b", 2),  # one invalid line, not two events
        _reading(b"c\xff\xfe", 3),  # not UTF-8: invalid
        _reading(b"\xc3\xa9", 4),  # é
        b"\xef\xbb\xbf" + _reading(b"bom", 5),
        b"\xe2\x80\xa8",  # U+2028 alone: not blank to bytes.strip (nor to the JVM's \z)
        b"\r",
        _reading(b"d", 6),  # no newline at the end
    ]
    path = tmp_path / "edge.jsonl"
    path.write_bytes(b"\n".join(lines))
    seen = {}
    for engine in ("faust", "spark"):
        out = tmp_path / f"{engine}.jsonl"
        args = ["--rules", str(rules), "--input", str(path), "--out", str(out), "--statuses", "all"]
        assert main(["backtest", *args, "--engine", engine]) == 0
        problems = [line for line in capsys.readouterr().err.splitlines() if line.startswith(str(path))]
        seen[engine] = (out.read_text().splitlines(), problems)
    alerts, problems = seen["faust"]
    assert [orjson.loads(a)["labels"]["device_id"] for a in alerts] == ["a", "é", "d"]
    assert [p.split(":")[1] for p in problems] == ["6", "7", "9", "10"]
    assert seen["spark"] == seen["faust"]


def test_gz_and_bz2_input_on_spark_and_a_damaged_or_missing_file(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Spark's text reader decompresses ``.gz`` and ``.bz2`` itself: the plain file's lines
    and report. A damaged ``.gz`` fails Spark's first job: one line naming the file and the
    cause, exit 2 (a Java stack and exit 1 before); a missing file is refused before Spark
    reads anything, as by the Faust backtest."""
    events = [orjson.dumps(e) for e in crafted()]
    data = b"\n".join([*events, b"{broken"]) + b"\n"
    seen = {}
    for name, packed in [
        ("c.jsonl", data),
        ("c.jsonl.gz", gzip.compress(data)),
        ("c.jsonl.bz2", bz2.compress(data)),
    ]:
        path = tmp_path / name
        path.write_bytes(packed)
        out = tmp_path / f"{name}.out"
        assert (
            main(
                [
                    "backtest",
                    "--rules",
                    str(RULES),
                    "--input",
                    str(path),
                    "--out",
                    str(out),
                    "--engine",
                    "spark",
                ]
            )
            == 0
        )
        summary = capsys.readouterr().err.splitlines()
        seen[name] = (out.read_text(), [line for line in summary if line.startswith("backtest (spark):")])
    assert len(seen["c.jsonl"][0].splitlines()) >= 4 and "1 invalid lines skipped" in seen["c.jsonl"][1][-1]
    assert seen["c.jsonl.gz"] == seen["c.jsonl.bz2"] == seen["c.jsonl"]

    packed = gzip.compress(data * 20)
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(packed[: len(packed) // 2])
    args = ["backtest", "--rules", str(RULES), "--out", str(tmp_path / "o.jsonl"), "--engine", "spark"]
    assert main([*args, "--input", str(cut)]) == 2
    err = capsys.readouterr().err
    assert f"error: --input {cut}: unreadable: java.io.EOFException: Unexpected end of input stream" in err
    assert main([*args, "--input", str(tmp_path / "missing.jsonl")]) == 2
    assert capsys.readouterr().err == f"error: --input {tmp_path / 'missing.jsonl'}: no such file\n"
