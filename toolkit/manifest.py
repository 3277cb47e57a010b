"""Every stage writes `manifest.json` beside its artifacts: inputs, outputs, versions, timings."""

from __future__ import annotations

import json
import platform
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from toolkit.errors import ToolkitError

_TRACKED_PACKAGES = ("torch", "transformers", "nvidia-modelopt", "nvidia-pytriton", "tritonclient", "tensorrt_llm")


def package_versions() -> dict[str, str]:
    versions = {"python": sys.version.split()[0], "platform": platform.platform()}
    for name in _TRACKED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return versions


def write_manifest(directory: Path, stage: str, inputs: dict[str, Any], outputs: dict[str, Any],
                   seconds: float) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    manifest = {
        "stage": stage,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "seconds": round(seconds, 3),
        "inputs": inputs,
        "outputs": outputs,
        "versions": package_versions(),
    }
    path = directory / "manifest.json"
    path.write_text(json.dumps(manifest, indent=2, default=str) + "\n")
    return path


def read_manifest(directory: Path, expected_stage: str, produced_by: str) -> dict[str, Any]:
    """Read a previous stage's manifest, or say which command produces it."""
    path = Path(directory) / "manifest.json"
    if not path.is_file():
        raise ToolkitError(f"{directory} has no manifest.json (no {expected_stage} output there)",
                           f"run `{produced_by}` first")
    manifest = json.loads(path.read_text())
    if manifest.get("stage") != expected_stage:
        raise ToolkitError(f"{path} is a {manifest.get('stage')} manifest, expected {expected_stage}",
                           f"run `{produced_by}` first")
    return manifest
