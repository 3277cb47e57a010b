"""Timing the runner's own steps, without a scheduler, a server or sampling: synthetic sequences on disjoint
KV blocks, prefilled, then decoded one token a step. What perf/engine_bench.py measures the engine with, and
what the demo's format effect (toolkit/engine/format_effect.py) alternates two runners on."""

from __future__ import annotations

import statistics
import time


def synthetic_steps(batch: int, isl: int, block_size: int, vocab_size: int = 1004, start_token: int = 5):
    """(prefill(seq) -> StepInput, decode(pos) -> StepInput, blocks used): `batch` sequences of an `isl`-token
    prompt each, on disjoint block ranges with room for 256 more tokens; decode(pos) writes every sequence's
    token at position `pos`. Token ids stay below vocab_size (ids 0-3 are the tokenizers' specials)."""
    import torch

    from toolkit.engine.runtime.step import StepInput, int64_tensor

    per_seq = -(-(isl + 256) // block_size)
    tables = [list(range(s * per_seq, (s + 1) * per_seq)) for s in range(batch)]
    ids = min(1000, vocab_size - 4)
    prompt = [(start_token + i * 7) % ids + 4 for i in range(isl)]
    token = min(11, vocab_size - 1)

    def prefill(seq: int) -> StepInput:
        slots = torch.tensor([tables[seq][p // block_size] * block_size + p % block_size for p in range(isl)])
        return StepInput(torch.tensor(prompt), torch.arange(isl), [isl], [isl], [tables[seq][: -(-isl // block_size)]],
                         slots, torch.tensor([isl - 1]))

    def decode(pos: int) -> StepInput:  # built as the scheduler builds a step (build_step_input)
        slots = int64_tensor([tables[s][pos // block_size] * block_size + pos % block_size for s in range(batch)])
        n = pos + 1
        return StepInput(int64_tensor([token] * batch), int64_tensor([pos] * batch), [1] * batch, [n] * batch,
                         [t[: -(-n // block_size)] for t in tables], slots, int64_tensor(range(batch)))

    return prefill, decode, per_seq * batch


def device_sync(runner):
    """What waits for the runner's device: a CUDA step returns once its kernels are queued, not run."""
    import torch

    return torch.cuda.synchronize if str(runner.device).startswith("cuda") else (lambda: None)


def prefilled(runner, batch: int, isl: int, block_size: int):
    """`batch` synthetic sequences of `isl` tokens prefilled on `runner`: their decode(pos) -> StepInput."""
    prefill, decode, _ = synthetic_steps(batch, isl, block_size, runner.spec.vocab_size)
    for seq in range(batch):
        runner.forward(prefill(seq))
    return decode


def median_decode_step(runner, batch: int, isl: int, steps: int, block_size: int) -> float:
    """`batch` sequences prefilled with `isl` tokens, then `steps` decode steps: the median step (the first two
    left out: caches and allocator settling), in seconds."""
    import torch

    decode = prefilled(runner, batch, isl, block_size)
    sync = device_sync(runner)
    times = []
    for pos in range(isl, isl + steps):
        sync()
        start = time.perf_counter()
        logits = runner.forward(decode(pos))
        sync()
        times.append(time.perf_counter() - start)
    assert torch.isfinite(logits).all()
    return statistics.median(times[2:])


def alternating_decode_steps(runners: list, isl: int, block_size: int, batch: int = 1, slices: int = 12,
                             steps_per_slice: int = 8) -> list[float]:
    """Decode steps of `batch` sequences on several runners in alternating slices (the order reversed every slice),
    so that each samples the same minutes of a machine whose speed drifts: each runner's median step, in seconds
    (every slice's first step left out: the other runner's slice evicted the caches)."""
    plans, times = [], [[] for _ in runners]
    for runner in runners:
        decode = prefilled(runner, batch, isl, block_size)
        # built once, outside the timing; the same positions every slice: the bytes a step reads do not change
        plans.append([decode(pos) for pos in range(isl, isl + steps_per_slice)])
    for i in range(slices):
        order = range(len(runners)) if i % 2 == 0 else reversed(range(len(runners)))
        for r in order:
            runner, sync = runners[r], device_sync(runners[r])
            for n, step in enumerate(plans[r]):
                sync()
                start = time.perf_counter()
                runner.forward(step)
                sync()
                if n > 0:
                    times[r].append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]
