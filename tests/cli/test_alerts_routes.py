"""`python -m app alerts ...` and `routes ...` against a real broker and store (store-sync role)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from app.cli.main import main
from app.kafka.broker import KafkaBroker
from app.runtime.settings import PROJECT_ROOT
from app.topics import ALERTS
from tests.conftest import child_env
from tests.console_helpers import RUNNING, seed, seed_with_a_running_rule
from tests.dispatch.harness import publish
from tests.dispatch.helpers import BASE, alert
from tests.storage.helpers import sync_until

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def test_list_silence_ack_show_and_unsilence(
    broker: KafkaBroker,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    env = {"KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap, "APP_DATA_DIR": str(tmp_path / "data")}  # fmt: skip
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    d1, d2 = alert("d1"), alert("d2")
    publish(broker.bootstrap, ALERTS, [d1, d2])
    sync_until(env, "SELECT COUNT(*) >= 2 FROM alerts")  # both: they may be on different partitions

    assert main(["alerts", "list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert sorted(line.split()[0] for line in listed) == sorted([d1.fingerprint, d2.fingerprint])

    assert (
        main(["alerts", "silence", "device_id=d1", "--duration", "2h", "--comment", "swap", "--by", "ann"])
        == 0
    )
    silence = orjson.loads(capsys.readouterr().out)
    assert (silence["type"], silence["matchers"], silence["by"]) == ("silence", ['device_id="d1"'], "ann")
    assert main(["alerts", "ack", d2.fingerprint[:8], "--comment", "on it"]) == 0
    ack = orjson.loads(capsys.readouterr().out)
    assert (ack["fingerprint"], ack["starts_at"]) == (d2.fingerprint, d2.starts_at)
    # both commands: keyed apart, they may be on different partitions of the commands topic,
    # read in either order (waiting for the ack alone once listed the silence not yet synced)
    sync_until(env, "SELECT (SELECT COUNT(*) FROM acks) * (SELECT COUNT(*) FROM silences)")

    assert main(["alerts", "list"]) == 0
    states = {line.split()[0]: line.split()[1] for line in capsys.readouterr().out.splitlines()}
    # (the helper's rule is in no rule file here: no engine would resolve these, hence retired)
    assert states == {d1.fingerprint: "firing+silenced+retired", d2.fingerprint: "firing+acked+retired"}
    assert main(["alerts", "show", d1.alert_id[:10]]) == 0
    shown = orjson.loads(capsys.readouterr().out)
    assert shown["current"]["fingerprint"] == d1.fingerprint and len(shown["transitions"]) == 1

    assert main(["alerts", "unsilence", silence["silence_id"]]) == 0
    capsys.readouterr()
    sync_until(env, "SELECT COUNT(*) FROM silences WHERE ended_by IS NOT NULL")
    assert main(["alerts", "silences"]) == 0
    assert capsys.readouterr().out == ""  # no active silence left
    assert main(["alerts", "dead-letters"]) == 0
    assert main(["alerts", "ack", "ffff-no-such"]) == 2
    assert "no alert match" in capsys.readouterr().err


def test_routes_test_prints_the_receivers_like_amtool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    routes = tmp_path / "routes.yaml"
    routes.write_text(BASE + """
route:
  receiver: ops
  routes:
    - {matchers: ['severity="critical"'], receiver: pager, continue: true}
    - {matchers: ['team=~"plant.*"'], receiver: bus}
