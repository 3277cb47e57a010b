"""The typed deployment config: read once from configs/*.yaml, overridden by flags, passed down.

Every stage takes a `DeploymentConfig` (or the piece it needs) and derives its artifact paths
from `ArtifactLayout`, so a stage rerun alone finds the previous stage's outputs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from toolkit.errors import ToolkitError
from toolkit.quantize.formats import KV_CACHE_DTYPES, QFORMAT_NAMES
from toolkit.targets import TARGETS, target_of

# From the one quantization-format table (toolkit/quantize/formats.py).
QFormat = Literal[QFORMAT_NAMES]  # type: ignore[valid-type]
KVCacheDType = Literal[KV_CACHE_DTYPES]  # type: ignore[valid-type]
Target = Literal[("auto", *TARGETS)]  # type: ignore[valid-type]


def detect_target() -> str:
    """What is installed decides `engine.target: auto`: TensorRT-LLM → llmapi (its PyTorch backend, the route
    NVIDIA's guide leads with; TensorRT engines only when asked for with engine.target: trtllm); no
    TensorRT-LLM → the CPU engine. Only looks for the package; imports nothing."""
    import importlib.util

    if importlib.util.find_spec("tensorrt_llm") is None:
        return "cpu"
    return "llmapi"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelSection(_Section):
    # `preset:<name>` builds the offline model of that preset; anything else is a local HF checkpoint dir.
    source: str = "preset:tiny"
    name: str | None = None  # defaults to the preset name or the checkpoint directory name

    @property
    def preset(self) -> str | None:
        return self.source.split(":", 1)[1] if self.source.startswith("preset:") else None

    @property
    def display_name(self) -> str:
        return self.name or self.preset or Path(self.source).name


class QualityGate(_Section):
    max_mean_kl: float = Field(0.5, gt=0, description="mean KL(original || quantized) per token, nats")
    max_perplexity_ratio: float = Field(1.5, gt=1, description="quantized / original perplexity")
    enabled: bool = True


class QuantizeSection(_Section):
    qformat: QFormat = "fp8"
    kv_cache_dtype: KVCacheDType = "none"
    calib_size: int = Field(16, gt=0)
    calib_seq_len: int = Field(64, gt=0)
    export: Literal["hf", "trtllm"] = "hf"
    awq_block_size: int = Field(128, gt=0)
    # Where ModelOpt calibrates: auto = the GPU when torch sees one (minutes for an 8B model where the CPU takes
    # hours; NVFP4 calibrates only there), else the CPU.
    calib_device: Literal["auto", "cpu", "cuda"] = "auto"
    quality: QualityGate = QualityGate()


class ParallelSection(_Section):
    tp: int = Field(1, ge=1)
    pp: int = Field(1, ge=1)

    @property
    def world_size(self) -> int:
        return self.tp * self.pp


class EngineSection(_Section):
    target: Target = "cpu"  # auto: picked from what is installed (detect_target)
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "auto"
    max_batch_size: int = Field(8, ge=1)
    max_input_len: int = Field(256, ge=1)
    max_seq_len: int = Field(384, ge=2)
    max_num_tokens: int = Field(1024, ge=1)
    tokens_per_block: int = Field(32, ge=1)
    # CPU engine: the paged KV cache is a fixed number of blocks (no "free GPU memory" to take a fraction of).
    kv_cache_blocks: int = Field(128, ge=1)
    kv_cache_free_gpu_mem_fraction: float = Field(0.9, gt=0, le=1)
    enable_kv_cache_reuse: bool = False
    enable_chunked_context: bool = True
    batch_scheduler_policy: Literal["max_utilization", "guaranteed_no_evict"] = "guaranteed_no_evict"
    use_cuda_graph: bool = True
    workers: int = Field(1, ge=1)
    # Triton's dynamic batcher in front of the engine model (0: Triton's default — no delay, no bound).
    max_queue_delay_microseconds: int = Field(0, ge=0)
    max_queue_size: int = Field(0, ge=0)
    # GPU: cap the paged KV cache in tokens (with the free-memory fraction, the smaller wins); None: no cap.
    max_tokens_in_paged_kv_cache: int | None = Field(None, ge=1)
    # Instances of preprocessing / postprocessing / BLS (every stream's every token passes through them);
    # None: 1 on the CPU target (2 cores), 4 on GPU targets (upstream advises more than one).
    python_model_instances: int | None = Field(None, ge=1)
    # CPU engine: torch threads for its steps; None: every core it may run on. Fewer leaves the serving path
    # (and a client on the same machine) a core, but on 2 cores one thread cost TTFT +60-80 % and 20-30 % of
    # tokens/s for no better ITL (perf/README.md "Engine kernels", the one-thread A/B).
    cpu_threads: int | None = Field(None, ge=1)
    # CPU engine: its NUMA binding (toolkit/engine/runtime/cpu_binding.py). auto: where the CPUs it may run on span
    # several nodes, the node with most of their cores (weights land on the node that loads them; the others would
    # read them over the socket link); off: every CPU it may run on; a number: that node.
    cpu_numa: Literal["auto", "off"] | int = Field("auto")
    # Streaming: each request's tokens go out every this many of its steps (the first at once, the rest with the
    # finish), as TensorRT-LLM's LLM-API stream_interval (vLLM's and SGLang's --stream-interval): fewer responses
    # through Triton, its ensemble and the detokenizer, whose CPU a small host takes from the engine (the CPU demo at
    # 8 streams: ITL 10.6 -> 8.4 ms with 4, `toolkit ab`, perf/README.md). Targets cpu and llmapi; TensorRT-LLM's
    # C++ backend (target trtllm) sends every step's tokens.
    stream_interval: int = Field(1, ge=1)
    # The embedded engine (target cpu) on a GPU: the same engine in torch ops with decode steps replayed from CUDA
    # graphs (docs/gpu-validation.md). A check of the model and formats where TensorRT-LLM is absent, not the GPU
    # deployment path (target trtllm / llmapi), which is far faster.
    device: Literal["cpu", "cuda"] = "cpu"
    # CPU engine: n-gram (prompt-lookup) speculative decoding, drafts of up to max_draft_len tokens.
    speculative_decoding: Literal["none", "ngram"] = "none"
    max_draft_len: int = Field(4, ge=1, le=16)
    # CPU engine, INT4-AWQ and W4A8: activations (decode rows and prompt chunks) rounded to int8 per 128 inputs for the
    # int4 x int8 VNNI kernel (auto: where the CPU has it; steps at 16 sequences about half as long, TTFT 89 -> 49 ms,
    # perf/README.md), or kept in bf16 as TensorRT-LLM's W4A16 kernels keep them (W4A8's fp8 values exactly; slower).
    # Also FP8's, where a CPU without AVX512-BF16 serves its weights as int8: the int8 x int8 kernel (VNNI or AVX2) after their
    # fp8 rounding (auto), or fp8 values on the widening int8 kernel (bf16; slower, ~0.6x at 8-16 sequences).
    int4_activations: Literal["auto", "int8", "bf16"] = "auto"

    @field_validator("cpu_numa", mode="before")
    @classmethod
    def _numa_words(cls, value):
        # YAML reads a bare off as false, which would otherwise pass as node 0
        if isinstance(value, bool):
            if value:
                raise ValueError("cpu_numa: true is not a setting: auto, off, or a NUMA node number")
            return "off"
        if isinstance(value, int) and value < 0:
            raise ValueError(f"cpu_numa: {value} is not a NUMA node (numbered from 0); auto, off, or a node number")
        return value

    @model_validator(mode="after")
    def _resolve_auto(self) -> "EngineSection":
        if self.target == "auto":
            self.target = detect_target()
        return self

    @model_validator(mode="after")
    def _lengths_consistent(self) -> "EngineSection":
        if self.max_input_len >= self.max_seq_len:
            raise ValueError(
                f"max_input_len ({self.max_input_len}) must be < max_seq_len ({self.max_seq_len}) "
                "to leave room for at least one output token"
            )
        return self


class ServerSection(_Section):
    host: str = "127.0.0.1"
    # 0 picks a free port at start-up.
    http_port: int = Field(0, ge=0, le=65535)
    grpc_port: int = Field(0, ge=0, le=65535)
    metrics_port: int = Field(0, ge=0, le=65535)
    openai: bool = False  # also start the OpenAI-compatible front (toolkit serve --openai)
    openai_port: int = Field(0, ge=0, le=65535)
    startup_timeout_s: float = Field(180, gt=0)
    tritonserver: str | None = None  # explicit binary; default: pytriton's on CPU, PATH on GPU


class WorkloadSection(_Section):
    """What the sweep's requests ask for (toolkit/bench/workloads/). `synthetic`: the sweep's own lengths."""

    kind: Literal["synthetic", "dataset", "trace", "shared_prefix", "multi_turn", "mixed"] = "synthetic"
    # dataset: ShareGPT JSON or JSONL prompts ({"text", "output_length"}); trace: Mooncake JSONL.
    path: str | None = None
    # dataset: entries whose prompt is longer, or whose prompt + output exceed max_total_tokens, are skipped
    # (vLLM's benchmark prunes likewise); default: the engine's max_input_len and max_seq_len.
    max_input_tokens: int | None = Field(None, ge=1)
    max_total_tokens: int | None = Field(None, ge=2)
    speedup: float = Field(1.0, gt=0)  # trace: replay N times faster than recorded
    trace_block_tokens: int = Field(512, ge=1)  # trace: tokens per hash_id block (Mooncake / AIPerf: 512)
    # shared_prefix: `prefixes` system prompts of `prefix_tokens`, each shared by `users_per_prefix`
    # users, whose own question is `suffix_tokens` long (genai-perf's --num-prefix-prompts /
    # --prefix-prompt-length); output length from sweep.output_tokens.
    prefixes: int = Field(2, ge=1)
    prefix_tokens: int = Field(96, ge=1)
    users_per_prefix: int = Field(4, ge=1)
    suffix_tokens: int = Field(16, ge=1)
    # multi_turn: conversations of `turns` turns; each turn re-sends the history (earlier prompts and the
    # model's answers) plus a new `turn_tokens` message, after `think_time_s`; `history_tokens` keeps
    # only the last N tokens of history (the "shorter context" fix).
    turns: int = Field(4, ge=1)
    turn_tokens: int = Field(24, ge=1)
    think_time_s: float = Field(0.2, ge=0)
    history_tokens: int | None = Field(None, ge=1)
    # mixed: the sweep's own requests (class "short", at the step's load) plus long prompts (class
    # "long") arriving at `long_rate` requests/s: the noisy neighbour.
    long_input_tokens: int = Field(192, ge=1)
    long_output_tokens: int = Field(4, ge=1)
    long_rate: float = Field(0.5, gt=0)


class SweepSection(_Section):
    endpoint: Literal["triton-grpc", "triton-http", "openai-completions", "openai-chat"] = "triton-grpc"
    # Any server's base URL (e.g. http://host:8000 for vLLM / trtllm-serve); default: the toolkit's own server.
    url: str | None = None
    # None: `ensemble` on Triton endpoints; on OpenAI endpoints the first model the server lists on /v1/models.
    model: str | None = None
    mode: Literal["concurrency", "rate"] = "concurrency"
    concurrencies: list[int] = [1, 2, 4]
    request_rates: list[float] = [1.0]  # requests/s, rate mode
    arrival: Literal["constant", "poisson"] = "poisson"
    max_concurrency: int | None = Field(None, ge=1)  # cap on requests in flight in rate mode
    requests_per_step: int | None = Field(16, ge=1)
    duration_s: float | None = Field(None, gt=0)  # a step ends at whichever bound comes first
    warmup_requests: int = Field(2, ge=0)  # once, before the first step, at concurrency ≤ 4
    # Per step: the first N requests, sent under the step's own load and left out of its metrics, so
    # measuring starts in steady state (streams open, requests desynchronized) rather than with the
    # burst of `concurrency` simultaneous sends a step begins with. Counted on top of requests_per_step.
    step_warmup_requests: int = Field(0, ge=0)
    input_tokens_mean: int = Field(64, ge=1)
    input_tokens_stddev: float = Field(0, ge=0)
    output_tokens: int = Field(32, ge=1)
    output_tokens_stddev: float = Field(0, ge=0)
    # Sweep over shapes: [[input_tokens, output_tokens], ...]; default: one shape from the means above.
    lengths: list[tuple[int, int]] | None = None
    request_timeout_s: float = Field(120, gt=0)
    seed: int = 0
    slo_ttft_ms: float | None = Field(None, gt=0)
    slo_itl_ms: float | None = Field(None, gt=0)
    slo_latency_ms: float | None = Field(None, gt=0)
    workload: WorkloadSection = WorkloadSection()

    @field_validator("concurrencies")
    @classmethod
    def _positive(cls, value: list[int]) -> list[int]:
        if not value or any(c < 1 for c in value):
            raise ValueError("concurrencies must be a non-empty list of integers >= 1")
        return value

    @field_validator("request_rates")
    @classmethod
    def _positive_rates(cls, value: list[float]) -> list[float]:
        if not value or any(r <= 0 for r in value):
            raise ValueError("request_rates must be a non-empty list of positive numbers (requests/s)")
        return value

    @model_validator(mode="after")
    def _bounded(self) -> "SweepSection":
        if self.requests_per_step is None and self.duration_s is None:
            raise ValueError("set requests_per_step and/or duration_s so that each step ends")
        return self

    @property
    def shapes(self) -> list[tuple[int, int]]:
        return list(self.lengths) if self.lengths else [(self.input_tokens_mean, self.output_tokens)]

    @property
    def load_levels(self) -> list[float]:
        return list(self.concurrencies) if self.mode == "concurrency" else list(self.request_rates)


class PlanSection(_Section):
    gpu: str = "cpu"  # a name from `toolkit plan --list-gpus`, or cpu (this machine, probed)
    prefill_efficiency: float = Field(0.6, gt=0, le=1)  # GPU: share of the tensor peak a prefill reaches
    runtime_overhead_gb: float = Field(2.0, ge=0)  # GPU: CUDA context and workspaces, beside weights/activations/KV
    # CPU engine: fixed cost of one decode step beyond memory and compute time (measure it with
    # perf/engine_bench.py; the default is an assumption, see toolkit/plan/cpu_probe.py).
    # None: the engine's measured cost per step and per layer (plan/cpu_probe.py: default_step_overhead_s)
    cpu_step_overhead_ms: float | None = Field(None, ge=0)


class ArtifactSource(_Section):
    """Where a cluster pod finds the engine and the model repository: said in the config, never guessed."""

    kind: Literal["pvc", "init-container"]
    claim: str | None = None  # pvc: a PersistentVolumeClaim holding build/ and model_repo/ (ReadOnlyMany)
    image: str | None = None  # init-container: an image whose `path` holds them, copied into an emptyDir
    # Holds build/ and model_repo/ as `toolkit build` and `toolkit repo` wrote them with this as the working
    # directory (docker/compose.yaml's /work): the repository names its engine by absolute path.
    path: str = "/work"

    @model_validator(mode="after")
    def _named(self) -> "ArtifactSource":
        if self.kind == "pvc" and not self.claim:
            raise ValueError("artifacts.kind pvc needs artifacts.claim (the PersistentVolumeClaim's name)")
        if self.kind == "init-container" and not self.image:
            raise ValueError("artifacts.kind init-container needs artifacts.image (the image holding the artifacts)")
        return self


class DeploySection(_Section):
    """`toolkit deploy k8s`: the cluster side of the same deployment (toolkit/deploy/)."""

    image: str = "llm-deploy-toolkit:0.1.0"  # built from docker/Dockerfile and pushed where the cluster pulls
    namespace: str = "llm"
    gpus_per_node: int = Field(8, ge=1)
    # Nodes with the planned GPU, by your cluster's own label (e.g. GPU feature discovery's
    # nvidia.com/gpu.product); label values differ between clusters, so nothing is assumed.
    node_selector: dict[str, str] = {}
    artifacts: ArtifactSource | None = None
    min_replicas: int = Field(1, ge=1)
    max_replicas: int = Field(4, ge=1)
    # HPA targets, per pod: KV-cache blocks used / max, and requests waiting for a batch slot.
    kv_occupancy_target: float = Field(0.7, gt=0, le=1)
    waiting_requests_target: float = Field(4, gt=0)
    scale_up_window_s: int = Field(0, ge=0, le=3600)  # the HPA's defaults: react up at once,
    scale_down_window_s: int = Field(300, ge=0, le=3600)  # down only after 5 min of lower recommendations
    # Rate limits per period: up by 2 replicas or 100 %, down by 1 replica, whichever the HPA allows.
    scale_period_s: int = Field(60, ge=1, le=1800)
    drain_timeout_s: int = Field(120, ge=1)  # in-flight streams get this long to finish on scale-down
    kv_alert_ratio: float = Field(0.9, gt=0, le=1)
    slo_ttft_ms: float = Field(2000, gt=0)  # TTFT p95 objective the alert holds the deployment to
    prometheus_url: str = "http://prometheus-operated.monitoring.svc:9090"  # what KEDA queries
    dynamo_image: str = "nvcr.io/nvidia/ai-dynamo/trtllm-runtime:0.5.1"  # --disaggregated workers

    @model_validator(mode="after")
    def _range(self) -> "DeploySection":
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas ({self.min_replicas}) > max_replicas ({self.max_replicas})")
        return self


class PathsSection(_Section):
    build_dir: str = "build"
    repo_root: str = "model_repo"
    runs_dir: str = "perf/runs"


class DeploymentConfig(_Section):
    name: str
    model: ModelSection = ModelSection()
    quantize: QuantizeSection = QuantizeSection()
    parallel: ParallelSection = ParallelSection()
    engine: EngineSection = EngineSection()
    server: ServerSection = ServerSection()
    sweep: SweepSection = SweepSection()
    plan: PlanSection = PlanSection()
    deploy: DeploySection = DeploySection()
    paths: PathsSection = PathsSection()

    @model_validator(mode="after")
    def _cpu_is_single_process(self) -> "DeploymentConfig":
        if not target_of(self).on_gpu and self.parallel.world_size != 1:
            raise ValueError(f"the cpu target runs one process, not tp × pp = {self.parallel.world_size}: for tensor or "
                             "pipeline parallelism use a GPU target (--set engine.target=llmapi or trtllm) or a "
                             "GPU config (configs/gpu-*.yaml); on CPU set parallel.tp and parallel.pp to 1")
        for isl, osl in self.sweep.shapes:
            if isl + osl > self.engine.max_seq_len:
                raise ValueError(f"sweep asks for {isl} input + {osl} output tokens, "
                                 f"more than engine.max_seq_len={self.engine.max_seq_len}")
        workload = self.sweep.workload  # dataset entries the engine would refuse are skipped, not sent
        workload.max_input_tokens = workload.max_input_tokens or self.engine.max_input_len
        workload.max_total_tokens = workload.max_total_tokens or self.engine.max_seq_len
        return self


def _parse_scalar(text: str) -> Any:
    # YAML's scalar rules give ints, floats, bools, null and lists ("[1,2,4]") for free.
    return yaml.safe_load(text)


def apply_overrides(raw: dict, overrides: dict[str, Any]) -> dict:
    """Set dotted keys (`sweep.concurrencies`) on the raw config dict; values may be YAML text."""
    for dotted, value in overrides.items():
        if value is None:
            continue
        node = raw
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                raise ToolkitError(f"cannot set {dotted}: {key} is not a section", "check the key path")
        node[leaf] = _parse_scalar(value) if isinstance(value, str) else value
    return raw


def parse_set_options(pairs: tuple[str, ...] | list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        if "=" not in pair:
            raise ToolkitError(f"--set {pair!r} is not KEY=VALUE", "write e.g. --set sweep.output_tokens=64")
        key, value = pair.split("=", 1)
        out[key.strip()] = value
    return out


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> DeploymentConfig:
    path = Path(path)
    if not path.is_file():
        raise ToolkitError(f"config file {path} does not exist", "pass one of configs/*.yaml with --config")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ToolkitError(f"config {path} is not valid YAML{where}", "fix the YAML syntax") from None
    if not isinstance(raw, dict):
        raise ToolkitError(f"config {path} must be a YAML mapping", "start from configs/cpu-tiny.yaml")
    raw.setdefault("name", path.stem)
    return validate_config(apply_overrides(raw, overrides or {}), source=str(path))


def validate_config(raw: dict, source: str = "config") -> DeploymentConfig:
    try:
        return DeploymentConfig.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        count = exc.error_count()
        more = f" (+{count - 1} more)" if count > 1 else ""
        error = ToolkitError(f"{source}: {where}: {first['msg']}{more}", "fix that key (see configs/cpu-tiny.yaml)")
        # Which key and why, so that a caller that set the key from a flag can blame the flag instead.
        error.key, error.reason = where, first["msg"].removeprefix("Value error, ")
        raise error from None


class ArtifactLayout:
    """Where each stage's artifacts live: one place, derived from the config."""

    def __init__(self, config: DeploymentConfig, root: Path | None = None):
        self.config = config
        self.root = Path(root or ".")

    @property
    def build_dir(self) -> Path:
        return self.root / self.config.paths.build_dir

    @property
    def model_dir(self) -> Path:
        src = self.config.model
        return self.build_dir / "models" / src.preset if src.preset else Path(src.source)

    @property
    def checkpoint_dir(self) -> Path:
        q = self.config.quantize
        tag = q.qformat if q.kv_cache_dtype == "none" else f"{q.qformat}-kv{q.kv_cache_dtype}"
        if q.export == "trtllm":
            tag += f"-trtllm-tp{self.config.parallel.tp}pp{self.config.parallel.pp}"
        return self.build_dir / "checkpoints" / f"{self.config.model.display_name}-{tag}"

    @property
    def engine_dir(self) -> Path:
        return self.build_dir / "engines" / f"{self.config.name}-{self.config.engine.target}"

    @property
    def repo_dir(self) -> Path:
        return self.root / self.config.paths.repo_root / self.config.name

    @property
    def runs_dir(self) -> Path:
        return self.root / self.config.paths.runs_dir

    @property
    def plan_dir(self) -> Path:
        return self.build_dir / "plans" / self.config.name

    @property
    def server_state_file(self) -> Path:
        return self.build_dir / "servers" / f"{self.config.name}.json"
