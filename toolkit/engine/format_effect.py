"""What the served weight format buys on this machine, measured on the embedded engine alone.

A sweep through Triton measures the deployment, but not what its quantization changed: that needs the same
model unquantized on the same engine, at the same minute (this VM's memory speed flips within seconds, so two
runs minutes apart compare the machine, not the formats). Here the built engine's runner and one over the
original model in bf16 decode in alternating slices (toolkit/engine/runtime/step_timing.py), at one sequence,
where a step reads every weight and fewer bytes are faster, and at the sweep's largest concurrency, where a CPU
step can turn compute-bound and a format's unpacking can cost more than its bytes save. Their ratios stand
beside the ratio of the weight bytes and the planner's prediction. `toolkit ab` measures the same question end
to end through the server, with its interval, in minutes.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from toolkit.errors import ToolkitError

FORMAT_EFFECT_FILE = "format_effect.json"  # beside a run's summary.json; the report shows it where present
REFERENCE = "bf16"  # the engine runs an unquantized model in bf16 (toolkit/plan/roofline.py weights_for)


@dataclass(frozen=True)
class FormatEffect:
    qformat: str
    weight_format: str  # the kernels the engine runs the checkpoint on (fp8-a8, int4-g128-int8act, ...)
    weight_bytes: int
    reference_weight_bytes: int  # the same model unquantized, in bf16, on the same engine
    isl: int  # the context the steps decode at
    # median decode step (ms) at each batch measured, this format's and the reference's
    step_ms: dict[int, float] = field(default_factory=dict)
    reference_step_ms: dict[int, float] = field(default_factory=dict)
    # the planner's decode step, this format's over bf16's, at the batches its plan gives (plan.json: 1, the deployment's)
    planner_ratios: dict[int, float] = field(default_factory=dict)

    def ratio(self, batch: int) -> float:
        return self.step_ms[batch] / self.reference_step_ms[batch]

    @property
    def bytes_ratio(self) -> float:
        return self.weight_bytes / self.reference_weight_bytes


def planner_ratios(plan: dict | None, qformat: str) -> dict[int, float]:
    """The plan's decode step at `qformat`'s weights over bf16's, from its per-format table: at batch 1 and at the
    deployment's batch ({} where the plan has no such table)."""
    from toolkit.plan.roofline import weights_for

    formats = {f.get("weights"): f for f in (plan or {}).get("formats", [])}
    ours, reference = formats.get(weights_for(qformat)), formats.get(REFERENCE)
    if not ours or not reference:
        return {}
    ratios = {1: ours["decode_step_batch1_s"] / reference["decode_step_batch1_s"]}
    batch = (plan.get("deployment") or {}).get("batch")
    if batch and batch != 1:
        ratios[batch] = ours["decode_step_s"] / reference["decode_step_s"]
    return ratios


