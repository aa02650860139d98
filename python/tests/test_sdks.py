"""The official SDKs in-process over recovery_llm's transports, against the
loopback fault provider: openai (Chat, Responses) and anthropic, sync and
async, and legacy httpx. The SDKs never retry (``max_retries=0``): whatever
was recovered, the transport recovered."""

from __future__ import annotations

import json
import time
import uuid

import anthropic
import httpx
import openai
import pytest

import recovery_llm
import recovery_llm.httpx as legacy
import provider
from provider import SSE, event_ends, fixture_bytes, load, sends
from watches import cut_timers

CHAT = "openai-chat/happy-usage.sse"
CHAT_ARGS = {"model": "m", "messages": [{"role": "user", "content": "say hello"}], "stream": True}
OVERLOADED_CHUNK = (
    'data: {"error":{"message":"Overloaded","type":"overloaded_error","param":null,"code":"overloaded"}}\n\n'
)
ANTHROPIC = "anthropic/happy.sse"


def prefix():
    return f"/{uuid.uuid4().hex[:12]}"


def sse_text(data, field_path):
    out = []
    for block in data.decode().split("\n\n"):
        for line in block.split("\n"):
            if line.startswith("data: ") and line[6:] != "[DONE]":
                value = json.loads(line[6:])
                for f in field_path:
                    value = value.get(f) if isinstance(value, dict) else None
                    if value is None:
                        break
                if isinstance(value, str):
                    out.append(value)
    return "".join(out)


def openai_client(p, events=None, asynchronous=False, **options):
    if asynchronous:
        transport = recovery_llm.AsyncRecoveringTransport(on_event=events, **options)
        http = openai.DefaultAsyncHttpx2Client(transport=transport)
        return openai.AsyncOpenAI(base_url=f"{provider.URL}{p}/v1", api_key="k", max_retries=0, http_client=http), transport
    transport = recovery_llm.RecoveringTransport(on_event=events, **options)
    http = openai.DefaultHttpx2Client(transport=transport)
    return openai.OpenAI(base_url=f"{provider.URL}{p}/v1", api_key="k", max_retries=0, http_client=http), transport


def chat_text(stream):
    return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


async def achat_text(stream):
    return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])


def cut_chat(after_events):
    full = fixture_bytes(CHAT)
    cut = event_ends(full)[after_events - 1]
    return {"headers": SSE, "body": [{"fixture": CHAT}], "cut_at": cut, "ending": "rst"}


HAPPY_CHAT = {"headers": SSE, "body": [{"fixture": CHAT}]}


# ------------------------------------------------------------ openai chat


def test_chat_reset_before_the_first_token_is_the_whole_answer_once(fault_provider):
    p = prefix()
    path = f"{p}/v1/chat/completions"
    load({path: [cut_chat(1), HAPPY_CHAT]})
    events = []
    client, transport = openai_client(p, events.append)
    assert chat_text(client.chat.completions.create(**CHAT_ARGS)) == "Hello world"
    assert sends(path) == 2
    names = [e["event"] for e in events]
    assert names.count("attempt_started") == 2 and names[-1] == "completed", names
    assert transport.last_report["outcome"]["outcome"] == "completed"


@pytest.mark.anyio
async def test_chat_reset_before_the_first_token_async(fault_provider, anyio_backend):
    p = prefix()
    path = f"{p}/v1/chat/completions"
    load({path: [cut_chat(1), HAPPY_CHAT]})
    client, transport = openai_client(p, asynchronous=True)
    assert await achat_text(await client.chat.completions.create(**CHAT_ARGS)) == "Hello world"
    assert sends(path) == 2
    assert len(transport.last_report["attempts"]) == 2


def test_chat_in_stream_overloaded_error_is_the_whole_answer_once(fault_provider):
    p = prefix()
    path = f"{p}/v1/chat/completions"
    load({path: [{"headers": SSE, "body": [OVERLOADED_CHUNK]}, HAPPY_CHAT]})
    client, _ = openai_client(p)
    assert chat_text(client.chat.completions.create(**CHAT_ARGS)) == "Hello world"
    assert sends(path) == 2


