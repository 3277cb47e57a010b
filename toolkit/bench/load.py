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


class Budget:
    """A step's bounds: its request count and/or duration, whichever comes first, or a stop."""

    def __init__(self, max_requests: int | None, duration_s: float | None):
        self.max_requests = max_requests
        self.deadline = time.perf_counter() + duration_s if duration_s else None
        self.issued = 0
        self.stop = asyncio.Event()

    def more(self) -> bool:
        if self.stop.is_set() or (self.max_requests is not None and self.issued >= self.max_requests):
            return False
        return self.deadline is None or time.perf_counter() < self.deadline

    def take(self) -> bool:
        """Count one request if the bounds allow it."""
        if not self.more():
            return False
        self.issued += 1
        return True


async def drive(shape: LoadShape, next_request: Callable[[], object | None],
                send: Callable[[object], Awaitable[bool]], budget: Budget | None = None) -> None:
    """Call `send(item)` per the load shape. `next_request()` returns None when nothing is left;
    `send` returns False to stop the step (e.g. the server is gone). A shared `budget` bounds several
    drives together (a mixed workload's classes)."""
    budget = budget or Budget(shape.max_requests, shape.duration_s)
    stop = budget.stop

    def take():
        if not budget.more():
            return None
        item = next_request()
        if item is not None:
            budget.take()
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
