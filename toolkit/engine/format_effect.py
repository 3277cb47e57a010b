"""What the served weight format buys on this machine, measured on the embedded engine alone.

A sweep through Triton measures the deployment, but not what its quantization changed: that needs the same
model unquantized on the same engine, at the same minute (this VM's memory speed flips within seconds, so two
runs minutes apart compare the machine, not the formats). Here the built engine's runner and one over the
original model in bf16 decode one sequence in alternating slices (toolkit/engine/runtime/step_timing.py), and
the ratio of their steps stands beside the ratio of the weight bytes they read and the planner's prediction.
`toolkit ab` measures the same question end to end through the server, with its interval, in minutes.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

FORMAT_EFFECT_FILE = "format_effect.json"  # beside a run's summary.json; the report shows it where present
REFERENCE = "bf16"  # the engine runs an unquantized model in bf16 (toolkit/plan/roofline.py _cpu_weights)


@dataclass(frozen=True)
class FormatEffect:
    qformat: str
    weight_format: str  # the kernels the engine runs the checkpoint on (fp8-a8, int4-g128-int8act, ...)
    weight_bytes: int
    step_ms: float  # median batch-1 decode step
    reference_weight_bytes: int  # the same model unquantized, in bf16, on the same engine
    reference_step_ms: float
    isl: int  # the context the steps decode at
    planner_ratio: float | None = None  # the planner's batch-1 decode step, this format over bf16 (plan.json)

    @property
    def ratio(self) -> float:
        return self.step_ms / self.reference_step_ms

    @property
    def bytes_ratio(self) -> float:
        return self.weight_bytes / self.reference_weight_bytes


def planner_ratio(plan: dict | None, qformat: str) -> float | None:
    """The plan's batch-1 decode step at `qformat`'s weights over bf16's (its per-format table), or None."""
    steps = {f.get("weights"): f.get("decode_step_batch1_s") for f in (plan or {}).get("formats", [])}
    ours, reference = steps.get("bf16" if qformat == "none" else qformat), steps.get(REFERENCE)
    return ours / reference if ours and reference else None


def measure_format_effect(engine_dir: Path, reference_dir: Path, qformat: str, *, isl: int = 128, slices: int = 12,
                          planner: float | None = None) -> FormatEffect:
    """Batch-1 decode steps of the CPU engine built at `engine_dir` and of the unquantized model at
    `reference_dir` on the same engine options (activation and KV dtypes), alternating; a few seconds."""
    from toolkit.engine.runtime.layout import CHECKPOINT_SUBDIR, ENGINE_CONFIG_FILE
    from toolkit.engine.runtime.model_runner import ModelRunner
    from toolkit.engine.runtime.step_timing import alternating_decode_steps

    limits = json.loads((Path(engine_dir) / ENGINE_CONFIG_FILE).read_text())
    block = limits["tokens_per_block"]
    kv_dtype = limits.get("kv_cache_dtype") or "none"
    options = dict(num_blocks=-(-(isl + 256) // block), block_size=block, dtype=limits.get("dtype", "auto"),
                   kv_cache_dtype="auto" if kv_dtype == "none" else kv_dtype,
                   prompt_gemm_dtype=limits.get("prompt_gemm_dtype"))
    served = ModelRunner(Path(engine_dir) / CHECKPOINT_SUBDIR, int4_activations=limits.get("int4_activations", "auto"),
                         **options)
    reference = ModelRunner(reference_dir, **options)
    for runner in (served, reference):
        runner.warm_up(1, isl)
    step, reference_step = alternating_decode_steps([served, reference], isl, block, slices=slices)
    return FormatEffect(qformat, served.weight_format, int(served.weight_bytes), round(step * 1e3, 3),
                        int(reference.weight_bytes), round(reference_step * 1e3, 3), isl, planner)


def write_format_effect(effect: FormatEffect, run_dir: Path) -> Path:
    path = Path(run_dir) / FORMAT_EFFECT_FILE
    path.write_text(json.dumps(asdict(effect), indent=2) + "\n")
    return path


def read_format_effect(run_dir: Path) -> FormatEffect | None:
    path = Path(run_dir) / FORMAT_EFFECT_FILE
    try:
        return FormatEffect(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def format_effect_sentence(effect: FormatEffect) -> str:
    """One sentence on what the format bought (pure)."""
    planner = f"; the planner predicted x{effect.planner_ratio:.2f}" if effect.planner_ratio else ""
    return (f"On the engine alone (batch-1 decode steps at context {effect.isl}, alternating with the same model "
            f"unquantized in bf16), {effect.qformat} on {effect.weight_format} kernels took {effect.step_ms:.2f} ms "
            f"a step against {effect.reference_step_ms:.2f} ms (x{effect.ratio:.2f}), reading "
            f"{effect.weight_bytes / 1e6:.0f} of {effect.reference_weight_bytes / 1e6:.0f} MB of weights "
            f"(x{effect.bytes_ratio:.2f}){planner}.")
