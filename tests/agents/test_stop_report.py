"""What a slow stop logs: each task's chain of awaits, down to what it waits on."""

from __future__ import annotations

import asyncio

from agents.transport import awaiting


async def _inner(event: asyncio.Event) -> None:
    await event.wait()


async def _outer(event: asyncio.Event) -> None:
    await _inner(event)


def test_awaiting_follows_each_task_down_to_what_it_waits_on() -> None:
    async def main() -> str:
        event = asyncio.Event()
        task = asyncio.create_task(_outer(event), name="stuck")
        await asyncio.sleep(0)
        text = awaiting()
        event.set()
        await task
        return text

    text = asyncio.run(main())
    stuck = text.split("task stuck:\n")[1].split("\ntask ")[0].splitlines()
    assert [line.split()[1] for line in stuck[:3]] == ["_outer", "_inner", "wait"]
    assert "test_stop_report.py" in stuck[0]
    assert "of <asyncio.locks.Event" in stuck[2]
    assert stuck[3].startswith("  awaits ")  # the future itself (its iterator, as asyncio shows it)
