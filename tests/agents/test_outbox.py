"""The worker's Outbox: a record the producer could not deliver stops the worker and fails the commit."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agents.wiring import Outbox


class _Producer:
    """Stands in for Faust's producer: ``send`` returns the delivery future, settled by the test."""

    def __init__(self) -> None:
        self.futures: list[asyncio.Future[Any]] = []

    async def send(self, *_args: Any) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.futures.append(fut)
        return fut


class _App:
    def __init__(self) -> None:
        self.producer = _Producer()
        self.crashed: list[BaseException] = []

    async def crash(self, reason: BaseException) -> None:
        self.crashed.append(reason)


def test_delivered_records_leave_the_commit_alone() -> None:
    async def run() -> Outbox:
        app = _App()
        box = Outbox(app)  # type: ignore[arg-type]
        await box.send("alerts", b"k", b"v")
        app.producer.futures[0].set_result(None)
        await asyncio.sleep(0)
        return box

    box = asyncio.run(run())
    box.check()  # no exception: the commit may go ahead
    assert box.failed is None


def test_an_undelivered_record_crashes_the_worker_and_fails_the_commit() -> None:
    async def run() -> tuple[_App, Outbox]:
        app = _App()
        box = Outbox(app)  # type: ignore[arg-type]
        await box.send("alerts", b"k1", b"v1")
        await box.send("alerts", b"k2", b"v2")
        app.producer.futures[0].set_exception(ConnectionError("broker gone"))
        app.producer.futures[1].set_exception(ConnectionError("again"))
        for _ in range(3):
            await asyncio.sleep(0)
        return app, box

    app, box = asyncio.run(run())
    assert [str(e) for e in app.crashed] == ["broker gone"]  # once, for the first failure
    with pytest.raises(RuntimeError, match="not delivered") as info:
        box.check()
    assert isinstance(info.value.__cause__, ConnectionError)
