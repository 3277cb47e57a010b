"""Mixed workload: the sweep's own requests (class "short", at the step's load) plus long prompts
(class "long", `long_input_tokens` in, `long_output_tokens` out) arriving at `long_rate` requests/s.
Each long prompt's prefill shares the engine's steps with the short requests' decodes: without
chunked prefill, the short streams stall for the whole prefill (the noisy neighbour). The step ends
when the short class has sent its requests (or at the step's duration); metrics come per class.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from toolkit.bench.load import Budget, LoadShape
from toolkit.bench.workloads.base import StepSpec, Workload, check_fits, drive_pool


class MixedWorkload(Workload):
    kind = "mixed"

    def __init__(self, settings, factory):
        super().__init__(settings, factory)
        w = settings.workload
        check_fits(settings, w.long_input_tokens, w.long_output_tokens, "the mixed workload's long class")

    async def run(self, step: StepSpec, shape: LoadShape, send) -> None:
        w = self.settings.workload
        short = [replace(p, request_class="short") for p in self.prompts(step, shape)]
        long = [replace(self.factory.make(w.long_input_tokens, w.long_output_tokens), request_class="long")
                for _ in range(16)]
        long_budget = Budget(None, shape.duration_s)
        long_shape = LoadShape("rate", w.long_rate, shape.arrival, seed=shape.seed + 1)
        neighbour = asyncio.create_task(drive_pool(long, long_shape, send, long_budget))
        try:
            await drive_pool(short, shape, send)
        finally:
            long_budget.stop.set()
            await neighbour
