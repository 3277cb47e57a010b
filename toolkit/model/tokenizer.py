"""Loading and saving tokenizers with clear errors, in a form transformers 4.x and 5.x both load."""

from __future__ import annotations

import json
from pathlib import Path

from toolkit.errors import ToolkitError


def tokenizer_class(directory: Path) -> str | None:
    """The class tokenizer_config.json names (what AutoTokenizer resolves), or None."""
    try:
        return json.loads((directory / "tokenizer_config.json").read_text()).get("tokenizer_class")
    except (OSError, ValueError, AttributeError):
        return None


def load_tokenizer(directory: str | Path):
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    directory = Path(directory)
    if not directory.is_dir():
        raise ToolkitError(f"tokenizer directory {directory} does not exist", "point at the checkpoint directory")
    if not any((directory / f).is_file() for f in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        raise ToolkitError(f"{directory} has no tokenizer (tokenizer.json / tokenizer.model)",
                           "copy the tokenizer files beside config.json, or run `toolkit init-model`")
    # A fast tokenizer named as such (save_portable_tokenizer writes it so; many hub checkpoints too) loads as that
    # class directly: AutoTokenizer resolves the same class, but first imports the model's configuration module and
    # with it much of transformers' modeling code, ~1.1 s of every sweep's start (2026-11-28, this 2-core machine).
    direct = tokenizer_class(directory) == "PreTrainedTokenizerFast" and (directory / "tokenizer.json").is_file()
    try:
        return (PreTrainedTokenizerFast if direct else AutoTokenizer).from_pretrained(str(directory))
    except Exception as exc:  # transformers raises many types; the user needs the one line
        raise ToolkitError(f"cannot load the tokenizer in {directory}: {str(exc).splitlines()[0]}",
                           "check tokenizer_config.json and tokenizer.json") from None


def save_portable_tokenizer(tokenizer, out_dir: Path) -> None:
    tokenizer.save_pretrained(str(out_dir))
    # transformers 5 writes "TokenizersBackend", which 4.x (e.g. in older Triton containers) cannot load.
    path = Path(out_dir) / "tokenizer_config.json"
    cfg = json.loads(path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(cfg, indent=2) + "\n")
