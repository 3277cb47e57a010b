"""LLM deployment toolkit: quantize → build → Triton repository → serve → sweep → report."""

__version__ = "0.1.0"