@pytest.mark.anyio
async def test_chat_in_stream_overloaded_error_async(fault_provider, anyio_backend):
    p = prefix()
    path = f"{p}/v1/chat/completions"
    load({path: [{"headers": SSE, "body": [OVERLOADED_CHUNK]}, HAPPY_CHAT]})
    client, _ = openai_client(p, asynchronous=True)
    assert await achat_text(await client.chat.completions.create(**CHAT_ARGS)) == "Hello world"
    assert sends(path) == 2


def no_first_token_then_happy(path):
    """An answer whose head and role event come, then nothing (the
    provider holds the connection open); then a whole answer."""
    full = fixture_bytes(CHAT)
    role = full[: event_ends(full)[0]].decode()
    load({path: [{"headers": SSE, "body": [role], "ending": "stall"}, HAPPY_CHAT]})


def test_chat_no_first_token_in_time_is_cut_at_the_deadline_sync(fault_provider):
    # A blocking read is given the quiet window (20 s here) as its read
    # timeout once per body; the first-token deadline (0.3 s) before it is
    # kept by cutting the connection then, and the request is replayed.
    p = prefix()
    path = f"{p}/v1/chat/completions"
    no_first_token_then_happy(path)
    client, transport = openai_client(p, first_token_timeout_ms=300, idle_timeout_ms=20_000)
    started = time.monotonic()
    assert chat_text(client.chat.completions.create(**CHAT_ARGS)) == "Hello world"
    assert time.monotonic() - started < 10, "waited for the quiet window, not the first-token deadline"
    assert sends(path) == 2
    attempts = transport.last_report["attempts"]
    assert len(attempts) == 2, attempts
    assert not cut_timers(), "the deadline's timer thread is gone"


def test_legacy_httpx_no_first_token_in_time_is_cut_at_the_deadline(fault_provider):
    p = prefix()
    path = f"{p}/v1/chat/completions"
    no_first_token_then_happy(path)
    transport = legacy.RecoveringTransport(first_token_timeout_ms=300, idle_timeout_ms=20_000)
    started = time.monotonic()
    with httpx.Client(transport=transport) as client:
        with client.stream("POST", f"{provider.URL}{path}", json=CHAT_ARGS) as r:
            r.read()
    assert time.monotonic() - started < 10
    assert sends(path) == 2
    assert r.extensions["recovery_report"]["outcome"]["outcome"] == "completed"


def check_interrupted(error, seen):
    cause = error.__cause__
    assert isinstance(cause, recovery_llm.RecoveryError), repr(cause)
    assert cause.committed
    assert cause.outcome["outcome"] == "interrupted", cause.outcome
    assert cause.report["committed_attempt"] is not None
    assert seen == "Hello"


def test_chat_reset_after_the_first_token_raises_the_sdks_connection_error(fault_provider):
    p = prefix()
    path = f"{p}/v1/chat/completions"
    load({path: [cut_chat(2), HAPPY_CHAT]})
    client, _ = openai_client(p)
    seen = []
    with pytest.raises(openai.APIConnectionError) as raised:
        for c in client.chat.completions.create(**CHAT_ARGS):
            if c.choices and c.choices[0].delta.content:
                seen.append(c.choices[0].delta.content)
    check_interrupted(raised.value, "".join(seen))
    assert sends(path) == 1, "never replayed after a token was out"


@pytest.mark.anyio
async def test_chat_reset_after_the_first_token_async(fault_provider, anyio_backend):
    p = prefix()
    path = f"{p}/v1/chat/completions"
    load({path: [cut_chat(2), HAPPY_CHAT]})
    client, _ = openai_client(p, asynchronous=True)
    seen = []
    with pytest.raises(openai.APIConnectionError) as raised:
        async for c in await client.chat.completions.create(**CHAT_ARGS):
            if c.choices and c.choices[0].delta.content:
                seen.append(c.choices[0].delta.content)
    check_interrupted(raised.value, "".join(seen))
    assert sends(path) == 1


# ------------------------------------------------------- openai responses

