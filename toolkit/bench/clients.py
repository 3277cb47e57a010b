"""Endpoint clients behind one interface. Clients only time and collect; they compute no statistics.

Each client fills a RequestRecord: one entry in `chunk_times` per streamed response that carries
output, `end_time` at the final response, `error`/`error_kind` on failure.
"""

from __future__ import annotations

import asyncio
import json
import struct
import time
from typing import Protocol

from toolkit.bench.records import RequestRecord


class EndpointClient(Protocol):
    name: str

    async def prepare(self, concurrency: int) -> None:
        """Before a step: open what `concurrency` requests in flight need (connections, streams)."""

    async def generate(self, text: str, max_tokens: int, record: RequestRecord) -> None: ...

    async def close(self) -> None: ...


def classify_error(exc: BaseException) -> str:
    text = str(exc).lower()
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)) or "deadline" in text or "timed out" in text:
        return "timeout"
    if any(s in text for s in ("unavailable", "connection", "connect", "reset by peer", "broken pipe", "eof")):
        return "connection"
    return "client"


def ensemble_request(model: str, text: str, max_tokens: int, ignore_eos: bool = True, request_id: str = ""):
    """The gRPC ModelInferRequest for the repository's ensemble / tensorrt_llm_bls tensors, streaming on.

    Built straight as a protobuf with raw contents (what tritonclient's InferInput ends up as), so a
    request costs the event loop microseconds rather than a numpy round trip per tensor.
    """
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=model, id=request_id)
    encoded = text.encode("utf-8")
    tensors = (
        ("text_input", "BYTES", struct.pack("<I", len(encoded)) + encoded),
        ("max_tokens", "INT32", struct.pack("<i", max_tokens)),
        ("stream", "BOOL", b"\x01"),
        ("ignore_eos", "BOOL", b"\x01" if ignore_eos else b"\x00"),
    )
    for name, datatype, raw in tensors:
        request.inputs.add(name=name, datatype=datatype, shape=[1, 1])
        request.raw_input_contents.append(raw)
    # The server then marks the last response even when the model ends a stream with flags only.
    request.parameters["triton_enable_empty_final_response"].bool_param = True
    return request


def _bytes_elements(raw: bytes) -> list[bytes]:
    """A BYTES tensor's elements: each a 4-byte little-endian length, then the bytes."""
    items, at = [], 0
    while at + 4 <= len(raw):
        (length,) = struct.unpack_from("<I", raw, at)
        items.append(raw[at + 4:at + 4 + length])
        at += 4 + length
    return items


def read_stream_response(response) -> tuple[str | None, int | None, bool, str | None]:
    """(text in this response or None, tokens the engine reports for it or None, is it the final one,
    the server's error message or None) for one gRPC ModelStreamInferResponse."""
    if response.error_message:
        return None, None, True, response.error_message
    result = response.infer_response
    text = count = None
    for output, raw in zip(result.outputs, result.raw_output_contents):
        if output.name == "text_output" and raw:
            text = b"".join(_bytes_elements(raw)).decode("utf-8", "replace")
        elif output.name == "output_token_count" and raw:
            count = int(sum(struct.unpack(f"<{len(raw) // 4}i", raw)))
    final = result.parameters.get("triton_final_response")
    return text, count, bool(final is not None and final.bool_param), None


class TritonStreams:
    """A pool of long-lived ModelStreamInfer calls, one request in flight on each (like perf_analyzer's
    contexts): opening a stream per request costs client CPU that would show up as TTFT under load.
    Requests are written and responses read on the call directly, without tritonclient's per-request
    iterator task and numpy wrapping."""

    def __init__(self, url: str):
        import grpc
        from tritonclient.grpc import service_pb2_grpc

        self.channel = grpc.aio.insecure_channel(url, options=[("grpc.max_receive_message_length", 2**31 - 1)])
        self.stub = service_pb2_grpc.GRPCInferenceServiceStub(self.channel)
        self._idle: list = []

    async def open(self, count: int) -> None:
        """Have `count` streams open and idle before a step, so its first requests do not pay for
        stream set-up (perf_analyzer creates its contexts before measuring, too)."""
        idle = [call for call in self._idle if not call.done()]
        calls = [self.stub.ModelStreamInfer() for _ in range(max(0, count - len(idle)))]
        self._idle = idle + calls

    def acquire(self):
        while self._idle:
            call = self._idle.pop()
            if not call.done():
                return call
        return self.stub.ModelStreamInfer()

    def release(self, call, reusable: bool) -> None:
        """Back to the pool if its request ended cleanly; otherwise the stream's state is unknown: cancel it."""
        if reusable and not call.done():
            self._idle.append(call)
        else:
            call.cancel()

    async def close(self) -> None:
        for call in self._idle:
            call.cancel()
        self._idle.clear()
        await self.channel.close()


