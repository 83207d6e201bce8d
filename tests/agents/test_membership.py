"""agents.membership: which member of the group holds this worker's static id."""

from __future__ import annotations

from types import SimpleNamespace

from agents.membership import Member, members_of, twin, twin_message

UUID = "6f83038f-9b3a-4668-9024-6f7b7737b562"
MINE = f"pod-1-{'0' * 8}-0000-0000-0000-{'0' * 12}"


def test_another_member_under_this_id_is_a_twin_and_this_workers_own_is_not() -> None:
    other = Member(f"pod-1-{UUID}", "/10.0.0.7")
    assert twin("pod-1", MINE, [Member(MINE, "/10.0.0.5"), other]) == other
    assert twin("pod-1", MINE, [Member(MINE, "/10.0.0.5")]) is None
    assert twin("pod-1", MINE, []) is None  # the session ran out: the place is free


def test_an_id_that_merely_begins_with_this_one_and_a_dynamic_member_are_not_twins() -> None:
    members = [
        Member(f"pod-11-{UUID}", "/h"),  # another worker's id, "pod-11"
        Member(f"pod-1-2-{UUID}", "/h"),  # "pod-1-2"
        Member(f"faust-0.15.3-{UUID}", "/h"),  # a dynamic member: the client id, then a UUID
        Member("pod-1", "/h"),
    ]
    assert twin("pod-1", MINE, members) is None


def test_the_members_are_read_from_aiokafkas_raw_describe_groups_answer() -> None:
    member = (f"pod-1-{UUID}", "faust-0.15.3", "/127.0.0.1", b"", b"")
    stranger = ("x", "c", "/h", b"", b"")
    groups = [
        (0, "streamalert-rules", "Stable", "consumer", "faust", [member], 0),
        (0, "other-group", "Stable", "consumer", "range", [stranger], 0),
    ]
    answer = SimpleNamespace(groups=groups)
    assert members_of([answer], "streamalert-rules") == [Member(f"pod-1-{UUID}", "/127.0.0.1")]


def test_the_message_names_the_setting_the_other_member_and_what_to_do() -> None:
    msg = twin_message("pod-1", Member(f"pod-1-{UUID}", "/10.0.0.7"))
    assert msg.startswith("APP_WORKER_INSTANCE_ID='pod-1': another worker joined the group with this id")
    assert f"pod-1-{UUID} from /10.0.0.7" in msg and "each worker needs an id of its own" in msg
