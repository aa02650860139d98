"""The official OpenAI Python SDK pointed at the recovery gateway, the
loopback fault provider behind it.

Each test loads its own scripts into the provider under a path prefix of its
own (``/<name>/v1/...``, merged with ``POST /__fault/script?merge``), points
``OpenAI(base_url=f"{gateway}/<name>/v1", max_retries=0)`` at the gateway, and
reads the provider's counters afterwards. The SDK never retries on its own:
whatever was recovered, the gateway recovered.

Environment: ``RECOVERY_GATEWAY_URL`` and ``FAULT_PROVIDER_URL`` (set by
``scripts/test-gateway-sdks.sh``); the provider's control endpoint is
``provider.py``.
"""

import json
import unittest

import openai
from openai import OpenAI

from provider import GATEWAY, SSE, event_ends, fixture_bytes, load, received, sends

CHAT_FIXTURE = "openai-chat/happy-usage.sse"


def client(prefix):
    return OpenAI(
        base_url=f"{GATEWAY}{prefix}/v1",
        api_key="test",
        max_retries=0,
        timeout=30,
    )


def chat_text(stream):
    """The content the SDK yields from a chat stream."""
    text = []
    for chunk in stream:
        for choice in chunk.choices:
            if choice.delta and choice.delta.content:
                text.append(choice.delta.content)
    return "".join(text)


CHAT_ARGS = {
    "model": "m",
    "messages": [{"role": "user", "content": "say hello"}],
    "stream": True,
}

# A Responses stream with several text deltas, numbered as OpenAI numbers
# them (sequence_number from 0).
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
    ("response.content_part.done", {"item_id": "msg_1", "output_index": 0, "content_index": 0, "part": {"type": "output_text", "text": "Resumed streams stay whole.", "annotations": []}}),
    ("response.output_item.done", {"output_index": 0, "item": {"id": "msg_1", "type": "message", "status": "completed", "role": "assistant", "content": [{"type": "output_text", "text": "Resumed streams stay whole.", "annotations": []}]}}),
    ("response.completed", {"response": {"id": "resp_1", "object": "response", "status": "completed", "output": [], "usage": {"input_tokens": 3, "output_tokens": 4, "total_tokens": 7, "output_tokens_details": {"reasoning_tokens": 0}}}}),
]


def response_event(seq):
    kind, fields = RESPONSE_EVENTS[seq]
    data = {"type": kind, "sequence_number": seq, **fields}
    return f"event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


def response_stream(first=0, last=len(RESPONSE_EVENTS) - 1):
    return "".join(response_event(seq) for seq in range(first, last + 1))


def response_text(stream):
    """The text deltas and the event types the SDK yields."""
    text, kinds = [], []
    for event in stream:
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            text.append(event.delta)
    return "".join(text), kinds


class ChatRecovery(unittest.TestCase):
    def test_a_reset_before_the_first_token_is_replayed_invisibly(self):
        prefix = "/a-reset-before-token"
        path = f"{prefix}/v1/chat/completions"
        full = fixture_bytes(CHAT_FIXTURE)
        # Cut by RST right after the role-only event: a head and a frame,
        # no token yet.
        cut = event_ends(full)[0]
        load({
            path: [
                {"headers": SSE, "body": [{"fixture": CHAT_FIXTURE}], "cut_at": cut, "ending": "rst"},
                {"headers": SSE, "body": [{"fixture": CHAT_FIXTURE}]},
            ]
        })
        text = chat_text(client(prefix).chat.completions.create(**CHAT_ARGS))
        self.assertEqual(text, "Hello world", "the whole answer, once")
        self.assertEqual(sends(path), 2, "the provider saw the first send and one replay")

    def test_a_reset_before_the_head_is_replayed_invisibly(self):
        prefix = "/a-reset-before-head"
        path = f"{prefix}/v1/chat/completions"
        load({
            path: [
                {"ending": "reset_before_head"},
                {"headers": SSE, "body": [{"fixture": CHAT_FIXTURE}]},
            ]
        })
        text = chat_text(client(prefix).chat.completions.create(**CHAT_ARGS))
        self.assertEqual(text, "Hello world")
        self.assertEqual(sends(path), 2)

    def test_b_an_overloaded_error_event_before_output_is_replayed(self):
        prefix = "/b-error-first"
        path = f"{prefix}/v1/chat/completions"
        load({
            path: [
                {"headers": SSE, "body": [{"fixture": "openai-chat/error-first.sse"}]},
                {"headers": SSE, "body": [{"fixture": CHAT_FIXTURE}]},
            ]
        })
        text = chat_text(client(prefix).chat.completions.create(**CHAT_ARGS))
        self.assertEqual(text, "Hello world", "the error event never reached the SDK")
        self.assertEqual(sends(path), 2)

    def test_b_an_anthropic_like_overloaded_chunk_before_output_is_replayed(self):
        prefix = "/b-overloaded"
        path = f"{prefix}/v1/chat/completions"
        overloaded = (
            'data: {"error":{"message":"Overloaded","type":"overloaded_error",'
            '"param":null,"code":"overloaded"}}\n\n'
        )
        load({
            path: [
                {"headers": SSE, "body": [overloaded]},
                {"headers": SSE, "body": [{"fixture": CHAT_FIXTURE}]},
            ]
        })
        text = chat_text(client(prefix).chat.completions.create(**CHAT_ARGS))
        self.assertEqual(text, "Hello world")
        self.assertEqual(sends(path), 2)

    def test_d_a_reset_after_the_first_token_raises_after_the_prefix(self):
        prefix = "/d-reset-after-token"
        path = f"{prefix}/v1/chat/completions"
        full = fixture_bytes(CHAT_FIXTURE)
        # Cut right after the "Hello" event: committed, not resumable.
        cut = event_ends(full)[1]
        load({
            path: [
                {"headers": SSE, "body": [{"fixture": CHAT_FIXTURE}], "cut_at": cut, "ending": "rst"},
                {"headers": SSE, "body": [{"fixture": CHAT_FIXTURE}]},
            ]
        })
        stream = client(prefix).chat.completions.create(**CHAT_ARGS)
        seen = []
        with self.assertRaises(openai.APIError) as raised:
            for chunk in stream:
                for choice in chunk.choices:
                    if choice.delta and choice.delta.content:
                        seen.append(choice.delta.content)
        self.assertEqual("".join(seen), "Hello", "the prefix was yielded before the error")
        self.assertNotIsInstance(
            raised.exception,
            openai.APIConnectionError,
            "a provider-shaped error event, not a dropped connection",
        )
        self.assertIsInstance(raised.exception.body, dict, raised.exception)
        self.assertEqual(sends(path), 1, "never replayed after a token was out")


