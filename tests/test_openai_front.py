"""The OpenAI front's request validation, as the OpenAI API and vLLM answer (pure; the served path is in
test_e2e.py), and the OpenAI client's reading of streamed chunks."""

import pytest

from toolkit.bench.clients import OpenAIChatClient, OpenAICompletionsClient
from toolkit.serve.openai_front import InvalidRequest, parse_request

GREEDY_MODEL = {"text_input", "max_tokens", "stream", "ignore_eos"}
SAMPLING_MODEL = GREEDY_MODEL | {"temperature", "top_p", "top_k", "seed"}


def parse(body, inputs=GREEDY_MODEL, chat=False):
    return parse_request({"model": "small", "prompt": "hi"} | body, chat, "small", 768, inputs)


def refusal(body, **kw):
    with pytest.raises(InvalidRequest) as err:
        parse(body, **kw)
    return err.value


def test_unknown_model_is_404_naming_the_served_one():
    err = refusal({"model": "gpt-4"})
    assert err.status == 404 and err.code == "model_not_found" and "`small`" in str(err)


@pytest.mark.parametrize("body, needle", [
    ({"n": 3}, "n=3"), ({"max_tokens": 768}, "768 tokens"), ({"max_tokens": 0}, ">= 1"),
    ({"max_tokens": "8"}, ">= 1"), ({"temperature": 3}, "[0, 2]"), ({"top_p": 0}, "(0, 1]"),
    ({"prompt": ["a", "b"]}, "one prompt"), ({"temperature": 0.8}, "decodes greedily"),
])
def test_bad_fields_are_400_with_the_reason(body, needle):
    err = refusal(body)
    assert err.status == 400 and needle in str(err)


def test_greedy_values_pass_without_sampling_inputs():
    req = parse({"temperature": 0, "top_p": 1, "seed": 7, "max_tokens": 32, "min_tokens": 32})
    assert req["sampling"] == {} and req["max_tokens"] == 32 and req["ignore_eos"]


def test_sampling_fields_become_the_models_inputs_when_it_has_them():
    req = parse({"temperature": 0.8, "top_p": 0.9, "top_k": 40, "seed": 3}, inputs=SAMPLING_MODEL)
    assert req["sampling"] == {"temperature": ("temperature", "FP32", 0.8), "top_p": ("top_p", "FP32", 0.9),
                               "top_k": ("top_k", "INT32", 40), "seed": ("seed", "UINT64", 3)}


def test_chat_needs_messages():
    assert refusal({"messages": []}, chat=True).status == 400
    assert "string content" in str(refusal({"messages": [{"role": "user", "content": [{"type": "image"}]}]},
                                           chat=True))
    assert parse({"messages": [{"role": "user", "content": "x"}]}, chat=True)["prompt"] is None


@pytest.mark.parametrize("choice, piece, counts", [
    ({"index": 0, "text": "a", "finish_reason": None}, "a", True),
    # a byte-level token that completes no character yet: the server counts it in usage, so do we
    ({"index": 0, "text": "", "finish_reason": None}, "", True),
    ({"index": 0, "text": "", "finish_reason": "length"}, "", False),
])
def test_completion_chunks_that_carry_a_token(choice, piece, counts):
    assert OpenAICompletionsClient.carries_token(choice, OpenAICompletionsClient.piece(choice)) is counts
    assert OpenAICompletionsClient.piece(choice) == piece


@pytest.mark.parametrize("delta, finish, counts", [
    ({"role": "assistant", "content": ""}, None, False), ({"content": ""}, None, True),
    ({"content": "x"}, None, True), ({"content": ""}, "stop", False), ({}, "stop", False),
])
def test_chat_chunks_that_carry_a_token(delta, finish, counts):
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    assert OpenAIChatClient.carries_token(choice, OpenAIChatClient.piece(choice)) is counts


def test_openai_client_asks_the_server_for_its_model_or_says_why():
    import asyncio

    from aiohttp import web
    from local_http import serving

    from toolkit.errors import ToolkitError

    async def run():
        async def models(_request):
            return web.json_response({"data": [{"id": "small"}]})

        async with serving({"/v1/models": models}) as url:
            found = OpenAIChatClient(url, None)
            await found.prepare(1)
            named = OpenAIChatClient(url + "/v1", "mine")
            await named.prepare(1)
            missing = OpenAIChatClient(url + "/elsewhere", None)
            with pytest.raises(ToolkitError, match="lists no model"):
                await missing.prepare(1)
            for client in (found, named, missing):
                await client.close()
            return found.model, named.model, named.url

    model, named, url = asyncio.run(run())
    assert model == "small" and named == "mine" and url.endswith("/v1/chat/completions")