def refuse_what_memory_cannot_hold(params: int) -> None:
    """The format effect holds the model twice: quantized, and unquantized in bf16 (2 bytes a parameter, the larger);
    where that is over what this machine has free it says so instead of swapping (Linux's MemAvailable)."""
    try:
        with open("/proc/meminfo") as meminfo:
            free = next(int(line.split()[1]) * 1024 for line in meminfo if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return  # not Linux: no figure to hold it against
    needed = 4 * params  # bf16 weights, plus as much again for the quantized copy and loading (an upper bound)
    if needed > free:
        raise ToolkitError(f"comparing this model's format with bf16 needs ~{needed / 2**30:.1f} GiB of memory "
                           f"({params / 1e9:.2f} B parameters held twice), and {free / 2**30:.1f} GiB is free",
                           "free memory, or compare formats through the server with `toolkit ab` on a machine that "
                           "holds one copy at a time")


def measure_format_effect(engine_dir: Path, reference_dir: Path, qformat: str, *, batches: tuple[int, ...] = (1,),
                          isl: int = 128, slices: int = 12, planner: dict[int, float] | None = None,
                          threads: int | None = None, numa: str | int = "auto") -> FormatEffect:
    """Decode steps at each of `batches` of the CPU engine built at `engine_dir` and of the unquantized model at
    `reference_dir` on the same engine options (activation and KV dtypes; threads and NUMA binding as the served
    engine's, engine.cpu_threads / cpu_numa), alternating; a few seconds each."""
    from toolkit.engine.runtime.cpu_binding import bound, engine_binding
    from toolkit.engine.runtime.layout import CHECKPOINT_SUBDIR, ENGINE_CONFIG_FILE
    from toolkit.engine.runtime.model_runner import ModelRunner
    from toolkit.engine.runtime.step_timing import alternating_decode_steps

    limits = json.loads((Path(engine_dir) / ENGINE_CONFIG_FILE).read_text())
    block = limits["tokens_per_block"]
    kv_dtype = limits.get("kv_cache_dtype") or "none"
    options = dict(num_blocks=max(batches) * -(-(isl + 256) // block), block_size=block,
                   dtype=limits.get("dtype", "auto"), kv_cache_dtype="auto" if kv_dtype == "none" else kv_dtype,
                   prompt_gemm_dtype=limits.get("prompt_gemm_dtype"), threads=threads, numa=numa)
    # The runners bind the process as the served engine binds its own (cpu_binding.py); this one goes on to other work
    # (and starts processes, which would inherit the binding), so it is undone after.
    with bound(engine_binding(numa, threads)):
        served = ModelRunner(Path(engine_dir) / CHECKPOINT_SUBDIR,
                             int4_activations=limits.get("int4_activations", "auto"), **options)
        reference = ModelRunner(reference_dir, **options)
        for runner in (served, reference):
            runner.warm_up(max(batches), isl)
        steps, reference_steps = {}, {}
        for batch in batches:
            step, reference_step = alternating_decode_steps([served, reference], isl, block, batch=batch, slices=slices)
            steps[batch], reference_steps[batch] = round(step * 1e3, 3), round(reference_step * 1e3, 3)
    return FormatEffect(qformat, served.weight_format, int(served.weight_bytes), int(reference.weight_bytes), isl,
                        steps, reference_steps, {b: r for b, r in (planner or {}).items() if b in steps})


def write_format_effect(effect: FormatEffect, run_dir: Path) -> Path:
    path = Path(run_dir) / FORMAT_EFFECT_FILE
    path.write_text(json.dumps(asdict(effect), indent=2) + "\n")
    return path


def read_format_effect(run_dir: Path) -> FormatEffect | None:
    path = Path(run_dir) / FORMAT_EFFECT_FILE
    try:
        raw = json.loads(path.read_text())
        for key in ("step_ms", "reference_step_ms", "planner_ratios"):  # JSON keys are strings
            raw[key] = {int(batch): value for batch, value in raw.get(key, {}).items()}
        return FormatEffect(**raw)
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def format_effect_sentence(effect: FormatEffect) -> str:
    """One sentence on what the format bought (pure)."""
    first, *more = sorted(effect.step_ms)

    def planned(batch: int) -> str:
        return f"planner x{effect.planner_ratios[batch]:.2f}" if batch in effect.planner_ratios else ""

    planner = f"; the planner predicted x{effect.planner_ratios[first]:.2f}" if planned(first) else ""
    also = "".join(f"; at {batch} sequences {effect.step_ms[batch]:.2f} against {effect.reference_step_ms[batch]:.2f} "
                   f"ms (x{effect.ratio(batch):.2f}{'; ' + planned(batch) if planned(batch) else ''})" for batch in more)
    return (f"On the engine alone (decode steps at context {effect.isl}, alternating with the same model unquantized "
            f"in bf16), {effect.qformat} on {effect.weight_format} kernels took {effect.step_ms[first]:.2f} ms a step "
            f"against {effect.reference_step_ms[first]:.2f} ms at {first} sequence{'s' if first > 1 else ''} "
            f"(x{effect.ratio(first):.2f}), reading {effect.weight_bytes / 1e6:.0f} of "
            f"{effect.reference_weight_bytes / 1e6:.0f} MB of weights (x{effect.bytes_ratio:.2f}){planner}{also}."
            f"{_why_no_faster(effect, more)}")


def _why_no_faster(effect: FormatEffect, batches: list[int]) -> str:
    """Where the format read fewer bytes and still took as long as bf16 (a larger batch on a CPU), why: a reader
    who sees fp8 slower than bf16 at 8 sequences should not conclude that fewer bytes cost time."""
    slower = [b for b in batches if effect.ratio(b) >= 1.0 and effect.bytes_ratio < 1.0]
    if not slower:
        return ""
    batch = slower[0]
    return (f" At {batch} sequences it is no faster: such a step does {batch} times the arithmetic on the same weights, "
            f"so its time is set by how fast the kernel computes, not by the bytes the format saves, and on this CPU "
            f"the {effect.weight_format} kernel computes no faster than bf16's (`toolkit plan` gives the batch where "
            f"each format turns compute-bound).")
