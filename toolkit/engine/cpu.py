"""Target `cpu`: the engine directory the CPU engine model loads inside Triton.

There is nothing to compile on CPU: the engine is the quantized checkpoint (weights + scales, as
exported by ModelOpt), the tokenizer, and `engine_config.json`. The CPU engine dequantizes the
weights when it loads them (see toolkit/repo/python_models/cpu_engine.py for what it emulates).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from toolkit.engine.engine_config import EngineConfig

CHECKPOINT_SUBDIR = "checkpoint"


def build_cpu_engine(checkpoint_dir: Path, engine_dir: Path, engine: EngineConfig) -> dict:
    target = engine_dir / CHECKPOINT_SUBDIR
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(checkpoint_dir, target, ignore=shutil.ignore_patterns("manifest.json"))
    engine.write(engine_dir)
    return {"checkpoint": str(target), "engine_config": str(engine_dir / "engine_config.json")}