class ResponsesResume(unittest.TestCase):
    ARGS = {"model": "m", "input": "say something", "stream": True, "background": True}

    def test_c_a_background_stream_cut_after_the_first_token_is_resumed(self):
        whole_prefix = "/c-whole"
        whole_path = f"{whole_prefix}/v1/responses"
        prefix = "/c-cut"
        post = f"{prefix}/v1/responses"
        get = f"{prefix}/v1/responses/resp_1"
        # The first delta is sequence_number 4: cut right after it.
        head = response_stream(0, 4)
        load({
            whole_path: [{"headers": SSE, "body": [response_stream()]}],
            post: [{"headers": SSE, "body": [head, response_stream(5)], "cut_at": len(head.encode()), "ending": "rst"}],
            # What OpenAI sends on `GET ...?stream=true&starting_after=4`.
            get: [{"headers": SSE, "body": [response_stream(5)]}],
        })

        whole_text, whole_kinds = response_text(client(whole_prefix).responses.create(**self.ARGS))
        self.assertEqual(whole_text, "Resumed streams stay whole.")

        text, kinds = response_text(client(prefix).responses.create(**self.ARGS))
        self.assertEqual(text, whole_text, "the resumed text equals the uninterrupted one")
        self.assertEqual(kinds, whole_kinds, "the same events, none twice, none missing")

        self.assertEqual(sends(post), 1, "the POST was never replayed")
        self.assertEqual(sends(get), 1, "one resume")
        posts = received(post)
        gets = received(get)
        self.assertEqual([r["method"] for r in posts + gets], ["POST", "GET"])
        target = gets[0]["target"]
        self.assertIn("stream=true", target)
        self.assertIn("starting_after=4", target)


if __name__ == "__main__":
    unittest.main(verbosity=2)


class NotAGeneration(unittest.TestCase):
    """What the SDK asks besides generations passes through the gateway
    as the provider answered it."""

    def test_a_model_list_an_embedding_and_speech(self):
        prefix = "/not-a-generation"
        json_head = {"content-type": "application/json"}
        models = '{"object":"list","data":[{"id":"gpt-5","object":"model","created":0,"owned_by":"system"}]}'
        embedding = (
            '{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.25,-0.5]}],'
            '"model":"e","usage":{"prompt_tokens":2,"total_tokens":2}}'
        )
        speech = "ID3 not a stream of events"
        load(
            {
                f"{prefix}/v1/models": [{"headers": json_head, "body": [models]}],
                f"{prefix}/v1/embeddings": [{"headers": json_head, "body": [embedding]}],
                f"{prefix}/v1/audio/speech": [{"headers": {"content-type": "audio/mpeg"}, "body": [speech]}],
            }
        )
        c = client(prefix)
        self.assertEqual([m.id for m in c.models.list().data], ["gpt-5"])
        self.assertEqual(
            c.embeddings.create(model="e", input="hi", encoding_format="float").data[0].embedding,
            [0.25, -0.5],
        )
        self.assertEqual(
            c.audio.speech.create(model="tts-1", voice="alloy", input="hi").content, speech.encode()
        )
        for path in ("/v1/models", "/v1/embeddings", "/v1/audio/speech"):
            self.assertEqual(sends(f"{prefix}{path}"), 1, path)


class Uploads(unittest.TestCase):
    """A file above the gateway's body cap (8 MiB in this suite's config)
    uploads through it: an upload streams upstream, never held."""

    def test_a_nine_mib_file_uploads_through_the_gateway(self):
        prefix = "/uploads"
        file_object = (
            '{"id":"file-abc","object":"file","bytes":9437184,"created_at":0,'
            '"filename":"data.jsonl","purpose":"batch","status":"processed"}'
        )
        load({f"{prefix}/v1/files": [{"headers": {"content-type": "application/json"}, "body": [file_object]}]})
        data = b"x" * (9 << 20)
        uploaded = client(prefix).files.create(file=("data.jsonl", data), purpose="batch")
        self.assertEqual(uploaded.id, "file-abc")
        got = received(f"{prefix}/v1/files")
        self.assertEqual(len(got), 1)
        headers = {name.lower(): value for name, value in got[0]["headers"]}
        self.assertTrue(headers["content-type"].startswith("multipart/form-data"), headers)
        self.assertGreaterEqual(got[0]["body"].count("x"), 9 << 20)
