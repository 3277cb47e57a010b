"""Dataset files a user brings, in the formats genai-perf / AIPerf / vLLM's benchmark read:

- ShareGPT: a JSON list (or JSONL) of {"conversations": [{"from": "human", "value": ...},
  {"from": "gpt", "value": ...}, ...]} (also "messages" with "role" / "content"). As vLLM's benchmark
  does, the first user turn is the prompt and the reply that follows sets the output length.
- Prompts JSONL: one {"text": ..., "output_length": N} per line (AIPerf single_turn; "text_input"
  as genai-perf, "prompt" as vLLM's custom dataset; "output_tokens" / "max_tokens" also read). Lines
  without an output length get sweep.output_tokens.
- Conversations JSONL (AIPerf multi_turn): {"session_id": ..., "turns": [{"text": ..., "output_length": N}]};
  as a dataset its first turn is the prompt; the multi_turn workload with a path plays every turn.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from toolkit.bench.load import LoadShape
from toolkit.bench.prompts import Prompt
from toolkit.bench.workloads.base import StepSpec, Workload, count_tokens, drive_pool, load_label
from toolkit.errors import ToolkitError

_TEXT_KEYS = ("text", "text_input", "prompt")
_OUTPUT_KEYS = ("output_length", "output_tokens", "max_tokens")
_USER_ROLES = {"human", "user"}
_REPLY_ROLES = {"gpt", "assistant", "chatgpt", "bing", "bard", "model"}
_FIX = "give a ShareGPT JSON file or a JSONL file of {\"text\": ..., \"output_length\": N} lines"


@dataclass(frozen=True)
class DatasetEntry:
    text: str
    output_tokens: int | None = None  # given by the file
    reply: str | None = None  # ShareGPT: the recorded answer, whose length sets the output


def _conversation_turns(obj: dict) -> list[DatasetEntry]:
    """Each user message with the reply that follows it (a user message nobody answered ends the list)."""
    turns = obj.get("conversations") or obj.get("conversation") or obj.get("messages") or []
    out, prompt = [], None
    for turn in turns:
        if not isinstance(turn, dict):
            continue
        role = str(turn.get("from") or turn.get("role") or "").lower()
        text = turn.get("value") if "value" in turn else turn.get("content")
        if not isinstance(text, str):
            continue
        if prompt is None and role in _USER_ROLES and text.strip():
            prompt = text
        elif prompt is not None and role in _REPLY_ROLES:
            out.append(DatasetEntry(prompt, reply=text))
            prompt = None
    return out


def _session_turns(obj: dict) -> list[DatasetEntry]:
    """AIPerf's multi_turn line: {"session_id", "turns": [{"text", "output_length"}, ...]} (a leading system
    turn is not a request)."""
    turns = [t for t in obj["turns"] if isinstance(t, dict) and t.get("role") != "system"]
    return [e for e in map(_prompt_entry, turns) if e is not None]


def _prompt_entry(obj: dict) -> DatasetEntry | None:
    text = next((obj[k] for k in _TEXT_KEYS if isinstance(obj.get(k), str)), None)
    if not text or not text.strip():
        return None
    output = next((obj[k] for k in _OUTPUT_KEYS if isinstance(obj.get(k), int) and obj[k] > 0), None)
    return DatasetEntry(text, output_tokens=output)


def parse_entry(obj) -> DatasetEntry | None:
    """One dataset object → an entry (None when it has no usable prompt)."""
    if not isinstance(obj, dict):
        return None
    turns = conversation_turns(obj)
    return turns[0] if turns else None  # vLLM's benchmark also skips conversations without a reply


def conversation_turns(obj) -> list[DatasetEntry]:
    """A dataset object as the turns of one conversation (a single prompt is a one-turn conversation)."""
    if not isinstance(obj, dict):
        return []
    if isinstance(obj.get("turns"), list):
        return _session_turns(obj)
    if any(k in obj for k in ("conversations", "conversation", "messages")):
        return _conversation_turns(obj)
    entry = _prompt_entry(obj)
    return [entry] if entry else []


def read_dataset(path: str | Path) -> list[DatasetEntry]:
    """Every usable entry of a ShareGPT JSON / JSONL or prompts JSONL file, in file order."""
    objects = _read_objects(path)
    entries = [e for e in map(parse_entry, objects) if e is not None]
    _refuse_empty(path, objects, entries)
    return entries


def read_conversations(path: str | Path) -> list[list[DatasetEntry]]:
    """The conversations of a file, for multi-turn sessions: AIPerf multi_turn JSONL, ShareGPT (every user
    turn with its reply), or prompts JSONL (one turn each)."""
    objects = _read_objects(path)
    conversations = [c for c in map(conversation_turns, objects) if c]
    _refuse_empty(path, objects, conversations)
    return conversations


def output_tokens_of(entry: DatasetEntry, tokenizer, default: int) -> int:
    """The file's output length, else the recorded reply's length (vLLM's way), else the sweep's."""
    if entry.output_tokens:
        return entry.output_tokens
    if entry.reply is not None:
        return max(1, count_tokens(tokenizer, entry.reply))
    return default


def _read_objects(path: str | Path) -> list:
    path = Path(path)
    if not path.is_file():
        raise ToolkitError(f"dataset file {path} does not exist", f"set sweep.workload.path: {_FIX}")
    text = path.read_text()
    try:
        objects = json.loads(text) if text.lstrip().startswith("[") else None
    except json.JSONDecodeError as exc:
        raise ToolkitError(f"{path} is not valid JSON (line {exc.lineno})", _FIX) from None
    if objects is None:
        objects = []
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    objects.append(json.loads(line))
                except json.JSONDecodeError:
                    raise ToolkitError(f"{path}:{number} is not a JSON object", _FIX) from None
    return objects


def _refuse_empty(path, objects: list, found: list) -> None:
    if not found and any(isinstance(o, dict) and "input_length" in o for o in objects):
        raise ToolkitError(f"{path} looks like a Mooncake trace (input_length, no text), not a dataset",
                           "replay it as one: sweep.workload.kind=trace (--custom-dataset-type mooncake_trace)")
    if not found:
        raise ToolkitError(f"{path} has no usable prompt ({len(objects)} objects read)", _FIX)


def dataset_prompts(entries: list[DatasetEntry], tokenizer, default_output_tokens: int,
                    max_input_tokens: int | None, max_total_tokens: int | None) -> tuple[list[Prompt], int]:
    """Prompts with measured input lengths; entries the engine would refuse are skipped (returns the count)."""
    prompts, skipped = [], 0
    for entry in entries:
        isl = count_tokens(tokenizer, entry.text)
        osl = output_tokens_of(entry, tokenizer, default_output_tokens)
        if max_total_tokens and isl + osl > max_total_tokens and (not max_input_tokens or isl <= max_input_tokens):
            osl = max_total_tokens - isl  # the prompt fits: shorten its answer rather than drop it
        if (max_input_tokens and isl > max_input_tokens) or osl < 1:
            skipped += 1
            continue
        prompts.append(Prompt(entry.text, isl, osl))
    return prompts, skipped


class DatasetWorkload(Workload):
    kind = "dataset"

    def __init__(self, settings, factory):
        super().__init__(settings, factory)
        w = settings.workload
        if not w.path:
            raise ToolkitError("sweep.workload.kind is dataset but no path is set", f"set sweep.workload.path: {_FIX}")
        self.pool, self.skipped = dataset_prompts(read_dataset(w.path), factory.tokenizer, settings.output_tokens,
                                                  w.max_input_tokens, w.max_total_tokens)
        if not self.pool:
            raise ToolkitError(f"every prompt of {w.path} is longer than the engine accepts "
                               f"({w.max_input_tokens} input tokens)", "use shorter prompts or a larger engine.max_input_len")

    def steps(self) -> list[StepSpec]:
        isl = round(sum(p.input_tokens for p in self.pool) / len(self.pool))
        osl = round(sum(p.output_tokens for p in self.pool) / len(self.pool))
        return [StepSpec(load_label(self.settings, level), level, isl, osl) for level in self.settings.load_levels]

    async def run(self, step: StepSpec, shape: LoadShape, send) -> None:
        await drive_pool(self.pool, shape, send)