def describe_rpc_error(error) -> tuple[str, str]:
    """(one-line message, kind) for a gRPC call that failed as a whole (grpc.aio.AioRpcError)."""
    name = getattr(error.code(), "name", str(error.code()))
    kind = "timeout" if name == "DEADLINE_EXCEEDED" else "connection"
    details = (error.details() or "").splitlines()
    return (f"gRPC {name}: {details[0]}" if details else f"gRPC {name}"), kind


class TritonGrpcClient:
    """Triton gRPC bidirectional streaming (what genai-perf's triton service kind uses)."""

    name = "triton-grpc"

    def __init__(self, url: str, model: str | None = None):
        self.streams = TritonStreams(url)
        self.model = model or "ensemble"

    async def prepare(self, concurrency: int) -> None:
        await self.streams.open(concurrency)

    async def generate(self, text: str, max_tokens: int, record: RequestRecord) -> None:
        import grpc

        request = self.build_request(text, max_tokens, str(record.request_index))
        call = self.streams.acquire()
        pieces = []
        finished = False
        try:
            record.send_time = time.perf_counter()
            await call.write(request)
            while True:
                response = await call.read()
                now = time.perf_counter()
                if response is grpc.aio.EOF:
                    record.error, record.error_kind = "gRPC stream closed by the server", "connection"
                    break
                piece, count, final, error = read_stream_response(response)
                if error is not None:
                    # the server answered this request with an error (bad input, model failed)
                    record.error, record.error_kind = (error.splitlines() or ["server error"])[0], "server_error"
                    break
                if piece is not None:
                    record.chunk_times.append(now)
                    pieces.append(piece)
                    if count is not None:
                        record.server_output_tokens = (record.server_output_tokens or 0) + count
                if final:
                    record.end_time = now
                    finished = True
                    break
        except grpc.aio.AioRpcError as exc:
            record.error, record.error_kind = describe_rpc_error(exc)
        finally:
            record.output_text = self.join_pieces(pieces)
            self.streams.release(call, finished)

    def build_request(self, text: str, max_tokens: int, request_id: str):
        return ensemble_request(self.model, text, max_tokens, request_id=request_id)

    @staticmethod
    def join_pieces(pieces: list[str]) -> str:
        return "".join(pieces)  # each response carries only its new text

    async def close(self) -> None:
        await self.streams.close()


def http_session():
    """An aiohttp session for streaming clients: no overall timeout (the sweep bounds each request) and
    no cap on connections — aiohttp's default of 100 would queue requests client-side beyond
    concurrency 100, and that wait would be measured as TTFT."""
    import aiohttp

    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None),
                                 connector=aiohttp.TCPConnector(limit=0))


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


class _SseClient:
    """What the HTTP streaming clients share: one uncapped aiohttp session for all requests."""

    def __init__(self):
        self.session = http_session()

    async def prepare(self, concurrency: int) -> None:
        pass  # aiohttp opens connections on demand (uncapped, see http_session)

    async def close(self) -> None:
        await self.session.close()


class TritonHttpClient(_SseClient):
    """Triton's HTTP generate extension: POST /v2/models/<m>/generate_stream, server-sent events."""

    name = "triton-http"

    def __init__(self, url: str, model: str | None = None):
        super().__init__()
        self.url = f"{url.rstrip('/')}/v2/models/{model or 'ensemble'}/generate_stream"

    def body(self, text: str, max_tokens: int) -> dict:
        return {"text_input": text, "max_tokens": max_tokens, "stream": True, "ignore_eos": True}

    join_pieces = staticmethod(TritonGrpcClient.join_pieces)

    async def generate(self, text: str, max_tokens: int, record: RequestRecord) -> None:
        body = self.body(text, max_tokens)
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
        record.output_text = self.join_pieces(pieces)


class OpenAICompletionsClient(_SseClient):
    """OpenAI-compatible /v1/completions with stream=true (trtllm-serve, vLLM, our --openai front).
    Asks for exactly max_tokens (ignore_eos, min_tokens) and for usage, so token counts are the server's."""

    name = "openai-completions"
    path = "/v1/completions"

    def __init__(self, url: str, model: str | None):
        super().__init__()
        base = url.rstrip("/")
        self.base = base if base.endswith("/v1") else base + "/v1"
        self.url = self.base + self.path[3:]
        self.model = model

    async def prepare(self, concurrency: int) -> None:
        """No model named: ask the server which it serves (its first on /v1/models), as a user would."""
        if self.model is None:
            import aiohttp

            from toolkit.errors import ToolkitError

            try:
                async with self.session.get(self.base + "/models") as response:
                    listed = (await response.json()).get("data") or [] if response.status == 200 else []
            except (aiohttp.ClientError, ValueError) as exc:
                raise ToolkitError(f"{self.base}/models did not answer with a model list ({exc})",
                                   "check --url, or name the model with --model") from None
            if not listed:
                raise ToolkitError(f"{self.base}/models lists no model (HTTP {response.status})",
                                   "name the model with --model")
            self.model = listed[0]["id"]

    def body(self, text: str, max_tokens: int) -> dict:
        return {"model": self.model, "prompt": text, "max_tokens": max_tokens, "min_tokens": max_tokens,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}, "temperature": 0}

    @staticmethod
    def piece(choice: dict) -> str | None:
        return choice.get("text")

    @staticmethod
    def carries_token(choice: dict, piece: str | None) -> bool:
        """A chunk with text, or an empty-text chunk before the finish: a token arrived whose bytes do not
        complete a character yet (byte-level BPE), which the server counts in `usage`. Role-only and
        finish-only chunks carry none."""
        if piece:
            return True
        return piece is not None and choice.get("finish_reason") is None and "role" not in (choice.get("delta") or {})

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
                if self.carries_token(choice, piece):
                    record.chunk_times.append(now)
                    pieces.append(piece)
            usage = event.get("usage")
            if usage and usage.get("completion_tokens") is not None:
                record.server_output_tokens = int(usage["completion_tokens"])
        if record.end_time is None and record.error is None:
            record.end_time = time.perf_counter()
        record.output_text = "".join(pieces)


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
    if endpoint in LLMAPI_CLIENTS and serves_llmapi_model(endpoint, url, model):
        return LLMAPI_CLIENTS[endpoint](url, model)
    return CLIENTS[endpoint](url, model)


