"""`toolkit repo check`: catch the failures users hit most, before the server does.

Each finding names the file, the line, the problem and the fix. Errors make the check fail;
warnings are printed but do not. Per target: the CPU engine's python model, the `tensorrtllm`
backend (every parameter against the domain the backend documents, tensors against the upstream
template's batching attributes), and TensorRT-LLM's `llmapi` model (model.yaml against the LLM API's
argument names, and against its config.pbtxt). Models that must agree are cross-checked.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from toolkit.errors import ToolkitError
from toolkit.repo.models import ENGINE_INPUTS
from toolkit.repo.pbtxt_parse import Node, PbtxtError, parse_pbtxt
from toolkit.repo.upstream import (LLMAPI_TRITON_CONFIG_KEYS, PARAMS_BY_MODEL, TEMPLATE_DIR_ENV, TRTLLM_VERSION,
                                   llmapi_problems)

_PLACEHOLDER = re.compile(r"\$\{[^}]*\}")


@dataclass(frozen=True)
class Finding:
    severity: str  # "error" | "warning"
    file: str
    line: int
    problem: str
    fix: str

    def __str__(self) -> str:
        return f"{self.severity}: {self.file}:{self.line}: {self.problem} — {self.fix}"


def _scalar(node: Node | None, key: str, default=None):
    if node is None:
        return default
    value = node.get(key)
    return default if value is None else value.value


def _line(node: Node | None, key: str) -> int:
    value = node.get(key) if node is not None else None
    return value.line if value is not None else (node.line if node is not None else 1)


def _params(node: Node) -> dict[str, tuple[str, int]]:
    out = {}
    for param in node.all("parameters"):
        value = param.get("value")
        out[_scalar(param, "key")] = (_scalar(value, "string_value", ""), param.line)
    return out


def _tensors(node: Node, kind: str) -> dict[str, tuple[str, tuple, int]]:
    return {_scalar(t, "name"): (_scalar(t, "data_type"), tuple(d.value for d in t.all("dims")), t.line)
            for t in node.all(kind)}


def _decoupled(node: Node) -> bool:
    return bool(_scalar(node.get("model_transaction_policy"), "decoupled", False))


class RepoChecker:
    def __init__(self, repo_dir: Path, engine_dir: Path | None = None, world_size: int | None = None):
        self.repo_dir = Path(repo_dir)
        self.engine_dir = Path(engine_dir) if engine_dir else None
        self.world_size = world_size
        self.findings: list[Finding] = []
        self.models: dict[str, tuple[Node, Path]] = {}

    def add(self, severity: str, path: Path, line: int, problem: str, fix: str) -> None:
        try:
            shown = str(path.relative_to(self.repo_dir.parent))
        except ValueError:
            shown = str(path)
        self.findings.append(Finding(severity, shown, line, problem, fix))

    def run(self) -> list[Finding]:
        if not self.repo_dir.is_dir():
            raise ToolkitError(f"{self.repo_dir} is not a directory", "pass the model repository directory")
        llmapi_models = sorted(self.repo_dir.glob("*/1/model.yaml"))
        for model_yaml in llmapi_models:
            if not (model_yaml.parent / "model.py").is_file():
                self.add("error", model_yaml, 1,
                         "TensorRT-LLM's llmapi model code (1/model.py, 1/helpers.py) is missing beside model.yaml",
                         f"run `toolkit repo` inside the image docker/Dockerfile builds, or set {TEMPLATE_DIR_ENV} to "
                         f"TensorRT-LLM {TRTLLM_VERSION}'s triton_backend/all_models (git clone at tag v{TRTLLM_VERSION})")
        for config_path in sorted(self.repo_dir.glob("*/config.pbtxt")):
            self._load(config_path)
        if not self.models and not self.findings:
            self.add("error", self.repo_dir, 1, "no */config.pbtxt found", "run `toolkit repo` to write the repository")
            return self.findings
        for name, (node, path) in self.models.items():
            self._check_model(name, node, path)
        for model_yaml in llmapi_models:
            if model_yaml.parent.parent.name in self.models:
                self._check_llmapi(model_yaml, *self.models[model_yaml.parent.parent.name])
        self._cross_check()
        return self.findings

    def _load(self, path: Path) -> None:
        text = path.read_text()
        for number, line in enumerate(text.splitlines(), 1):
            for match in _PLACEHOLDER.findall(line):
                self.add("error", path, number, f"unfilled template placeholder {match}",
                         "fill it (e.g. with tools/fill_template.py) or regenerate with `toolkit repo`")
        try:
            node = parse_pbtxt(text)
        except PbtxtError as exc:
            self.add("error", path, exc.line, f"config.pbtxt does not parse: {exc}", "fix the protobuf text syntax")
            return
        name = _scalar(node, "name", path.parent.name)
        if name != path.parent.name:
            self.add("error", path, _line(node, "name"), f'name "{name}" differs from its directory "{path.parent.name}"',
                     f'set name: "{path.parent.name}"')
        self.models[path.parent.name] = (node, path)

    def _check_model(self, name: str, node: Node, path: Path) -> None:
        backend = _scalar(node, "backend")
        params = _params(node)
        llmapi = (path.parent / "1" / "model.yaml").is_file()  # its missing model.py is reported with the fix
        if backend == "python" and not llmapi and not (path.parent / "1" / "model.py").is_file():
            self.add("error", path, _line(node, "backend"), "python backend model without 1/model.py",
                     "regenerate the repository with `toolkit repo`")
        if "tokenizer_dir" in params:
            self._check_tokenizer(path, *params["tokenizer_dir"])
        table = PARAMS_BY_MODEL.get(name)
        if table and (backend == "tensorrtllm" or name != "tensorrt_llm"):
            self._check_parameter_domains(name, path, params, table)
        if backend == "tensorrtllm":
            self._check_batching_attributes(node, path)
        if (name == "tensorrt_llm" or backend == "tensorrtllm") and not llmapi:
            self._check_engine_model(node, path, backend, params)
        if _scalar(node, "platform") == "ensemble":
            self._check_ensemble(node, path)

    def _check_parameter_domains(self, name: str, path: Path, params: dict, table: dict) -> None:
        where = "the tensorrtllm backend" if name == "tensorrt_llm" else f"upstream's {name} model"
        for key, (value, line) in params.items():
            if key not in table:
                self.add("warning", path, line, f'parameter "{key}" is not one {where} reads '
                         f"(TensorRT-LLM {TRTLLM_VERSION} templates)", "check its spelling, or remove it")
                continue
            if _PLACEHOLDER.search(value):
                continue  # reported as an unfilled placeholder already
            problem = table[key].domain.problem(value)
            if problem:
                self.add("error", path, line, f'{key} = "{value}" {problem}', f"set {key} to a value in its documented domain")

    def _check_batching_attributes(self, node: Node, path: Path) -> None:
        """With max_batch_size > 0 Triton batches requests for the backend: prompts need allow_ragged_batch and
        per-request values reshape to scalars, or equal-length prompts merge and [batch, 1] lengths are rejected."""
        if not _scalar(node, "max_batch_size", 0):
            return
        declared = {_scalar(t, "name"): t for t in node.all("input")}
        for spec in ENGINE_INPUTS:
            tensor = declared.get(spec.name)
            if tensor is None:
                continue
            if spec.scalar and tensor.get("reshape") is None:
                self.add("error", path, tensor.line,
                         f"input {spec.name} lacks reshape: {{ shape: [ ] }}: Triton hands the backend a [batch, 1] "
                         f"tensor and it rejects the request under load",
                         "add reshape: { shape: [ ] } as in the upstream template (or regenerate with `toolkit repo`)")
            if spec.ragged and not _scalar(tensor, "allow_ragged_batch", False):
                self.add("error", path, tensor.line,
                         f"input {spec.name} lacks allow_ragged_batch: true: prompts of different lengths cannot "
                         "share a batch, and equal-length ones are merged into one request",
                         "add allow_ragged_batch: true as in the upstream template (or regenerate with `toolkit repo`)")

    def _check_llmapi(self, model_yaml: Path, node: Node, path: Path) -> None:
        import yaml

        try:
            options = yaml.safe_load(model_yaml.read_text()) or {}
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            self.add("error", model_yaml, mark.line + 1 if mark else 1, "model.yaml is not valid YAML", "fix the YAML syntax")
            return
        lines = _yaml_key_lines(model_yaml.read_text())
        for key, problem, fix in llmapi_problems(options):
            self.add("error", model_yaml, lines.get(key, 1), problem, fix)
        triton = options.get("triton_config")
        if not isinstance(triton, dict):
            self.add("error", model_yaml, 1, "model.yaml has no triton_config (its model.py reads max_batch_size and decoupled there)",
                     "add triton_config: {max_batch_size: 0, decoupled: true}")
            return
        for key in triton:
            if key not in LLMAPI_TRITON_CONFIG_KEYS:
                self.add("warning", model_yaml, lines.get(key, 1), f'triton_config.{key} is not read by the llmapi model',
                         f"use {', '.join(LLMAPI_TRITON_CONFIG_KEYS)}")
        # Auto-complete is off (--disable-auto-complete-config), so config.pbtxt itself must say what model.yaml says.
        if int(triton.get("max_batch_size", 0)) != _scalar(node, "max_batch_size", 0):
            self.add("error", path, _line(node, "max_batch_size"),
                     f"max_batch_size {_scalar(node, 'max_batch_size', 0)} differs from model.yaml's "
                     f"triton_config.max_batch_size {triton.get('max_batch_size')}",
                     "write the same value in both (Triton's auto-complete, which would copy it, is disabled)")
        if bool(triton.get("decoupled", False)) != _decoupled(node):
            self.add("error", path, node.line,
                     f"model_transaction_policy decoupled is {str(_decoupled(node)).lower()} but model.yaml's "
                     f"triton_config.decoupled is {str(bool(triton.get('decoupled'))).lower()}",
                     "write the same value in both (Triton's auto-complete, which would copy it, is disabled)")
        model = str(options.get("model", ""))
        if model.startswith(("/", ".")) and not Path(model).exists():
            self.add("error", model_yaml, lines.get("model", 1), f"model {model} does not exist",
                     "run `toolkit quantize` / `toolkit build --target llmapi`, or mount the checkpoint there")
        ranks = int(options.get("tensor_parallel_size", 1)) * int(options.get("pipeline_parallel_size", 1))
        if self.world_size is not None and ranks != self.world_size:
            self.add("error", model_yaml, lines.get("tensor_parallel_size", 1),
                     f"model.yaml asks for {ranks} rank(s) (TP × PP) but the server would launch {self.world_size}",
                     "set parallel.tp / parallel.pp to match and rebuild")
        self._check_token_budget(model_yaml, lines.get("max_num_tokens", 1), options.get("max_num_tokens"),
                                 options.get("max_seq_len"), options.get("enable_chunked_prefill"))

    def _check_token_budget(self, path: Path, line: int, max_num_tokens, max_seq_len, chunked) -> None:
        if max_num_tokens and max_seq_len and not chunked and int(max_num_tokens) < int(max_seq_len):
            self.add("warning", path, line,
                     f"max_num_tokens {max_num_tokens} < max_seq_len {max_seq_len} without chunked prefill: "
                     "a prompt longer than max_num_tokens can never be scheduled",
                     "enable chunked prefill (engine.enable_chunked_context) or raise max_num_tokens")

    def _cross_check(self) -> None:
        """What several models must agree on."""
        ensemble = next(((n, p) for n, p in self.models.values() if _scalar(n, "platform") == "ensemble"), None)
        if ensemble:
            node, path = ensemble
            batch = _scalar(node, "max_batch_size", 0)
            scheduling = node.get("ensemble_scheduling")
            for step in scheduling.all("step") if scheduling else []:
                model = _scalar(step, "model_name")
                if model in self.models:
                    step_batch = _scalar(self.models[model][0], "max_batch_size", 0)
                    if batch > step_batch:
                        self.add("error", path, _line(node, "max_batch_size"),
                                 f"ensemble max_batch_size {batch} exceeds {model}'s {step_batch}",
                                 f"lower it to ≤ {step_batch} (Triton refuses to load the ensemble otherwise)")
        tokenizers = {name: _params(node).get("tokenizer_dir") for name, (node, _) in self.models.items()
                      if name in ("preprocessing", "postprocessing")}
        found = {name: value for name, value in tokenizers.items() if value}
        if len(found) == 2 and Path(found["preprocessing"][0]) != Path(found["postprocessing"][0]):
            path = self.models["postprocessing"][1]
            self.add("error", path, found["postprocessing"][1],
                     f"postprocessing decodes with {found['postprocessing'][0]} but preprocessing encodes with "
                     f"{found['preprocessing'][0]}", "point both tokenizer_dir parameters at the same tokenizer")
        bls = self.models.get("tensorrt_llm_bls")
        if bls:
            target, line = _params(bls[0]).get("tensorrt_llm_model_name", ("tensorrt_llm", bls[0].line))
            if target not in self.models:
                self.add("error", bls[1], line, f'tensorrt_llm_model_name "{target}" is not in the repository',
                         "name the engine model (tensorrt_llm)")

    def _check_tokenizer(self, path: Path, directory: str, line: int) -> None:
        from toolkit.model.tokenizer import load_tokenizer

        try:
            load_tokenizer(directory)
        except ToolkitError as exc:
            self.add("error", path, line, f"tokenizer_dir: {exc.problem}", exc.fix or "point tokenizer_dir at the checkpoint")

    def _check_engine_model(self, node: Node, path: Path, backend: str, params: dict) -> None:
        key = "gpt_model_path" if backend == "tensorrtllm" else "engine_dir"
        engine_value, line = params.get(key, ("", node.line))
        engine_dir = self.engine_dir or (Path(engine_value) if engine_value else None)
        limits = None
        if engine_dir is None:
            self.add("error", path, line, f"parameter {key} is not set", f"set {key} to the engine directory")
        elif not engine_dir.is_dir():
            self.add("error", path, line, f"engine directory {engine_dir} does not exist", "run `toolkit build` first")
        else:
            limits = self._engine_limits(engine_dir, backend, path, line)
        if limits:
            repo_batch = _scalar(node, "max_batch_size", 0)
            if repo_batch > limits["max_batch_size"]:
                self.add("error", path, _line(node, "max_batch_size"),
                         f"max_batch_size {repo_batch} exceeds the engine's {limits['max_batch_size']}",
                         f"lower it to ≤ {limits['max_batch_size']} or rebuild the engine with a larger max_batch_size")
            window, window_line = params.get("max_attention_window_size", ("", 0))
            if window.isdigit() and int(window) > limits["max_seq_len"]:
                self.add("error", path, window_line,
                         f"max_attention_window_size {window} exceeds the engine's max_seq_len {limits['max_seq_len']}",
                         "lower it or rebuild with a larger max_seq_len")
            self._check_token_budget(path, line, limits.get("max_num_tokens"), limits.get("max_seq_len"),
                                     params.get("enable_chunked_context", ("true", 0))[0].lower() == "true")
            if self.world_size is not None and limits.get("world_size", 1) != self.world_size:
                self.add("error", path, line,
                         f"the engine was built for world size {limits['world_size']} (TP × PP) but the server "
                         f"would launch {self.world_size} rank(s)",
                         "set parallel.tp / parallel.pp to the engine's mapping, or rebuild the engine")
        if not _decoupled(node):
            ensemble = self.models.get("ensemble")
            if ensemble and "stream" in _tensors(ensemble[0], "input"):
                self.add("error", path, node.line, "streaming is requested (ensemble input `stream`) but the model is not decoupled",
                         "add model_transaction_policy { decoupled: true }")
        if backend == "tensorrtllm":
            value, pline = params.get("exclude_input_in_output", ("false", node.line))
            if value.lower() != "true":
                self.add("error", path, pline,
                         "exclude_input_in_output is not true: responses repeat the prompt, so output tokens "
                         "(and ITL, throughput) are over-counted",
                         'set parameters { key: "exclude_input_in_output" value: { string_value: "true" } }')

    def _engine_limits(self, engine_dir: Path, backend: str, path: Path, line: int) -> dict | None:
        cpu_config = engine_dir / "engine_config.json"
        trt_config = engine_dir / "config.json"
        if backend != "tensorrtllm" and cpu_config.is_file():
            data = json.loads(cpu_config.read_text())
            return data | {"world_size": data.get("tp", 1) * data.get("pp", 1)}
        if trt_config.is_file():
            data = json.loads(trt_config.read_text())
            build = data.get("build_config", {})
            mapping = data.get("pretrained_config", {}).get("mapping", {})
            return {"max_batch_size": build.get("max_batch_size", 0), "max_seq_len": build.get("max_seq_len", 0),
                    "max_num_tokens": build.get("max_num_tokens"),
                    "world_size": mapping.get("world_size", mapping.get("tp_size", 1) * mapping.get("pp_size", 1))}
        self.add("error", path, line, f"engine directory {engine_dir} has no config.json",
                 "point at a built engine (`toolkit build`), not at the checkpoint")
        return None

    def _check_ensemble(self, node: Node, path: Path) -> None:
        available = {name: (dtype, dims) for name, (dtype, dims, _) in _tensors(node, "input").items()}
        scheduling = node.get("ensemble_scheduling")
        steps = scheduling.all("step") if scheduling else []
        for step in steps:
            model = _scalar(step, "model_name")
            if model not in self.models:
                self.add("error", path, _line(step, "model_name"), f'step model "{model}" is not in the repository',
                         f"add {model}/config.pbtxt or fix model_name")
                continue
            target = self.models[model][0]
            inputs = _tensors(target, "input")
            outputs = _tensors(target, "output")
            for mapping in step.all("input_map"):
                key, value = _scalar(mapping, "key"), _scalar(mapping, "value")
                if key not in inputs:
                    self.add("error", path, mapping.line, f'{model} has no input "{key}"',
                             f"use one of {sorted(inputs)}")
                elif value not in available:
                    self.add("error", path, mapping.line,
                             f'"{value}" (for {model}.{key}) is neither an ensemble input nor an earlier step output',
                             "map it from an earlier step's output_map or add it to the ensemble's inputs")
                elif available[value][0] != inputs[key][0]:
                    self.add("error", path, mapping.line,
                             f'{model}.{key} is {inputs[key][0]} but "{value}" is {available[value][0]}',
                             "make the data types match")
            for mapping in step.all("output_map"):
                key, value = _scalar(mapping, "key"), _scalar(mapping, "value")
                if key not in outputs:
                    self.add("error", path, mapping.line, f'{model} has no output "{key}"', f"use one of {sorted(outputs)}")
                else:
                    available[value] = outputs[key][:2]
        for name, (dtype, _, line) in _tensors(node, "output").items():
            if name not in available:
                self.add("error", path, line, f'ensemble output "{name}" is produced by no step',
                         "add an output_map whose value is this name")
            elif available[name][0] != dtype:
                self.add("error", path, line, f'ensemble output "{name}" is {dtype} but its step gives {available[name][0]}',
                         "make the data types match")


def _yaml_key_lines(text: str) -> dict[str, int]:
    """Line of each key's first appearance in a YAML file (for findings; nesting is not tracked)."""
    lines: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        match = re.match(r"\s*([A-Za-z_][\w]*)\s*:", line)
        if match:
            lines.setdefault(match.group(1), number)
    return lines


def check_repository(repo_dir: Path, engine_dir: Path | None = None, world_size: int | None = None) -> list[Finding]:
    return RepoChecker(repo_dir, engine_dir, world_size).run()


def check_repository_or_raise(repo_dir: Path, engine_dir: Path | None = None, world_size: int | None = None) -> list[Finding]:
    findings = check_repository(repo_dir, engine_dir, world_size)
    errors = [f for f in findings if f.severity == "error"]
    if errors:
        first = errors[0]
        more = f" (+{len(errors) - 1} more: run `toolkit repo check {repo_dir}`)" if len(errors) > 1 else ""
        raise ToolkitError(f"repository check failed: {first.file}:{first.line}: {first.problem}{more}", first.fix)
    return findings
