"""Per-request records: what the client saw, with no statistics (those are in metrics.py)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class RequestRecord:
    """One request. Times are seconds on the client's monotonic clock (time.perf_counter)."""

    request_index: int
    step: str
    send_time: float
    input_tokens: int
    requested_output_tokens: int
    chunk_times: list[float] = field(default_factory=list)  # arrival of each streamed response with text
    end_time: float | None = None
    output_text: str = ""
    # Output tokens: as the server reported them when it does (Triton `output_token_count`, OpenAI
    # `usage`), else counted with the model's tokenizer on the whole output (genai-perf's way).
    output_tokens: int = 0
    server_output_tokens: int | None = None
    error: str | None = None
    error_kind: str | None = None  # timeout | server_error | connection | client
    warmup: bool = False
    # Workloads (toolkit/bench/workloads/): the request's class in a mixed workload (e.g. short / long),
    # and its conversation and turn in a multi-turn one; None for a plain synthetic sweep.
    request_class: str | None = None
    session: str | None = None
    turn: int | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.end_time is not None and bool(self.chunk_times)

    @property
    def ttft(self) -> float | None:
        return self.chunk_times[0] - self.send_time if self.chunk_times else None

    @property
    def e2e_latency(self) -> float | None:
        """Send → last response carrying output (an empty final flag that follows it is not latency)."""
        return self.chunk_times[-1] - self.send_time if self.ok else None

    @property
    def inter_token_latency(self) -> float | None:
        """(end-to-end − TTFT) / (output tokens − 1), as genai-perf / AIPerf define ITL."""
        if not self.ok or self.output_tokens < 2:
            return None
        return (self.e2e_latency - self.ttft) / (self.output_tokens - 1)

    @property
    def chunk_gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:])]

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_dict(cls, data: dict) -> "RequestRecord":
        return cls(**data)


class RecordWriter:
    """Appends each record as one JSON line the moment it finishes: a run that dies loses nothing."""

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("a")

    def write(self, record: RequestRecord) -> None:
        self._file.write(record.to_json() + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_jsonl(path: Path) -> list[dict]:
    """The JSON objects of a JSON-lines file written while a run went on (none if it is absent)."""
    path = Path(path)
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut short by a crash: everything before it still counts
    return rows


def read_records(path: Path) -> list[RequestRecord]:
    records = []
    for row in read_jsonl(path):
        try:
            records.append(RequestRecord.from_dict(row))
        except TypeError:
            continue  # not a record of this version
    return records