""")  # fmt: skip
    run = [sys.executable, "-m", "app", "routes", "test", "--config", str(routes)]
    out = subprocess.run(
        [*run, "severity=critical", "team=plant-ops"], cwd=PROJECT_ROOT, env=child_env(),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert (out.returncode, out.stdout) == (0, "pager,bus\n"), out.stderr
    assert main(["routes", "test", "--config", str(routes), "--labels", "severity=info"]) == 0
    assert main(["routes", "check", str(routes)]) == 1  # loopback receivers: the dispatcher refuses them
    monkeypatch.setenv("APP_WEBHOOK_ALLOW_PRIVATE", "127.0.0.1:9")
    assert main(["routes", "check", str(routes)]) == 0
    routes.write_text(BASE + "route: {receiver: nobody}\n")
    assert main(["routes", "check", str(routes)]) == 1


def test_dead_letters_say_when_each_was_given_up_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("APP_DATA_DIR", str(tmp_path))
    alerts = seed(tmp_path / "alerts.sqlite3")  # one dead notification, updated at Unix 1.0
    assert main(["alerts", "dead-letters"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        f"2024-05-01T10:00:30.000Z  wh-123  ops  attempts=2  alerts={alerts[1].alert_id}  answered 400"
    ]
    assert err.strip() == "1 dead letter(s)"


def test_show_gives_every_time_as_rfc_3339(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("APP_DATA_DIR", str(tmp_path))
    alerts = seed(tmp_path / "alerts.sqlite3")  # its notification was queued and given up at Unix 1.0
    assert main(["alerts", "show", alerts[1].alert_id]) == 0
    shown = orjson.loads(capsys.readouterr().out)
    [notification] = shown["notifications"]
    assert (notification["msg_id"], notification["status"]) == ("wh-123", "dead")
    assert (notification["queued_at"], notification["updated_at"]) == ("2024-05-01T10:00:30.000Z",) * 2
    assert shown["current"]["starts_at"] == alerts[1].starts_at


def test_list_marks_the_alerts_whose_rule_was_removed_or_edited(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No engine resolves an episode its rule no longer runs (docs/rules.md, hot reload): the
    list says which, from the rule files as the engines load them."""
    rules = tmp_path / "rules"
    monkeypatch.setenv("APP_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("APP_RULES_DIR", str(rules))
    seed_with_a_running_rule(tmp_path, rules)
    assert main(["alerts", "list", "--status", "all"]) == 0
    states = {(line.split()[3], line.split()[-1].split(",")[0]): line.split()[1]
              for line in capsys.readouterr().out.splitlines()}  # fmt: skip
    assert states == {
        ("machine-overheat", "device_id=pump-1"): "firing",  # the version that runs
        ("machine-overheat", "device_id=pump-7"): "firing+retired",  # another version
        ("machine-overheat", "device_id=pump-9"): "firing+retired",
        ("machine-overheat", "device_id=fan-1"): "resolved",  # ended: nothing is owed
        ("vehicle-geofence", "device_id=vehicle-01"): "firing+retired",  # no such rule now
    }
    (rules / "iot.yaml").write_text(RUNNING.replace("temperature >", "temprature >"))
    assert main(["alerts", "list"]) == 0  # the files do not load: the engines keep their last rules
    out, err = capsys.readouterr()
    assert "+retired" not in out and "the rule files do not load" in err


def test_resolve_retired_resolves_each_retired_firing_alert_and_no_other(
    broker: KafkaBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    rules = tmp_path / "rules"
    for k, v in {"KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap, "APP_DATA_DIR": str(tmp_path),
                 "APP_RULES_DIR": str(rules)}.items():  # fmt: skip
        monkeypatch.setenv(k, v)
    alerts, running = seed_with_a_running_rule(tmp_path, rules)
    assert main(["alerts", "resolve", "--retired"]) == 0  # without --yes: what it would resolve
    out, err = capsys.readouterr()
    assert sorted(line.split()[0] for line in out.splitlines()) == sorted(
        a.fingerprint for a in (alerts[1], alerts[2], alerts[5])
    )
    assert "3 retired alert(s) would be resolved" in err and "--yes" in err
    assert main(["alerts", "resolve", "--retired", "--yes", "--by", "ann"]) == 0
    out, err = capsys.readouterr()
    sent = [orjson.loads(line) for line in out.splitlines()]
    pump7, pump9, vehicle = alerts[1], alerts[2], alerts[5]
    assert sorted((c["type"], c["fingerprint"], c["starts_at"]) for c in sent) == sorted(
        ("resolve", a.fingerprint, a.starts_at) for a in (pump7, pump9, vehicle)
    )
    assert running not in {c["fingerprint"] for c in sent}
    assert {c["comment"] for c in sent} == {"its rule was removed or edited"} and "3 retired" in err
    assert main(["alerts", "resolve"]) == 2  # neither an alert nor --retired
    assert main(["alerts", "resolve", pump7.fingerprint, "--retired"]) == 2
    assert "name an alert, or give --retired" in capsys.readouterr().err
