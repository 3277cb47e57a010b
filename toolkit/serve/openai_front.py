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

from toolkit.bench.clients import TritonStreams, describe_rpc_error, ensemble_request, read_stream_response


def chat_prompt(messages: list[dict], tokenizer) -> str:
    """The model's chat template when it has one; else plain `role: content` lines."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    lines = [f"{m.get('role', 'user')}: {m.get('content', '')}" for m in messages]
    return "\n".join(lines) + "\nassistant:"


class TritonBackend:
    def __init__(self, grpc_url: str, model: str):
        self.url = grpc_url
        self.streams = None  # made on first use, inside the server's event loop
        self.model = model

    async def stream(self, text: str, max_tokens: int, ignore_eos: bool):
        """Yields (text delta, tokens in this response)."""
        import grpc

        if self.streams is None:
            self.streams = TritonStreams(self.url)
        call = self.streams.acquire()
        finished = False
        try:
            await call.write(ensemble_request(self.model, text, max_tokens, ignore_eos))
            while True:
                response = await call.read()
                if response is grpc.aio.EOF:
                    raise RuntimeError("the Triton gRPC stream closed before the last response")
                piece, count, final, error = read_stream_response(response)
                if error is not None:
                    raise RuntimeError(error)
                if piece is not None:
                    yield piece, count if count is not None else 1
                if final:
                    finished = True
                    return
        except grpc.aio.AioRpcError as exc:
            raise RuntimeError(describe_rpc_error(exc)[0]) from exc
        finally:
            self.streams.release(call, finished)


def make_app(backend: TritonBackend, tokenizer, served_name: str):
    from aiohttp import web

    async def models(_request):
        return web.json_response({"object": "list", "data": [{"id": served_name, "object": "model",
                                                              "owned_by": "toolkit"}]})

    def bad_request(message: str):
        return web.json_response({"error": {"message": message, "type": "invalid_request_error"}}, status=400)

    async def generate(request, chat: bool):
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return bad_request("body is not JSON")
        if chat:
            if not isinstance(body.get("messages"), list):
                return bad_request("messages must be a list")
            prompt = chat_prompt(body["messages"], tokenizer)
        else:
            prompt = body.get("prompt")
            prompt = prompt[0] if isinstance(prompt, list) and prompt else prompt
            if not isinstance(prompt, str):
                return bad_request("prompt must be a string")
        max_tokens = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
        # ignore_eos (vLLM / trtllm-serve) or min_tokens == max_tokens: generate exactly max_tokens.
        ignore_eos = bool(body.get("ignore_eos") or int(body.get("min_tokens") or 0) >= max_tokens)
        stream = bool(body.get("stream"))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
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

        completion_tokens = 0
        if not stream:
            pieces = []
            try:
                async for text, count in backend.stream(prompt, max_tokens, ignore_eos):
                    pieces.append(text)
                    completion_tokens += count
            except RuntimeError as exc:
                return web.json_response({"error": {"message": str(exc), "type": "server_error"}}, status=500)
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
            async for text, count in backend.stream(prompt, max_tokens, ignore_eos):
                completion_tokens += count
                await chunk(choices=[choice(text, None)])
            finish = "length" if completion_tokens >= max_tokens else "stop"
            await chunk(choices=[choice("", finish)])
            if include_usage:
                await chunk(choices=[], usage=usage(completion_tokens))
        except RuntimeError as exc:
            await event({"error": {"message": str(exc), "type": "server_error"}})
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", lambda _r: web.Response(text="ok"))
    app.router.add_post("/v1/completions", lambda r: generate(r, chat=False))
    app.router.add_post("/v1/chat/completions", lambda r: generate(r, chat=True))
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
    parser.add_argument("--served-name", default="toolkit", help="model id reported on /v1/models")
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    web.run_app(make_app(TritonBackend(args.grpc_url, args.model), tokenizer, args.served_name),
                host=args.host, port=args.port, print=None)


if __name__ == "__main__":
    main()
