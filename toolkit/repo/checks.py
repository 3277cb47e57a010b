"""`toolkit repo check`: catch the failures users hit most, before the server does.

Each finding names the file, the line, the problem and the fix. Errors make the check fail;
warnings are printed but do not.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from toolkit.errors import ToolkitError
from toolkit.repo.pbtxt_parse import Node, PbtxtError, parse_pbtxt

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
        for model_yaml in sorted(self.repo_dir.glob("*/1/model.yaml")):
            config_path = model_yaml.parent.parent / "config.pbtxt"
            if not config_path.is_file() or not (model_yaml.parent / "model.py").is_file():
                self.add("error", model_yaml, 1,
                         "TensorRT-LLM's llmapi model (config.pbtxt, 1/model.py) is missing beside model.yaml",
                         "run `toolkit repo` inside the NGC Triton + TensorRT-LLM container, or set "
                         "TRTLLM_TRITON_MODELS to TensorRT-LLM's triton_backend/all_models")
        for config_path in sorted(self.repo_dir.glob("*/config.pbtxt")):
            self._load(config_path)
        if not self.models and not self.findings:
            self.add("error", self.repo_dir, 1, "no */config.pbtxt found", "run `toolkit repo` to write the repository")
            return self.findings
        for name, (node, path) in self.models.items():
            self._check_model(name, node, path)
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
        if backend == "python" and not (path.parent / "1" / "model.py").is_file():
            self.add("error", path, _line(node, "backend"), "python backend model without 1/model.py",
                     "regenerate the repository with `toolkit repo`")
        if "tokenizer_dir" in params:
            self._check_tokenizer(path, *params["tokenizer_dir"])
        if name == "tensorrt_llm" or backend == "tensorrtllm":
            self._check_engine_model(node, path, backend, params)
        if _scalar(node, "platform") == "ensemble":
            self._check_ensemble(node, path)

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
            if self.world_size is not None and limits.get("world_size", 1) != self.world_size:
                self.add("error", path, line,
                         f"the engine was built for world size {limits['world_size']} (TP × PP) but the server "
                         f"would launch {self.world_size} rank(s)",
                         "set parallel.tp / parallel.pp to the engine's mapping, or rebuild the engine")
        if not _scalar(node.get("model_transaction_policy"), "decoupled", False):
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


def check_repository(repo_dir: Path, engine_dir: Path | None = None, world_size: int | None = None) -> list[Finding]:
    return RepoChecker(repo_dir, engine_dir, world_size).run()


def check_repository_or_raise(repo_dir: Path, engine_dir: Path | None = None, world_size: int | None = None) -> list[Finding]:
    findings = check_repository(repo_dir, engine_dir, world_size)
    errors = [f for f in findings if f.severity == "error"]
    if errors:
        more = f" (+{len(errors) - 1} more: run `toolkit repo check {repo_dir}`)" if len(errors) > 1 else ""
        raise ToolkitError(f"repository check failed: {errors[0]}{more}")
    return findings
