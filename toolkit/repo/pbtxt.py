"""Small builders for Triton config.pbtxt text (protobuf text format)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TensorSpec:
    name: str
    data_type: str  # TYPE_INT32, TYPE_BOOL, TYPE_STRING, ...
    dims: tuple[int, ...]
    optional: bool = False
    # `reshape: { shape: [ ] }`: a per-request scalar the model receives as [batch] rather than [batch, 1].
    scalar: bool = False
    # Triton may batch requests of different lengths along this tensor (each request keeps its own length).
    ragged: bool = False


def tensor_block(kind: str, specs: list[TensorSpec]) -> str:
    items = []
    for t in specs:
        lines = [f'    name: "{t.name}"', f"    data_type: {t.data_type}", f"    dims: [ {', '.join(map(str, t.dims))} ]"]
        if t.scalar:
            lines.append("    reshape: { shape: [ ] }")
        if t.optional:
            lines.append("    optional: true")
        if t.ragged:
            lines.append("    allow_ragged_batch: true")
        items.append("  {\n" + "\n".join(lines) + "\n  }")
    return f"{kind} [\n" + ",\n".join(items) + "\n]\n"


def parameters_block(params: dict[str, object]) -> str:
    out = []
    for key, value in params.items():
        text = str(value).lower() if isinstance(value, bool) else str(value)
        out.append(f'parameters {{\n  key: "{key}"\n  value: {{ string_value: "{text}" }}\n}}\n')
    return "".join(out)


@dataclass(frozen=True)
class DynamicBatching:
    """Triton's dynamic batcher; for the TensorRT-LLM backend it only hands requests over sooner
    (the backend batches in flight itself). 0 leaves Triton's default (no delay, unbounded queue)."""
    preferred_batch_size: int | None = None
    max_queue_delay_microseconds: int = 0
    max_queue_size: int = 0

    def text(self) -> str:
        lines = []
        if self.preferred_batch_size:
            lines.append(f"  preferred_batch_size: [ {self.preferred_batch_size} ]")
        if self.max_queue_delay_microseconds:
            lines.append(f"  max_queue_delay_microseconds: {self.max_queue_delay_microseconds}")
        if self.max_queue_size:
            lines.append(f"  default_queue_policy: {{ max_queue_size: {self.max_queue_size} }}")
        return "dynamic_batching {\n" + "".join(line + "\n" for line in lines) + "}\n"


def model_config(name: str, backend: str | None, max_batch_size: int, inputs: list[TensorSpec],
                 outputs: list[TensorSpec], params: dict[str, object] | None = None, decoupled: bool = False,
                 instance_count: int = 1, extra: str = "", batching: DynamicBatching | None = None) -> str:
    text = f'name: "{name}"\n'
    if backend:
        text += f'backend: "{backend}"\n'
    else:
        text += 'platform: "ensemble"\n'
    text += f"max_batch_size: {max_batch_size}\n"
    if decoupled:
        text += "model_transaction_policy {\n  decoupled: true\n}\n"
    if batching:
        text += batching.text()
    text += tensor_block("input", inputs) + tensor_block("output", outputs)
    if backend:
        text += f"instance_group [\n  {{\n    count: {instance_count}\n    kind: KIND_CPU\n  }}\n]\n"
    text += parameters_block(params or {}) + extra
    return text


@dataclass(frozen=True)
class EnsembleStep:
    model: str
    inputs: dict[str, str]  # the step model's input name → ensemble tensor
    outputs: dict[str, str]  # the step model's output name → ensemble tensor


def ensemble_scheduling(steps: list[EnsembleStep]) -> str:
    blocks = []
    for step in steps:
        lines = [f'      model_name: "{step.model}"', "      model_version: -1"]
        for key, value in step.inputs.items():
            lines.append(f'      input_map {{\n        key: "{key}"\n        value: "{value}"\n      }}')
        for key, value in step.outputs.items():
            lines.append(f'      output_map {{\n        key: "{key}"\n        value: "{value}"\n      }}')
        blocks.append("    {\n" + "\n".join(lines) + "\n    }")
    return "ensemble_scheduling {\n  step [\n" + ",\n".join(blocks) + "\n  ]\n}\n"
