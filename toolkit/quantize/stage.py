"""`toolkit quantize`: ModelOpt calibration on shipped text, quality gate, and checkpoint export.

Exports either a unified Hugging Face checkpoint (`export_hf_checkpoint`; what the CPU engine and
TensorRT-LLM's LLM API load) or a TensorRT-LLM checkpoint with `mapping` for TP × PP
(`export_tensorrt_llm_checkpoint`; what `trtllm-build` reads).
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from toolkit.config import ParallelSection, QuantizeSection
from toolkit.data import calibration_texts, heldout_texts
from toolkit.devices import resolve_device
from toolkit.errors import ToolkitError
from toolkit.manifest import write_manifest
from toolkit.model.spec import load_model_spec
from toolkit.model.tokenizer import load_tokenizer, save_portable_tokenizer
from toolkit.quantize.formats import modelopt_config
from toolkit.quantize.quality import QualityReport, compare_logits, next_token_logits
from toolkit.quantize.shapes import check_tp_shapes


@dataclass
class QuantizeResult:
    checkpoint_dir: Path
    quality: QualityReport | None
    seconds: float


def token_batches(tokenizer, texts: list[str], seq_len: int, limit: int) -> list:
    """Fixed-length token windows over the texts (one long stream, cut into `limit` windows)."""
    import torch

    stream: list[int] = []
    for text in texts:
        stream.extend(tokenizer(text, add_special_tokens=False).input_ids)
    windows = [stream[i:i + seq_len] for i in range(0, len(stream) - seq_len + 1, seq_len)][:limit]
    if not windows:
        raise ToolkitError(f"the shipped text yields fewer than {seq_len} tokens", "lower quantize.calib_seq_len")
    return [torch.tensor([w]) for w in windows]


def quantize_checkpoint(model_dir: Path, out_dir: Path, settings: QuantizeSection,
                        parallel: ParallelSection) -> QuantizeResult:
    import torch

    start = time.perf_counter()
    spec = load_model_spec(model_dir)
    if settings.export == "trtllm":
        check_tp_shapes(spec, settings.qformat, parallel.tp, settings.awq_block_size)
    tokenizer = load_tokenizer(model_dir)
    device = calibration_device(settings.calib_device)
    model = _load_model(model_dir).to(device)

    quality = None
    if settings.qformat != "none":
        import modelopt.torch.quantization as mtq

        mtq_config = modelopt_config(settings.qformat, settings.kv_cache_dtype, device)
        calib = [ids.to(device) for ids in
                 token_batches(tokenizer, calibration_texts(), settings.calib_seq_len, settings.calib_size)]
        heldout = [ids.to(device) for ids in token_batches(tokenizer, heldout_texts(), settings.calib_seq_len, 64)]
        reference = next_token_logits(model, heldout)

        def forward_loop(m):
            with torch.no_grad():
                for ids in calib:
                    m(ids)

        mtq.quantize(model, mtq_config, forward_loop=forward_loop)
        quality = compare_logits(reference, next_token_logits(model, heldout), heldout)
        _enforce_quality_gate(quality, settings)

    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    dtype = export_dtype(declared_dtype(model_dir), settings.export)
    model = model.to(getattr(torch, dtype))
    with torch.inference_mode():
        if settings.export == "trtllm":
            _export_trtllm(model, spec, out_dir, parallel, dtype)
        elif settings.qformat == "none":
            model.save_pretrained(out_dir)
        else:
            from modelopt.torch.export import export_hf_checkpoint

            export_hf_checkpoint(model, export_dir=out_dir)
    save_portable_tokenizer(tokenizer, out_dir)
    seconds = time.perf_counter() - start
    write_manifest(out_dir, "quantize",
                   inputs={"model_dir": str(model_dir), "qformat": settings.qformat,
                           "kv_cache_dtype": settings.kv_cache_dtype, "export": settings.export,
                           "tp": parallel.tp, "pp": parallel.pp, "dtype": dtype, "calibrated_on": device,
                           "calibration": {"samples": settings.calib_size, "seq_len": settings.calib_seq_len,
                                           "text": "toolkit/data/corpus.txt (calibration paragraphs)"}},
                   outputs={"checkpoint_dir": str(out_dir), "bytes_on_disk": dir_size(out_dir),
                            "quality": quality.to_dict() if quality else None},
                   seconds=seconds)
    return QuantizeResult(out_dir, quality, seconds)


def calibration_device(choice: str) -> str:
    """"cuda" or "cpu" for quantize.calib_device: auto takes the GPU when torch sees one."""
    return resolve_device(choice, "quantize.calib_device", others="auto or cpu")


def _load_model(model_dir: Path):
    import torch
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    except Exception as exc:
        raise ToolkitError(f"cannot load the model in {model_dir}: {str(exc).splitlines()[0]}",
                           "point at a complete Hugging Face checkpoint (config.json + *.safetensors)") from None


def _enforce_quality_gate(quality: QualityReport, settings: QuantizeSection) -> None:
    gate = settings.quality
    if not gate.enabled:
        return
    if quality.mean_kl > gate.max_mean_kl or quality.perplexity_ratio > gate.max_perplexity_ratio:
        raise ToolkitError(
            f"{settings.qformat} failed the quality gate: mean KL {quality.mean_kl:.4f} (max {gate.max_mean_kl}), "
            f"perplexity ratio {quality.perplexity_ratio:.3f} (max {gate.max_perplexity_ratio})",
            "try a gentler qformat (fp8, int8_sq), more calibration (quantize.calib_size), "
            "or raise quantize.quality thresholds if this is expected",
        )


def declared_dtype(checkpoint_dir: Path) -> str | None:
    """The dtype a checkpoint's config.json declares (`dtype` in transformers 5, `torch_dtype` before)."""
    path = Path(checkpoint_dir) / "config.json"
    if not path.is_file():
        return None
    config = json.loads(path.read_text())
    return config.get("dtype") or config.get("torch_dtype")


def export_dtype(model_dtype: str | None, export: str) -> str:
    """The checkpoint's dtype: the model's own 16-bit dtype (bfloat16 for Llama-3), so embeddings, lm_head and
    norms are not exported — and then served — in float32. A model that declares float32 (the offline presets)
    stays float32 in the HF export the CPU engine reads, and becomes float16 for TensorRT-LLM."""
    if model_dtype in ("bfloat16", "float16"):
        return model_dtype
    return "float16" if export == "trtllm" else "float32"


def _export_trtllm(model, spec, out_dir: Path, parallel: ParallelSection, dtype: str) -> None:
    import torch
    from modelopt.torch.export import export_tensorrt_llm_checkpoint

    export_tensorrt_llm_checkpoint(model, decoder_type="llama", dtype=getattr(torch, dtype), export_dir=out_dir,
                                   inference_tensor_parallel=parallel.tp,
                                   inference_pipeline_parallel=parallel.pp)
    # With transformers 5 the rope theta lives under rope_parameters and the export drops it;
    # TensorRT-LLM would then silently use 10000.
    path = out_dir / "config.json"
    config = json.loads(path.read_text())
    config["rotary_base"] = spec.rope_theta
    path.write_text(json.dumps(config, indent=2) + "\n")


def dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())
