"""Load generation: when each request is sent. Concurrency mode keeps N in flight; rate mode sends on a
schedule (constant gaps, or exponential gaps = Poisson arrivals), optionally capped in flight.
Each step ends after its request count and/or duration, whichever comes first."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, Iterator


@dataclass(frozen=True)
class LoadShape:
    mode: str  # concurrency | rate
    level: float  # concurrency (requests in flight) or rate (requests/s)
    arrival: str = "poisson"
    max_concurrency: int | None = None
    max_requests: int | None = None
    duration_s: float | None = None
    seed: int = 0

    @property
    def max_in_flight(self) -> int | None:
        """The most requests this shape keeps in flight, where it bounds them."""
        return int(self.level) if self.mode == "concurrency" else self.max_concurrency


def arrival_gaps(rate: float, arrival: str, seed: int) -> Iterator[float]:
    """Seconds between consecutive sends."""
    rng = random.Random(seed)
    while True:
        yield 1.0 / rate if arrival == "constant" else rng.expovariate(rate)


async def drive(shape: LoadShape, next_request: Callable[[], object | None],
                send: Callable[[object], Awaitable[bool]]) -> None:
    """Call `send(item)` per the load shape. `next_request()` returns None when nothing is left;
    `send` returns False to stop the step (e.g. the server is gone)."""
    deadline = time.perf_counter() + shape.duration_s if shape.duration_s else None
    issued = 0
    stop = asyncio.Event()

    def more() -> bool:
        if stop.is_set() or (shape.max_requests is not None and issued >= shape.max_requests):
            return False
        return deadline is None or time.perf_counter() < deadline

    def take():
        nonlocal issued
        if not more():
            return None
        item = next_request()
        if item is not None:
            issued += 1
        return item

    async def run(item) -> None:
        if not await send(item):
            stop.set()

    if shape.mode == "concurrency":
        async def worker():
            while (item := take()) is not None:
                await run(item)

        await asyncio.gather(*(worker() for _ in range(int(shape.level))))
        return

    cap = asyncio.Semaphore(shape.max_concurrency) if shape.max_concurrency else None
    tasks = []
    next_send = time.perf_counter()
    for gap in arrival_gaps(shape.level, shape.arrival, shape.seed):
        delay = next_send - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        item = take()
        if item is None:
            break
        if cap:
            await cap.acquire()

        async def one(item=item):
            try:
                await run(item)
            finally:
                if cap:
                    cap.release()

        tasks.append(asyncio.create_task(one()))
        next_send += gap
    await asyncio.gather(*tasks)
