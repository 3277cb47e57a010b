"""An OpenAI-compatible HTTP front for the toolkit's Triton deployment (`toolkit serve --openai`).

/v1/models, /v1/completions and /v1/chat/completions (streaming as server-sent events, or not),
translated to Triton gRPC streaming of the repository's `tensorrt_llm_bls` (or `ensemble`) model,
so OpenAI-speaking clients and benchmark tools (AIPerf, vLLM's benchmark, our own sweep) work against it.
`usage` carries the engine's own token counts. Run: python -m toolkit.serve.openai_front --help
"""

from __future__ import annotations

import argparse
import json
import time
import uuid

from toolkit.bench.clients import (LLMAPI_MARKER_INPUT, TritonStreams, describe_rpc_error, ensemble_request,
                                   llmapi_request, read_stream_response)

# TensorRT-LLM's llmapi model names its sampling inputs with this prefix (sampling_param_temperature, ...).
LLMAPI_SAMPLING_PREFIX = "sampling_param_"


def chat_prompt(messages: list[dict], tokenizer) -> str:
    """The model's chat template when it has one; else plain `role: content` lines."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    lines = [f"{m.get('role', 'user')}: {m.get('content', '')}" for m in messages]
    return "\n".join(lines) + "\nassistant:"


class BackendError(RuntimeError):
    """The Triton call failed: `refused` when the server answered the request with an error (bad input,
    over the engine's limits), else the connection or model failed."""

    def __init__(self, message: str, refused: bool):
        super().__init__(message)
        self.refused = refused


# OpenAI sampling fields → the ensemble's optional inputs (TensorRT-LLM's names), passed when the model has them.
SAMPLING_INPUTS = {"temperature": ("temperature", "FP32"), "top_p": ("top_p", "FP32"), "top_k": ("top_k", "INT32"),
                   "seed": ("seed", "UINT64")}


class TritonBackend:
    def __init__(self, grpc_url: str, model: str):
        self.url = grpc_url
        self.streams = None  # made on first use, inside the server's event loop
        self.model = model
        self.inputs: set[str] | None = None
        # The llmapi model (engine-free target): its own tensor names, whole text so far in each response.
        self.llmapi = False

    async def input_names(self) -> set[str]:
        """The model's input tensors (asked once): which sampling fields it can take."""
        if self.inputs is None:
            from tritonclient.grpc import service_pb2

            self._open()
            metadata = await self.streams.stub.ModelMetadata(service_pb2.ModelMetadataRequest(name=self.model))
            names = {tensor.name for tensor in metadata.inputs}
            self.llmapi = LLMAPI_MARKER_INPUT in names
            # In the ensemble's terms, so one request parser serves both models.
            self.inputs = {n.removeprefix(LLMAPI_SAMPLING_PREFIX) for n in names} if self.llmapi else names
        return self.inputs

    def _open(self) -> None:
        if self.streams is None:
            self.streams = TritonStreams(self.url)

    async def stream(self, text: str, max_tokens: int, ignore_eos: bool, sampling: dict | None = None):
        """Yields (text delta, tokens in this response); raises BackendError."""
        import grpc

        self._open()
        call = self.streams.acquire()
        finished = False
        if self.llmapi:  # no ignore_eos input: generation may end at EOS before max_tokens
            request, prefix, shape = llmapi_request(self.model, text, max_tokens), LLMAPI_SAMPLING_PREFIX, [1]
        else:
            request, prefix, shape = ensemble_request(self.model, text, max_tokens, ignore_eos), "", [1, 1]
        for name, (tensor, datatype, value) in (sampling or {}).items():
            request.inputs.add(name=prefix + tensor, datatype=datatype, shape=shape)
            request.raw_input_contents.append(_pack(datatype, value))
        seen = ""  # llmapi: the text already passed on
        try:
            await call.write(request)
            while True:
                response = await call.read()
                if response is grpc.aio.EOF:
                    raise BackendError("the Triton gRPC stream closed before the last response", refused=False)
                piece, count, final, error = read_stream_response(response)
                if error is not None:
                    raise BackendError(error, refused=True)
                if piece is not None and self.llmapi:
                    piece, seen = (piece[len(seen):] if piece.startswith(seen) else piece), piece
                if piece is not None:
                    yield piece, count if count is not None else 1
                if final:
                    finished = True
                    return
        except grpc.aio.AioRpcError as exc:
            raise BackendError(describe_rpc_error(exc)[0], refused=False) from exc
        finally:
            self.streams.release(call, finished)


def _pack(datatype: str, value) -> bytes:
    import struct

    return struct.pack({"FP32": "<f", "INT32": "<i", "UINT64": "<Q"}[datatype], value)


def error_body(message: str, kind: str, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


class InvalidRequest(ValueError):
    def __init__(self, message: str, status: int = 400, code: str | None = None):
        super().__init__(message)
        self.status, self.code = status, code


def parse_request(body: dict, chat: bool, served_name: str, max_seq_len: int | None, inputs: set[str]) -> dict:
    """Validate an OpenAI request as the OpenAI API and vLLM do (404 for an unknown model, 400 with the
    reason for the rest); returns what the backend call needs. Pure: no I/O."""
    model = body.get("model")
    if model != served_name:
        raise InvalidRequest(f"The model `{model}` does not exist: this server serves `{served_name}` (GET /v1/models)",
                             status=404, code="model_not_found")
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise InvalidRequest("messages must be a non-empty list")
        if not all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages):
            raise InvalidRequest("each message must be an object with a string content (text only)")
        prompt = None
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list):
            if len(prompt) != 1:
                raise InvalidRequest("send one prompt per request (a list of one string)")
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise InvalidRequest("prompt must be a string")
    n = body.get("n", 1)
    if n != 1:
        raise InvalidRequest(f"n={n} is not supported: this server returns one choice per request; send n=1")
    raw_max = body.get("max_completion_tokens", body.get("max_tokens"))
    max_tokens = 16 if raw_max is None else raw_max
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise InvalidRequest(f"max_tokens must be an integer >= 1, got {raw_max!r}")
    if max_seq_len is not None and max_tokens >= max_seq_len:
        raise InvalidRequest(f"max_tokens={max_tokens} leaves no room for the prompt: this model's maximum context "
                             f"length is {max_seq_len} tokens (prompt + completion); ask for fewer tokens")
    sampling = {}
    for field, (tensor, datatype) in SAMPLING_INPUTS.items():
        value = body.get(field)
        if value is None:
            continue
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise InvalidRequest(f"{field} must be a number, got {value!r}")
        if field == "temperature" and not 0 <= value <= 2:
            raise InvalidRequest(f"temperature={value} must be within [0, 2]")
        if field == "top_p" and not 0 < value <= 1:
            raise InvalidRequest(f"top_p={value} must be within (0, 1]")
        if tensor in inputs:
            sampling[field] = (tensor, datatype, int(value) if datatype != "FP32" else float(value))
        elif not _is_greedy(field, value):
            raise InvalidRequest(f"{field}={value} is not supported: this deployment's model ({', '.join(sorted(inputs))})"
                                 " decodes greedily; send temperature 0 or leave the sampling fields out")
    min_tokens = body.get("min_tokens") or 0
    return {"prompt": prompt, "max_tokens": max_tokens, "sampling": sampling,
            # ignore_eos (vLLM / trtllm-serve) or min_tokens == max_tokens: generate exactly max_tokens.
            "ignore_eos": bool(body.get("ignore_eos") or (isinstance(min_tokens, int) and min_tokens >= max_tokens)),
            "stream": bool(body.get("stream")),
            "include_usage": bool((body.get("stream_options") or {}).get("include_usage"))}