# --- TensorRT-LLM's llmapi model: the engine-free GPU target's repository ------------------------------
# One `tensorrt_llm` python model, text in and text out, with its own tensor names (no ensemble). A
# streamed text_output is the whole text so far (the LLM API's CompletionOutput.text), not the new piece.
# It has no ignore_eos input and reports no token counts: generation may stop at EOS before max_tokens,
# and the sweep counts tokens with the model's tokenizer (records keep the real count either way).
LLMAPI_MODEL = "tensorrt_llm"
LLMAPI_MARKER_INPUT = "sampling_param_max_tokens"


def llmapi_request(model: str, text: str, max_tokens: int, request_id: str = ""):
    """The gRPC ModelInferRequest for the llmapi model (max_batch_size 0: shapes carry no batch dimension)."""
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=model, id=request_id)
    encoded = text.encode("utf-8")
    tensors = (
        ("text_input", "BYTES", struct.pack("<I", len(encoded)) + encoded),
        ("streaming", "BOOL", b"\x01"),
        ("sampling_param_max_tokens", "INT32", struct.pack("<i", max_tokens)),
        ("sampling_param_exclude_input_from_output", "BOOL", b"\x01"),
    )
    for name, datatype, raw in tensors:
        request.inputs.add(name=name, datatype=datatype, shape=[1])
        request.raw_input_contents.append(raw)
    request.parameters["triton_enable_empty_final_response"].bool_param = True
    return request


def _last_cumulative(pieces: list[str]) -> str:
    return next((piece for piece in reversed(pieces) if piece), "")


class LlmapiGrpcClient(TritonGrpcClient):
    """Triton gRPC streaming against TensorRT-LLM's llmapi model."""

    def __init__(self, url: str, model: str | None = None):
        super().__init__(url, model or LLMAPI_MODEL)

    def build_request(self, text: str, max_tokens: int, request_id: str):
        return llmapi_request(self.model, text, max_tokens, request_id)

    join_pieces = staticmethod(_last_cumulative)


class LlmapiHttpClient(TritonHttpClient):
    """Triton's HTTP generate_stream against TensorRT-LLM's llmapi model."""

    def __init__(self, url: str, model: str | None = None):
        super().__init__(url, model or LLMAPI_MODEL)

    def body(self, text: str, max_tokens: int) -> dict:
        return {"text_input": text, "streaming": True, "sampling_param_max_tokens": max_tokens,
                "sampling_param_exclude_input_from_output": True}

    join_pieces = staticmethod(_last_cumulative)


LLMAPI_CLIENTS = {"triton-grpc": LlmapiGrpcClient, "triton-http": LlmapiHttpClient}


def serves_llmapi_model(endpoint: str, url: str, model: str | None) -> bool:
    """Whether the Triton server at `url` serves the llmapi model under `model` (default: no `ensemble` but a
    `tensorrt_llm` whose inputs are the llmapi model's). Asked once per sweep through the model metadata API."""
    candidates = [model] if model else ["ensemble", LLMAPI_MODEL]
    for name in candidates:
        inputs = _model_inputs(endpoint, url, name)
        if inputs is not None:
            return LLMAPI_MARKER_INPUT in inputs
    return False


def _model_inputs(endpoint: str, url: str, model: str) -> set[str] | None:
    try:
        if endpoint == "triton-grpc":
            import tritonclient.grpc as grpcclient

            with grpcclient.InferenceServerClient(url) as client:
                return {t.name for t in client.get_model_metadata(model).inputs}
        import requests

        answer = requests.get(f"{url.rstrip('/')}/v2/models/{model}", timeout=5)
        return {t["name"] for t in answer.json().get("inputs", [])} if answer.status_code == 200 else None
    except Exception:  # not there (or no server): the caller tries the next name, then the default client
        return None
