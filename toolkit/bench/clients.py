"""Endpoint clients behind one interface. Clients only time and collect; they compute no statistics.

Each client fills a RequestRecord: one entry in `chunk_times` per streamed response that carries
output, `end_time` at the final response, `error`/`error_kind` on failure.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Protocol

import numpy as np

from toolkit.bench.records import RequestRecord


class EndpointClient(Protocol):
    name: str

    async def generate(self, text: str, max_tokens: int, record: RequestRecord) -> None: ...

    async def close(self) -> None: ...


def classify_error(exc: BaseException) -> str:
    text = str(exc).lower()
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)) or "deadline" in text or "timed out" in text:
        return "timeout"
    if any(s in text for s in ("unavailable", "connection", "connect", "reset by peer", "broken pipe", "eof")):
        return "connection"
    return "client"


def ensemble_inputs(text: str, max_tokens: int, ignore_eos: bool = True) -> list:
    """gRPC inputs for the repository's ensemble / tensorrt_llm_bls tensors, streaming on."""
    from tritonclient.grpc import InferInput

    values = {
        "text_input": (np.array([[text]], dtype=object), "BYTES"),
        "max_tokens": (np.array([[max_tokens]], dtype=np.int32), "INT32"),
        "stream": (np.array([[True]]), "BOOL"),
        "ignore_eos": (np.array([[ignore_eos]]), "BOOL"),
    }
    inputs = []
    for name, (array, dtype) in values.items():
        tensor = InferInput(name, list(array.shape), dtype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def read_ensemble_response(result) -> tuple[str | None, int | None, bool]:
    """(text in this response or None, tokens the engine reports for it or None, is it the final one)."""
    out = result.as_numpy("text_output")
    text = None
    if out is not None and out.size:
        text = b"".join(v if isinstance(v, bytes) else str(v).encode() for v in out.reshape(-1)).decode("utf-8", "replace")
    count = result.as_numpy("output_token_count")
    final = result.get_response().parameters.get("triton_final_response")
    return text, int(count.sum()) if count is not None else None, bool(final is not None and final.bool_param)


def describe_grpc_error(error: BaseException) -> tuple[str, str]:
    """(one-line message, kind) for what a gRPC stream yields or raises."""
    from tritonclient.utils import InferenceServerException

    code = getattr(error, "code", None)
    if callable(code) and hasattr(error, "details"):  # grpc.aio.AioRpcError: the stream itself failed
        name = getattr(code(), "name", str(code()))
        kind = "timeout" if name == "DEADLINE_EXCEEDED" else "connection"
        return f"gRPC {name}: {error.details()}", kind
    if isinstance(error, InferenceServerException):  # the server answered this request with an error
        status = (error.status() or "").upper()
        kind = "connection" if "UNAVAILABLE" in status else "server_error"
        return (error.message() or str(error)).splitlines()[0], kind
    return (str(error).splitlines() or [repr(error)])[0], classify_error(error)


class _GrpcStream:
    """One long-lived bidirectional stream that carries one request at a time (like a perf_analyzer
    context): opening a stream per request costs client CPU that would show up as TTFT under load."""

    def __init__(self, client):
        self.requests: asyncio.Queue = asyncio.Queue()
        self.responses: asyncio.Queue = asyncio.Queue()

        async def outgoing():
            while True:
                item = await self.requests.get()
                if item is None:
                    return
                yield item

        async def pump():
            try:
                async for result, error in client.stream_infer(outgoing()):
                    self.responses.put_nowait((time.perf_counter(), result, error))
            except Exception as exc:  # noqa: BLE001 — the stream broke: the request in flight gets the error
                self.responses.put_nowait((time.perf_counter(), None, exc))
            self.responses.put_nowait((time.perf_counter(), None, ConnectionError("gRPC stream closed")))

        self.task = asyncio.get_running_loop().create_task(pump())

    @property
    def alive(self) -> bool:
        return not self.task.done()

    async def close(self) -> None:
        self.requests.put_nowait(None)
        try:
            await asyncio.wait_for(self.task, 2)
        except (asyncio.TimeoutError, Exception):  # noqa: BLE001
            self.task.cancel()


class TritonGrpcClient:
    """Triton gRPC bidirectional streaming (what genai-perf's triton service kind uses), over a pool of
    long-lived streams, one request in flight on each."""

    name = "triton-grpc"

    def __init__(self, url: str, model: str = "ensemble"):
        import tritonclient.grpc.aio as grpc_aio

        self.client = grpc_aio.InferenceServerClient(url)
        self.model = model
        self._idle: list[_GrpcStream] = []
        self._all: list[_GrpcStream] = []

    def _acquire(self) -> _GrpcStream:
        while self._idle:
            stream = self._idle.pop()
            if stream.alive:
                return stream
        stream = _GrpcStream(self.client)
        self._all.append(stream)
        return stream

    async def generate(self, text: str, max_tokens: int, record: RequestRecord) -> None:
        request = {"model_name": self.model, "inputs": ensemble_inputs(text, max_tokens),
                   "enable_empty_final_response": True, "request_id": str(record.request_index)}
        stream = self._acquire()
        pieces = []
        finished = False
        try:
            record.send_time = time.perf_counter()
            stream.requests.put_nowait(request)
            while True:
                now, result, error = await stream.responses.get()
                if error is not None:
                    record.error, record.error_kind = describe_grpc_error(error)
                    break
                text, count, final = read_ensemble_response(result)
                if text is not None:
                    record.chunk_times.append(now)
                    pieces.append(text)
                    if count is not None:
                        record.server_output_tokens = (record.server_output_tokens or 0) + count
                if final:
                    record.end_time = now
                    finished = True
                    break
        finally:
            record.output_text = "".join(pieces)
            if finished and stream.alive:
                self._idle.append(stream)  # reuse only a stream whose request ended cleanly
            else:
                await stream.close()

    async def close(self) -> None:
        for stream in self._all:
            await stream.close()
        await self.client.close()


async def post_sse(session, url: str, body: dict, record: RequestRecord):
    """POST and yield (arrival time, data) for each server-sent event; stamps send_time; a non-200
    answer becomes the record's server_error."""
    record.send_time = time.perf_counter()
    async with session.post(url, json=body) as response:
        if response.status != 200:
            detail = (await response.text())[:200]
            record.error, record.error_kind = f"HTTP {response.status}: {detail}", "server_error"
            return
        async for raw in response.content:
            line = raw.decode("utf-8", "replace").strip()
            if line.startswith("data:"):
                yield time.perf_counter(), line[5:].strip()


class TritonHttpClient:
    """Triton's HTTP generate extension: POST /v2/models/<m>/generate_stream, server-sent events."""

    name = "triton-http"

    def __init__(self, url: str, model: str = "ensemble"):
        import aiohttp

        self.url = f"{url.rstrip('/')}/v2/models/{model}/generate_stream"
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))

    async def generate(self, text: str, max_tokens: int, record: RequestRecord) -> None:
        body = {"text_input": text, "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
        pieces = []
        async for now, data in post_sse(self.session, self.url, body, record):
            event = json.loads(data)
            if "error" in event:
                record.error, record.error_kind = str(event["error"]), "server_error"
                return
            if "text_output" in event:
                record.chunk_times.append(now)
                pieces.append(event["text_output"])
                if "output_token_count" in event:
                    count = event["output_token_count"]
                    count = sum(count) if isinstance(count, list) else int(count)
                    record.server_output_tokens = (record.server_output_tokens or 0) + count
        if record.error is None:
            record.end_time = time.perf_counter()
        record.output_text = "".join(pieces)

    async def close(self) -> None:
        await self.session.close()


class OpenAICompletionsClient:
    """OpenAI-compatible /v1/completions with stream=true (trtllm-serve, vLLM, our --openai front).
    Asks for exactly max_tokens (ignore_eos, min_tokens) and for usage, so token counts are the server's."""

    name = "openai-completions"
    path = "/v1/completions"

    def __init__(self, url: str, model: str):
        import aiohttp

        base = url.rstrip("/")
        self.url = base + self.path if not base.endswith("/v1") else base + self.path[3:]
        self.model = model
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))

    def body(self, text: str, max_tokens: int) -> dict:
        return {"model": self.model, "prompt": text, "max_tokens": max_tokens, "min_tokens": max_tokens,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}, "temperature": 0}

    @staticmethod
    def piece(choice: dict) -> str | None:
        return choice.get("text")

    async def generate(self, text: str, max_tokens: int, record: RequestRecord) -> None:
        pieces = []
        async for now, data in post_sse(self.session, self.url, self.body(text, max_tokens), record):
            if data == "[DONE]":
                record.end_time = now
                break
            event = json.loads(data)
            if "error" in event:
                record.error, record.error_kind = str(event["error"].get("message", event["error"])), "server_error"
                return
            for choice in event.get("choices") or []:
                piece = self.piece(choice)
                if piece:  # role-only and finish chunks carry no output
                    record.chunk_times.append(now)
                    pieces.append(piece)
            usage = event.get("usage")
            if usage and usage.get("completion_tokens") is not None:
                record.server_output_tokens = int(usage["completion_tokens"])
        if record.end_time is None and record.error is None:
            record.end_time = time.perf_counter()
        record.output_text = "".join(pieces)

    async def close(self) -> None:
        await self.session.close()


class OpenAIChatClient(OpenAICompletionsClient):
    """OpenAI-compatible /v1/chat/completions with stream=true; the prompt is one user message."""

    name = "openai-chat"
    path = "/v1/chat/completions"

    def body(self, text: str, max_tokens: int) -> dict:
        body = super().body(text, max_tokens)
        del body["prompt"]
        return body | {"messages": [{"role": "user", "content": text}], "max_completion_tokens": max_tokens}

    @staticmethod
    def piece(choice: dict) -> str | None:
        return (choice.get("delta") or {}).get("content")


CLIENTS = {"triton-grpc": TritonGrpcClient, "triton-http": TritonHttpClient,
           "openai-completions": OpenAICompletionsClient, "openai-chat": OpenAIChatClient}


def make_client(endpoint: str, url: str, model: str) -> EndpointClient:
    if endpoint not in CLIENTS:
        from toolkit.errors import ToolkitError

        raise ToolkitError(f"unknown endpoint {endpoint!r}", f"use one of: {', '.join(CLIENTS)}")
    return CLIENTS[endpoint](url, model)