def _is_greedy(field: str, value) -> bool:
    """Values that ask for nothing beyond greedy decoding (what a model without sampling inputs does)."""
    return {"temperature": value == 0, "top_p": value == 1, "top_k": value in (0, 1), "seed": True}[field]


def make_app(backend: TritonBackend, tokenizer, served_name: str, max_seq_len: int | None = None):
    from aiohttp import web

    async def models(_request):
        return web.json_response({"object": "list", "data": [{"id": served_name, "object": "model",
                                                              "owned_by": "toolkit", "max_model_len": max_seq_len}]})

    def error(message: str, status: int, code: str | None = None):
        kind = "invalid_request_error" if status < 500 else "server_error"
        return web.json_response(error_body(message, kind, code), status=status)

    async def generate(request, chat: bool):
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return error("body is not JSON", 400)
        if not isinstance(body, dict):
            return error("body must be a JSON object", 400)
        try:
            inputs = await backend.input_names()
        except Exception as exc:  # noqa: BLE001 — Triton is down or the model is not loaded
            detail = describe_rpc_error(exc)[0] if hasattr(exc, "details") else (str(exc).splitlines() or ["?"])[0]
            return error(f"the Triton model {backend.model} is not available: {detail}", 503)
        try:
            req = parse_request(body, chat, served_name, max_seq_len, inputs)
        except InvalidRequest as exc:
            return error(str(exc), exc.status, exc.code)
        prompt = chat_prompt(body["messages"], tokenizer) if chat else req["prompt"]
        max_tokens, stream = req["max_tokens"], req["stream"]
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        created = int(time.time())
        kind = "chat.completion" if chat else "text_completion"

        def choice(text: str, finish):
            if chat:
                return {"index": 0, "delta" if stream else "message":
                        ({"content": text} if stream else {"role": "assistant", "content": text}),
                        "finish_reason": finish}
            return {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}

        def usage(completion: int) -> dict:
            # Tokenized only when usage is sent: the event loop that streams every request's tokens runs this.
            prompt_tokens = len(tokenizer(prompt).input_ids)
            return {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
                    "total_tokens": prompt_tokens + completion}

        tokens = backend.stream(prompt, max_tokens, req["ignore_eos"], req["sampling"])
        try:  # Before any byte is sent, a refusal is still an HTTP status (as vLLM answers it), not an event.
            first = await anext(tokens, None)
        except BackendError as exc:
            return error(str(exc), 400 if exc.refused else 503)
        completion_tokens = 0
        if not stream:
            pieces = []
            try:
                if first is not None:
                    pieces.append(first[0])
                    completion_tokens += first[1]
                async for text, count in tokens:
                    pieces.append(text)
                    completion_tokens += count
            except BackendError as exc:
                return error(str(exc), 500)
            finish = "length" if completion_tokens >= max_tokens else "stop"
            return web.json_response({"id": rid, "object": kind, "created": created, "model": served_name,
                                      "choices": [choice("".join(pieces), finish)], "usage": usage(completion_tokens)})

        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        chunk_kind = "chat.completion.chunk" if chat else "text_completion"

        async def event(payload) -> None:
            await response.write(f"data: {json.dumps(payload)}\n\n".encode())

        async def chunk(**fields) -> None:
            await event({"id": rid, "object": chunk_kind, "created": created, "model": served_name, **fields})

        try:
            if first is not None:
                completion_tokens += first[1]
                await chunk(choices=[choice(first[0], None)])
            async for text, count in tokens:
                completion_tokens += count
                await chunk(choices=[choice(text, None)])
            finish = "length" if completion_tokens >= max_tokens else "stop"
            await chunk(choices=[choice("", finish)])
            if req["include_usage"]:
                await chunk(choices=[], usage=usage(completion_tokens))
        except BackendError as exc:
            await event(error_body(str(exc), "server_error"))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def health(_request):
        return web.Response(text="ok")

    async def completions(request):
        return await generate(request, chat=False)

    async def chat_completions(request):
        return await generate(request, chat=True)

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    return app


def main() -> None:
    from aiohttp import web
    from transformers import AutoTokenizer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grpc-url", required=True)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", default="tensorrt_llm_bls", help="Triton model to call")
    parser.add_argument("--served-name", default="toolkit", help="model id reported on /v1/models (and required)")
    parser.add_argument("--max-seq-len", type=int, default=None, help="the engine's max_seq_len (prompt + completion)")
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    web.run_app(make_app(TritonBackend(args.grpc_url, args.model), tokenizer, args.served_name, args.max_seq_len),
                host=args.host, port=args.port, print=None)


if __name__ == "__main__":
    main()
