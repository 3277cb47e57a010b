"""Text the project ships: tokenizer training, calibration and held-out evaluation (no downloads)."""

from importlib import resources


def corpus_paragraphs() -> list[str]:
    text = resources.files(__package__).joinpath("corpus.txt").read_text()
    return [p.strip() for p in text.split("\n\n") if p.strip()]


def calibration_texts() -> list[str]:
    """All but the last three paragraphs: what ModelOpt calibrates on."""
    return corpus_paragraphs()[:-3]


def heldout_texts() -> list[str]:
    """The last three paragraphs: never calibrated on, used by the quantization quality gate."""
    return corpus_paragraphs()[-3:]


def workload_sample(name: str):
    """A shipped workload sample (toolkit/data/workloads/): ShareGPT JSON, prompts JSONL, Mooncake trace."""
    return resources.files(__package__).joinpath("workloads", name)
