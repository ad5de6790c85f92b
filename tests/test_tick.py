"""The worker's shared step (gazeguard.jetstream.tick.Ticks): what many tasks hand in meanwhile is
processed together, each caller released when its step is over, a step's error raised to every
caller of that step, a cancelled caller not cancelling the others' step."""

from __future__ import annotations

import asyncio
import time

import pytest

from gazeguard.jetstream.tick import Ticks


class _Recorder:
    def __init__(self, fail_on: int | None = None, hold: asyncio.Event | None = None) -> None:
        self.steps: list[list[int]] = []
        self.over: list[int] = []  # steps finished, by index
        self.fail_on = fail_on
        self.hold = hold

    async def __call__(self, items: list[int]) -> None:
        index = len(self.steps)
        self.steps.append(list(items))
        if self.hold is not None:
            await self.hold.wait()
        if index == self.fail_on:
            raise ValueError(f"step {index} failed")
        self.over.append(index)


async def _with_ticks(ticks: Ticks[int], body: object) -> None:
    runner = asyncio.create_task(ticks.run())
    try:
        await body  # type: ignore[misc]
    finally:
        runner.cancel()
        with pytest.raises(asyncio.CancelledError):
            await runner


def test_callers_of_one_period_share_one_step_in_order() -> None:
    async def main() -> None:
        rec = _Recorder()
        ticks: Ticks[int] = Ticks(rec, period_s=0.2)

        async def body() -> None:
            await ticks.submit([1])  # after a quiet spell: at once
            started = time.monotonic()
            # three callers within the period: one step, their items in hand-in order
            await asyncio.gather(ticks.submit([2, 3]), ticks.submit([4]), ticks.submit([5]))
            waited = time.monotonic() - started
            assert rec.steps == [[1], [2, 3, 4, 5]]
            assert rec.over == [0, 1]
            assert waited >= 0.15  # the second step waited for its period
            assert (ticks.steps, ticks.items) == (2, 5)

        await _with_ticks(ticks, body())

    asyncio.run(main())


def test_submit_returns_only_once_its_step_is_over() -> None:
    async def main() -> None:
        hold = asyncio.Event()
        rec = _Recorder(hold=hold)
        ticks: Ticks[int] = Ticks(rec, period_s=0.0)

        async def body() -> None:
            caller = asyncio.create_task(ticks.submit([7]))
            for _ in range(20):
                await asyncio.sleep(0)
            assert rec.steps == [[7]] and not caller.done()  # step started, not over
            # a caller arriving meanwhile goes to the next step, which may overlap
            other = asyncio.create_task(ticks.submit([8]))
            for _ in range(20):
                await asyncio.sleep(0)
            assert rec.steps == [[7], [8]]
            hold.set()
            await asyncio.gather(caller, other)
            assert sorted(rec.over) == [0, 1]

        await _with_ticks(ticks, body())

    asyncio.run(main())


def test_a_failed_step_raises_in_every_caller_and_the_next_step_runs() -> None:
    async def main() -> None:
        rec = _Recorder(fail_on=0)
        ticks: Ticks[int] = Ticks(rec, period_s=0.05)

        async def body() -> None:
            results = await asyncio.gather(
                ticks.submit([1]), ticks.submit([2]), return_exceptions=True
            )
            assert [type(r) for r in results] == [ValueError, ValueError]
            await ticks.submit([3])
            assert rec.steps == [[1, 2], [3]] and rec.over == [1]

        await _with_ticks(ticks, body())

    asyncio.run(main())


def test_a_cancelled_caller_does_not_cancel_the_others_step() -> None:
    async def main() -> None:
        hold = asyncio.Event()
        rec = _Recorder(hold=hold)
        ticks: Ticks[int] = Ticks(rec, period_s=0.0)

        async def body() -> None:
            gone = asyncio.create_task(ticks.submit([1]))
            stays = asyncio.create_task(ticks.submit([2]))
            for _ in range(20):
                await asyncio.sleep(0)
            assert rec.steps == [[1, 2]]
            gone.cancel()
            with pytest.raises(asyncio.CancelledError):
                await gone
            hold.set()
            await stays  # its step ran to the end
            assert rec.over == [0]

        await _with_ticks(ticks, body())

    asyncio.run(main())


def test_stopping_cancels_the_step_in_progress_and_its_callers() -> None:
    async def main() -> None:
        rec = _Recorder(hold=asyncio.Event())  # never set
        ticks: Ticks[int] = Ticks(rec, period_s=0.0)
        runner = asyncio.create_task(ticks.run())
        caller = asyncio.create_task(ticks.submit([1]))
        for _ in range(20):
            await asyncio.sleep(0)
        assert rec.steps == [[1]]
        runner.cancel()
        with pytest.raises(asyncio.CancelledError):
            await runner
        with pytest.raises(asyncio.CancelledError):
            await caller
        assert rec.over == []

    asyncio.run(main())
