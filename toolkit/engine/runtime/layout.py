"""Where the embedded engine's files are: a built engine directory, as `toolkit build --target cpu`
writes it and the runtime reads it, and the serving engine's step timeline."""

from pathlib import Path

ENGINE_CONFIG_FILE = "engine_config.json"  # the engine's limits (toolkit/engine/engine_config.py)
CHECKPOINT_SUBDIR = "checkpoint"  # the quantized checkpoint and tokenizer, as ModelOpt exported them

# What the serving engine runs (kernels' weight format, compute dtype, KV dtype, start-up time), written
# beside its Triton model once it is up, so a sweep can record it with the run.
ENGINE_INFO_FILE = "engine_info.json"

# The serving engine appends one JSON line per step here (timeline.py), beside its Triton model, so the
# sweep can copy a run's window of steps into the run folder.
TIMELINE_FILE = "engine_timeline.jsonl"


def timeline_file(repo_dir: str | Path) -> Path:
    return Path(repo_dir) / "tensorrt_llm" / TIMELINE_FILE


def read_engine_info(repo_dir: str | Path) -> dict:
    """The serving engine's engine_info.json ({} when absent: another target, or an older server)."""
    import json

    path = Path(repo_dir) / "tensorrt_llm" / ENGINE_INFO_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