RESPONSE_EVENTS = [
    ("response.created", {"response": {"id": "resp_1", "object": "response", "status": "in_progress", "output": []}}),
    ("response.in_progress", {"response": {"id": "resp_1", "object": "response", "status": "in_progress", "output": []}}),
    ("response.output_item.added", {"output_index": 0, "item": {"id": "msg_1", "type": "message", "status": "in_progress", "role": "assistant", "content": []}}),
    ("response.content_part.added", {"item_id": "msg_1", "output_index": 0, "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}}),
    ("response.output_text.delta", {"item_id": "msg_1", "output_index": 0, "content_index": 0, "delta": "Resumed"}),
    ("response.output_text.delta", {"item_id": "msg_1", "output_index": 0, "content_index": 0, "delta": " streams"}),
    ("response.output_text.delta", {"item_id": "msg_1", "output_index": 0, "content_index": 0, "delta": " stay"}),
    ("response.output_text.delta", {"item_id": "msg_1", "output_index": 0, "content_index": 0, "delta": " whole."}),
    ("response.output_text.done", {"item_id": "msg_1", "output_index": 0, "content_index": 0, "text": "Resumed streams stay whole."}),
    ("response.completed", {"response": {"id": "resp_1", "object": "response", "status": "completed", "output": [], "usage": {"input_tokens": 3, "output_tokens": 4, "total_tokens": 7, "output_tokens_details": {"reasoning_tokens": 0}}}}),
]


def response_stream(first=0, last=len(RESPONSE_EVENTS) - 1):
    out = []
    for seq in range(first, last + 1):
        kind, fields = RESPONSE_EVENTS[seq]
        data = {"type": kind, "sequence_number": seq, **fields}
        out.append(f"event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n")
    return "".join(out)


RESPONSES_ARGS = {"model": "m", "input": "say something", "stream": True, "background": True}


def load_responses_cut(p):
    post = f"{p}/v1/responses"
    get = f"{p}/v1/responses/resp_1"
    head = response_stream(0, 4)
    load({
        post: [{"headers": SSE, "body": [head, response_stream(5)], "cut_at": len(head.encode()), "ending": "rst"}],
        get: [{"headers": SSE, "body": [response_stream(5)]}],
    })
    return post, get


def test_responses_background_stream_cut_is_resumed_with_the_same_text(fault_provider):
    p = prefix()
    post, get = load_responses_cut(p)
    client, transport = openai_client(p)
    text = "".join(e.delta for e in client.responses.create(**RESPONSES_ARGS) if e.type == "response.output_text.delta")
    assert text == "Resumed streams stay whole."
    assert (sends(post), sends(get)) == (1, 1)
    assert transport.last_report["seams"], transport.last_report


@pytest.mark.anyio
async def test_responses_background_stream_cut_is_resumed_async(fault_provider, anyio_backend):
    p = prefix()
    post, get = load_responses_cut(p)
    client, _ = openai_client(p, asynchronous=True)
    stream = await client.responses.create(**RESPONSES_ARGS)
    text = "".join([e.delta async for e in stream if e.type == "response.output_text.delta"])
    assert text == "Resumed streams stay whole."
    assert (sends(post), sends(get)) == (1, 1)


# An image generation: its partial image and the completed response carry
# the image as base64, one event each, of several MiB (3 MB here).
IMAGE_B64 = "iVBO" * (3 << 18)
IMAGE_EVENTS = [
    ("response.created", {"response": {"id": "resp_2", "object": "response", "status": "in_progress", "output": []}}),
    ("response.output_item.added", {"output_index": 0, "item": {"id": "ig_1", "type": "image_generation_call", "status": "in_progress"}}),
    ("response.image_generation_call.partial_image", {"output_index": 0, "item_id": "ig_1", "partial_image_index": 0, "partial_image_b64": IMAGE_B64}),
    ("response.completed", {"response": {"id": "resp_2", "object": "response", "status": "completed", "output": [{"id": "ig_1", "type": "image_generation_call", "status": "completed", "result": IMAGE_B64}]}}),
]
IMAGE_ARGS = {"model": "m", "input": "Draw a cat", "stream": True, "tools": [{"type": "image_generation", "partial_images": 1}]}


def load_image(p):
    body = "".join(
        f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': seq, **fields}, separators=(',', ':'))}\n\n"
        for seq, (kind, fields) in enumerate(IMAGE_EVENTS)
    )
    post = f"{p}/v1/responses"
    load({post: [{"headers": SSE, "body": [body]}]})
    return post


def image_of(events):
    partial = [e.partial_image_b64 for e in events if e.type == "response.image_generation_call.partial_image"]
    done = [e.response.output[0].result for e in events if e.type == "response.completed"]
    return partial, done


def test_an_image_generation_of_several_mib_is_read_as_the_sdk_reads_it(fault_provider):
    p = prefix()
    post = load_image(p)
    client, transport = openai_client(p)
    events = list(client.responses.create(**IMAGE_ARGS))
    assert image_of(events) == ([IMAGE_B64], [IMAGE_B64])
    assert transport.last_report["outcome"]["outcome"] == "completed"
    assert sends(post) == 1


@pytest.mark.anyio
async def test_an_image_generation_of_several_mib_async(fault_provider, anyio_backend):
    p = prefix()
    post = load_image(p)
    client, _ = openai_client(p, asynchronous=True)
    stream = await client.responses.create(**IMAGE_ARGS)
    assert image_of([e async for e in stream]) == ([IMAGE_B64], [IMAGE_B64])
    assert sends(post) == 1


# -------------------------------------------------------------- anthropic


def anthropic_client(p, asynchronous=False):
    if asynchronous:
        transport = recovery_llm.AsyncRecoveringTransport()
        http = anthropic.DefaultAsyncHttpxClient(transport=transport)
        return anthropic.AsyncAnthropic(base_url=f"{provider.URL}{p}", api_key="k", max_retries=0, http_client=http)
    transport = recovery_llm.RecoveringTransport()
    http = anthropic.DefaultHttpxClient(transport=transport)
    return anthropic.Anthropic(base_url=f"{provider.URL}{p}", api_key="k", max_retries=0, http_client=http)


ANTHROPIC_TEXT = sse_text(fixture_bytes(ANTHROPIC), ["delta", "text"])
OVERLOADED_529 = {
    "status": 529,
    "headers": {"content-type": "application/json"},
    "body": ['{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}'],
}
MESSAGE = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}


def test_anthropic_overloaded_before_the_first_token_is_the_whole_answer_once(fault_provider):
    p = prefix()
    path = f"{p}/v1/messages"
    load({path: [OVERLOADED_529, {"headers": SSE, "body": [{"fixture": ANTHROPIC}]}]})
    with anthropic_client(p).messages.stream(**MESSAGE) as stream:
        assert "".join(stream.text_stream) == ANTHROPIC_TEXT
    assert sends(path) == 2


@pytest.mark.anyio
async def test_anthropic_overloaded_before_the_first_token_async(fault_provider, anyio_backend):
    p = prefix()
    path = f"{p}/v1/messages"
    load({path: [OVERLOADED_529, {"headers": SSE, "body": [{"fixture": ANTHROPIC}]}]})
    async with anthropic_client(p, asynchronous=True).messages.stream(**MESSAGE) as stream:
        assert "".join([t async for t in stream.text_stream]) == ANTHROPIC_TEXT
    assert sends(path) == 2


def recovery_error(e):
    """The RecoveryError an SDK raised, or raised from."""
    if isinstance(e, recovery_llm.RecoveryError):
        return e
    assert isinstance(e.__cause__, recovery_llm.RecoveryError), repr(e.__cause__)
    return e.__cause__


def anthropic_cut():
    full = fixture_bytes(ANTHROPIC)
    first_text = full.find(b"text_delta")
    cut = next(e for e in event_ends(full) if e > first_text)
    return {"headers": SSE, "body": [{"fixture": ANTHROPIC}], "cut_at": cut, "ending": "rst"}, full[:cut]


def test_anthropic_stream_cut_after_text_is_a_typed_error(fault_provider):
    p = prefix()
    path = f"{p}/v1/messages"
    cut, before = anthropic_cut()
    load({path: [cut, {"headers": SSE, "body": [{"fixture": ANTHROPIC}]}]})
    seen = []
    # MessageStream lets the transport's error through as it is (a
    # ReadError); the raw stream maps it to APIConnectionError.
    with pytest.raises((anthropic.APIConnectionError, recovery_llm.RecoveryError)) as raised:
        with anthropic_client(p).messages.stream(**MESSAGE) as stream:
            for t in stream.text_stream:
                seen.append(t)
    error = recovery_error(raised.value)
    assert error.outcome["outcome"] == "interrupted" and error.committed
    # The text so far is out; the end was never proven: an error, not an
    # answer that merely stopped.
    assert "".join(seen) == sse_text(before, ["delta", "text"])
    assert sends(path) == 1


@pytest.mark.anyio
async def test_anthropic_stream_cut_after_text_async(fault_provider, anyio_backend):
    p = prefix()
    path = f"{p}/v1/messages"
    cut, _ = anthropic_cut()
    load({path: [cut, {"headers": SSE, "body": [{"fixture": ANTHROPIC}]}]})
    with pytest.raises((anthropic.APIConnectionError, recovery_llm.RecoveryError)) as raised:
        async with anthropic_client(p, asynchronous=True).messages.stream(**MESSAGE) as stream:
            async for _ in stream.text_stream:
                pass
    assert recovery_error(raised.value).outcome["outcome"] == "interrupted"
    assert sends(path) == 1


# ------------------------------------------------------------ legacy httpx


def test_legacy_httpx_reset_before_the_first_token_is_the_whole_answer(fault_provider):
    p = prefix()
    path = f"{p}/v1/chat/completions"
    load({path: [cut_chat(1), HAPPY_CHAT]})
    transport = legacy.RecoveringTransport()
    with httpx.Client(transport=transport) as client:
        with client.stream("POST", f"{provider.URL}{path}", json=CHAT_ARGS) as r:
            body = r.read()
    text = "".join(
        json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
        for line in body.decode().split("\n")
        if line.startswith("data: {") and json.loads(line[6:]).get("choices")
    )
    assert text == "Hello world"
    assert sends(path) == 2
    assert r.extensions["recovery_report"]["outcome"]["outcome"] == "completed"
    assert isinstance(legacy.RecoveryError("x"), httpx.ReadError)


# ------------------------------------------------- what is not a generation

MODELS_JSON = '{"object":"list","data":[{"id":"gpt-5","object":"model","created":0,"owned_by":"system"}]}'
EMBEDDING_JSON = (
    '{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.25,-0.5]}],'
    '"model":"text-embedding-3-small","usage":{"prompt_tokens":2,"total_tokens":2}}'
)
SPEECH = "ID3 not a stream of events"


def load_api(p):
    json_head = {"content-type": "application/json"}
    load(
        {
            f"{p}/v1/models": [{"headers": json_head, "body": [MODELS_JSON]}],
            f"{p}/v1/embeddings": [{"headers": json_head, "body": [EMBEDDING_JSON]}],
            f"{p}/v1/audio/speech": [{"headers": {"content-type": "audio/mpeg"}, "body": [SPEECH]}],
        }
    )


def test_a_model_list_an_embedding_and_speech_pass_through_the_transport(fault_provider):
    p = prefix()
    load_api(p)
    client, transport = openai_client(p)
    assert [m.id for m in client.models.list().data] == ["gpt-5"]
    assert client.embeddings.create(model="text-embedding-3-small", input="hi").data[0].embedding == [0.25, -0.5]
    assert client.audio.speech.create(model="tts-1", voice="alloy", input="hi").content == SPEECH.encode()
    assert transport.last_report["outcome"]["outcome"] == "completed"
    for path in ("/v1/models", "/v1/embeddings", "/v1/audio/speech"):
        assert sends(f"{p}{path}") == 1, path


@pytest.mark.anyio
async def test_a_model_list_an_embedding_and_speech_pass_through_async(fault_provider, anyio_backend):
    p = prefix()
    load_api(p)
    client, _ = openai_client(p, asynchronous=True)
    assert [m.id async for m in client.models.list()] == ["gpt-5"]
    embedding = await client.embeddings.create(model="text-embedding-3-small", input="hi")
    assert embedding.data[0].embedding == [0.25, -0.5]
    speech = await client.audio.speech.create(model="tts-1", voice="alloy", input="hi")
    assert speech.content == SPEECH.encode()
