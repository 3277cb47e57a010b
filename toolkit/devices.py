"""Where torch work runs: a setting's cpu / cuda / auto resolved against what torch sees, in one place."""

from __future__ import annotations

from toolkit.errors import ToolkitError


def resolve_device(choice: str, setting: str, others: str = "cpu") -> str:
    """"cuda" or "cpu" for a setting's value: auto takes the GPU when torch sees one; cuda without one is refused,
    naming the setting and the `others` values it takes."""
    import torch

    if choice == "cpu":
        return "cpu"
    if torch.cuda.is_available():
        return "cuda"
    if choice == "cuda":
        raise ToolkitError(f"{setting} is cuda but torch sees no CUDA device "
                           f"(torch {torch.__version__}, built {'with' if torch.version.cuda else 'without'} CUDA)",
                           f"set {setting}: {others}, or run on a GPU machine with a CUDA build of torch "
                           "(the NGC container's)")
    return "cpu"
