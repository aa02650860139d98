"""Each official Python SDK pointed at the recovery gateway, the loopback
fault provider behind it: openai (Chat and Responses), anthropic,
google-genai, ollama, mistralai, groq.

Every SDK gets the same cases, each on a path prefix of its own:

- a clean stream: the whole answer;
- a reset before the first token (before the head, and after the head
  and the events before the first token): the whole answer, once (two
  sends);
- an overloaded error before the first token (in-stream where the
  protocol has one, else the provider's 503): the whole answer, once;
- a reset after the first token: the SDK raises its own API error type
  with the gateway's message, after the prefix;
- the overloaded error on every attempt: the last attempt is the answer
  as the provider sent it, so the SDK raises the provider's own error
  with its message (never a schema error);
- comment blocks mid-stream: the whole answer, no exception;
- a reconnect with the `x-recovery-stream-id` header (SSE protocols): the
  rest of the stream with the same key (`GET /streams/<id>?after=<events
  received>`, and `Last-Event-ID: <id>:<seq>` where events carry ids), the
  404 of an unknown id with another key or none; and the SDK itself reading
  the header and the first events, then reconnecting after what it got.

The SDKs never retry on their own (``max_retries=0`` or its equivalent):
whatever was recovered, the gateway recovered.
"""

import json
import unittest

import anthropic
import google.genai
import google.genai.errors
import google.genai.types
import groq
import mistralai.client
import mistralai.client.errors
import ollama
import openai

from provider import (
    COMMENTS,
    GATEWAY,
    NDJSON,
    SSE,
    event_ends,
    fixture_bytes,
    gateway_get,
    gateway_post,
    load,
    sends,
)

KEY = "sk-sdk-test-key-0123"
OTHER = "sk-someone-else-9876"


def sse_text(data, field_path):
    """The text an SSE fixture carries: each event's JSON at `field_path`."""
    out = []
    for line in data.decode().splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        value = json.loads(line[len("data: "):])
        for key in field_path:
            if isinstance(value, list):
                value = value[0] if value else None
            elif isinstance(value, dict):
                value = value.get(key)
            if value is None:
                break
        if isinstance(value, str):
            out.append(value)
    return "".join(out)


class SdkCases:
    """The cases; a subclass says how its SDK reads a stream."""

    #: the upstream path under the test's prefix
    PATH = ""
    HEADERS = SSE
    FIXTURE = ""
    #: the event (0-based) after which a reset comes once a token is out
    CUT_AFTER = 1
    #: how many events come before the first token
    HEAD_EVENTS = 1
    #: whether events carry `id: <stream>:<seq>` lines
    IDS = True
    SEP = b"\n\n"
    #: the fault before the first token, as one script
    OVERLOADED = None
    #: the provider's message in it
    OVERLOADED_MESSAGE = "Overloaded"
    #: what the gateway resumes: None, or the header that carries the key
    RECONNECT_AUTH = None

    def expected(self):
        raise NotImplementedError

    def read(self, prefix):
        """The answer's text as the SDK yields it."""
        raise NotImplementedError

    def api_error(self):
        """The SDK's API error type(s)."""
        raise NotImplementedError

    def prefix(self, case):
        return f"/{type(self).__name__.lower()}-{case}"

    def path(self, case):
        return f"{self.prefix(case)}{self.PATH}"

    def happy(self):
        return {"headers": self.HEADERS, "body": [{"fixture": self.FIXTURE}]}

    def test_1_a_clean_stream_is_the_whole_answer(self):
        load({self.path("clean"): [self.happy()]})
        self.assertEqual(self.read(self.prefix("clean")), self.expected())

    def test_2_a_reset_before_the_first_token_is_invisible(self):
        path = self.path("reset-first")
        load({path: [{"ending": "reset_before_head"}, self.happy()]})
        self.assertEqual(self.read(self.prefix("reset-first")), self.expected())
        self.assertEqual(sends(path), 2)

    def test_2b_a_reset_after_the_head_before_the_first_token_is_invisible(self):
        path = self.path("reset-head")
        ends = event_ends(fixture_bytes(self.FIXTURE), self.SEP)
        cut = ends[self.HEAD_EVENTS - 1] if self.HEAD_EVENTS else 0
        load({path: [dict(self.happy(), cut_at=cut, ending="rst"), self.happy()]})
        self.assertEqual(self.read(self.prefix("reset-head")), self.expected())
        self.assertEqual(sends(path), 2)

    def test_3_an_overloaded_error_before_the_first_token_is_invisible(self):
        path = self.path("overloaded")
        load({path: [self.OVERLOADED, self.happy()]})
        self.assertEqual(self.read(self.prefix("overloaded")), self.expected())
        self.assertEqual(sends(path), 2)

    def test_4_a_reset_after_the_first_token_is_the_sdks_api_error(self):
        path = self.path("reset-after")
        cut = event_ends(fixture_bytes(self.FIXTURE), self.SEP)[self.CUT_AFTER]
        load({path: [dict(self.happy(), cut_at=cut, ending="rst"), self.happy()]})
        with self.assertRaises(self.api_error()) as raised:
            self.read(self.prefix("reset-after"))
        self.assertIn("recovery failed", str(raised.exception) + repr(getattr(raised.exception, "body", "")))
        self.assertEqual(sends(path), 1, "never replayed after a token was out")

    def api_error_before_output(self):
        """What the SDK raises for an HTTP error answered before any byte."""
        return self.api_error()

    def test_4b_a_failure_on_every_attempt_before_output_is_the_providers_error(self):
        path = self.path("all-overloaded")
        load({path: [self.OVERLOADED] * 8})
        with self.assertRaises(self.api_error_before_output()) as raised:
            self.read(self.prefix("all-overloaded"))
        self.assertNotIn("validation", str(raised.exception).lower())
        self.assertGreaterEqual(sends(path), 2, "retried before giving up")
        # The last attempt is the answer as the provider sent it (its HTTP
        # error, or its stream through the error event): the SDK raises
        # the provider's own error, with its message.
        self.assertIn(self.OVERLOADED_MESSAGE, str(raised.exception) + repr(getattr(raised.exception, "body", "")))

    def test_5_comment_blocks_mid_stream_are_harmless(self):
        path = self.path("comments")
        data = fixture_bytes(self.FIXTURE)
        at = event_ends(data, self.SEP)[1]
        body = [
            {"fixture": self.FIXTURE, "start": 0, "end": at},
            COMMENTS,
            {"fixture": self.FIXTURE, "start": at, "end": len(data)},
        ]
        load({path: [{"headers": self.HEADERS, "body": body}]})
        self.assertEqual(self.read(self.prefix("comments")), self.expected())

    def test_6_a_reconnect_reads_the_rest_with_the_same_key_only(self):
        if self.RECONNECT_AUTH is None:
            self.skipTest("not resumable: the gateway passes NDJSON through")
        name, value = self.RECONNECT_AUTH
        path = self.path("reconnect")
        load({path: [self.happy()]})
        status, headers, body = gateway_post(path, {name: value}, {"stream": True})
        self.assertEqual(status, 200, body)
        sid = {k.lower(): v for k, v in headers.items()}["x-recovery-stream-id"]
        rest = gateway_get(f"/streams/{sid}?after=2", {name: value})
        self.assertEqual(rest[0], 200)
        events = [e for e in body.split(b"\n\n") if e.strip()]
        later = [e for e in rest[2].split(b"\n\n") if e.strip()]
        self.assertEqual(later, events[2:], "events 3.. without gap or duplicate")
        for other in ({name: other_value(value)}, {}):
            status, _, _ = gateway_get(f"/streams/{sid}?after=2", other)
            self.assertEqual(status, 404, f"{other}: only the stream's own key reads it")
        if not self.IDS:
            return
        ids = [line[4:] for e in events for line in e.split(b"\n") if line.startswith(b"id: ")]
        self.assertEqual(ids, [f"{sid}:{n}".encode() for n in range(1, len(events) + 1)])
        # An SSE client's reconnect: the same request with Last-Event-ID.
        last = {"last-event-id": f"{sid}:2"}
        status, _, again = gateway_post(path, {name: value, **last}, {"stream": True})
        self.assertEqual(status, 200)
        self.assertEqual([e for e in again.split(b"\n\n") if e.strip()], events[2:])
        self.assertEqual(sends(path), 1, "a reconnect sends nothing upstream")
        for other in ({name: other_value(value)}, {}):
            status, _, _ = gateway_post(path, {**other, **last}, {"stream": True})
            self.assertEqual(status, 404, f"{other}: Last-Event-ID with another key")
        self.assertEqual(sends(path), 1)

    def read_first(self, prefix, n):
        """The stream id the SDK saw in the response head, and the text of
        the first `n` events the SDK yielded (then it stops reading)."""
        raise NotImplementedError

    def test_6b_the_sdk_reads_the_stream_id_and_reconnects_after_what_it_got(self):
        if self.RECONNECT_AUTH is None:
            self.skipTest("not resumable: the gateway passes NDJSON through")
        name, value = self.RECONNECT_AUTH
        path = self.path("sdk-reconnect")
        load({path: [self.happy()]})
        sid, text = self.read_first(self.prefix("sdk-reconnect"), 2)
        self.assertTrue(sid, "x-recovery-stream-id in the head the SDK got")
        status, _, rest = gateway_get(f"/streams/{sid}?after=2", {name: value})
        self.assertEqual(status, 200, rest)
        self.assertEqual(text + self.rest_text(rest), self.expected(), "no gap, no duplicate")
        self.assertEqual(sends(path), 1, "the reconnect sent nothing upstream")
        self.assertEqual(gateway_get(f"/streams/{sid}?after=2", {name: other_value(value)})[0], 404)

    def rest_text(self, data):
        raise NotImplementedError


def first_n(iterable, n):
    out = []
    for item in iterable:
        out.append(item)
        if len(out) == n:
            break
    return out


def other_value(value):
    return value.replace(KEY, OTHER)


def status_of(error):
    """The HTTP status an SDK's API error carries."""
    for attr in ("status_code", "code"):
        value = getattr(error, attr, None)
        if isinstance(value, int):
            return value
    return None


class OpenAiChat(SdkCases, unittest.TestCase):
    PATH = "/v1/chat/completions"
    FIXTURE = "openai-chat/happy-usage.sse"
    OVERLOADED = {"headers": SSE, "body": [
        'data: {"error":{"message":"Overloaded","type":"overloaded_error","param":null,"code":"overloaded"}}\n\n'
    ]}
    RECONNECT_AUTH = ("authorization", f"Bearer {KEY}")

    def client(self, prefix):
        return openai.OpenAI(base_url=f"{GATEWAY}{prefix}/v1", api_key=KEY, max_retries=0, timeout=30)

    def expected(self):
        return sse_text(fixture_bytes(self.FIXTURE), ["choices", 0, "delta", "content"])

    def read(self, prefix):
        stream = self.client(prefix).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        return "".join(
            c.choices[0].delta.content or "" for c in stream if c.choices and c.choices[0].delta
        )

    def api_error(self):
        return openai.APIError

    def read_first(self, prefix, n):
        with self.client(prefix).chat.completions.with_streaming_response.create(
            model="m", messages=[{"role": "user", "content": "hi"}], stream=True
        ) as response:
            sid = response.headers.get("x-recovery-stream-id")
            chunks = first_n(response.parse(), n)
        return sid, "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    def rest_text(self, data):
        return sse_text(data, ["choices", 0, "delta", "content"])


class Groq(OpenAiChat):
    PATH = "/openai/v1/chat/completions"

    def client(self, prefix):
        return groq.Groq(base_url=f"{GATEWAY}{prefix}", api_key=KEY, max_retries=0, timeout=30)

    def api_error(self):
        return groq.APIError


class Mistral(OpenAiChat):
    """mistralai reads the OpenAI-shaped stream; its every error is a
    `MistralError`. Mistral says "overloaded" with an HTTP 503, which it
    raises as `SDKError` with the body; after the first token, no
    in-stream shape is a `SDKError` to this SDK (it validates each event as
    a completion chunk), so the error event reaches it as a
    `ResponseValidationError` whose body carries the message."""

    def read(self, prefix):
        client = mistralai.client.Mistral(api_key=KEY, server_url=f"{GATEWAY}{prefix}")
        stream = client.chat.stream(model="m", messages=[{"role": "user", "content": "hi"}])
        out = []
        for event in stream:
            for choice in event.data.choices:
                if choice.delta and isinstance(choice.delta.content, str):
                    out.append(choice.delta.content)
        return "".join(out)

    def api_error(self):
        return mistralai.client.errors.MistralError

    def read_first(self, prefix, n):
        client = mistralai.client.Mistral(api_key=KEY, server_url=f"{GATEWAY}{prefix}")
        with client.chat.stream(model="m", messages=[{"role": "user", "content": "hi"}]) as stream:
            sid = stream.response.headers.get("x-recovery-stream-id")
            events = first_n(stream, n)
        return sid, "".join(
            c.delta.content for e in events for c in e.data.choices if isinstance(c.delta.content, str)
        )

    # Mistral's API answers overload with an HTTP status, not in-stream.
    OVERLOADED = {"status": 503, "headers": {"content-type": "application/json"},
                  "body": ['{"object":"error","message":"Service unavailable","type":"service_unavailable","code":"1000"}']}
    OVERLOADED_MESSAGE = "Service unavailable"

    def api_error_before_output(self):
        # An HTTP error: its API error type, never a schema error.
        return mistralai.client.errors.SDKError


class OpenAiResponses(SdkCases, unittest.TestCase):
    PATH = "/v1/responses"
    FIXTURE = "openai-responses/happy.sse"
    CUT_AFTER = 4
    HEAD_EVENTS = 4
    OVERLOADED = {"headers": SSE, "body": [
        'event: response.created\ndata: {"type":"response.created","sequence_number":0,"response":{"id":"resp_9","object":"response","status":"in_progress","output":[]}}\n\n'
        'event: error\ndata: {"type":"error","sequence_number":1,"code":"server_error","message":"Overloaded","param":null}\n\n'
    ]}
    RECONNECT_AUTH = ("authorization", f"Bearer {KEY}")

    def expected(self):
        out = []
        for line in fixture_bytes(self.FIXTURE).decode().splitlines():
            if line.startswith("data: "):
                event = json.loads(line[6:])
                if event.get("type") == "response.output_text.delta":
                    out.append(event["delta"])
        return "".join(out)

    def read(self, prefix):
        client = openai.OpenAI(base_url=f"{GATEWAY}{prefix}/v1", api_key=KEY, max_retries=0, timeout=30)
        stream = client.responses.create(model="m", input="hi", stream=True)
        return "".join(e.delta for e in stream if e.type == "response.output_text.delta")

    def api_error(self):
        return openai.APIError

    def test_4b_a_failure_on_every_attempt_before_output_is_the_providers_error(self):
        # openai-python raises on an `error` event only when it nests an
        # `error` object, which the provider's event here does not: the
        # SDK yields the provider's event, with its message, then raises
        # on the gateway's final error event.
        path = self.path("all-overloaded")
        load({path: [self.OVERLOADED] * 8})
        client = openai.OpenAI(base_url=f"{GATEWAY}{self.prefix('all-overloaded')}/v1", api_key=KEY, max_retries=0, timeout=30)
        seen = []
        with self.assertRaises(openai.APIError):
            for event in client.responses.create(model="m", input="hi", stream=True):
                seen.append((event.type, getattr(event, "message", None)))
        self.assertIn(("error", self.OVERLOADED_MESSAGE), seen)
        self.assertGreaterEqual(sends(path), 2, "retried before giving up")

    def read_first(self, prefix, n):
        client = openai.OpenAI(base_url=f"{GATEWAY}{prefix}/v1", api_key=KEY, max_retries=0, timeout=30)
        with client.responses.with_streaming_response.create(model="m", input="hi", stream=True) as response:
            sid = response.headers.get("x-recovery-stream-id")
            events = first_n(response.parse(), n)
        return sid, "".join(e.delta for e in events if e.type == "response.output_text.delta")

    def rest_text(self, data):
        out = []
        for line in data.decode().splitlines():
            if line.startswith("data: "):
                event = json.loads(line[6:])
                if event.get("type") == "response.output_text.delta":
                    out.append(event["delta"])
        return "".join(out)


class Anthropic(SdkCases, unittest.TestCase):
    PATH = "/v1/messages"
    FIXTURE = "anthropic/happy.sse"
    CUT_AFTER = 3
    HEAD_EVENTS = 3
    OVERLOADED = {"headers": SSE, "body": [{"fixture": "anthropic/error-first.sse"}]}
    # anthropic 2.x sends its api_key as `Authorization: Bearer` (not
    # `x-api-key`): a reconnect must bring the same header to own the stream.
    RECONNECT_AUTH = ("authorization", f"Bearer {KEY}")

    def expected(self):
        return sse_text(fixture_bytes(self.FIXTURE), ["delta", "text"])

    def read(self, prefix):
        client = anthropic.Anthropic(base_url=f"{GATEWAY}{prefix}", api_key=KEY, max_retries=0, timeout=30)
        stream = client.messages.create(
            model="m", max_tokens=16, messages=[{"role": "user", "content": "hi"}], stream=True
        )
        return "".join(
            e.delta.text for e in stream if e.type == "content_block_delta" and e.delta.type == "text_delta"
        )

    def api_error(self):
        return anthropic.APIError

    def read_first(self, prefix, n):
        client = anthropic.Anthropic(base_url=f"{GATEWAY}{prefix}", api_key=KEY, max_retries=0, timeout=30)
        with client.messages.with_streaming_response.create(
            model="m", max_tokens=16, messages=[{"role": "user", "content": "hi"}], stream=True
        ) as response:
            sid = response.headers.get("x-recovery-stream-id")
            # The SDK yields no `ping`: the first two events of the fixture
            # come before it.
            events = first_n(response.parse(), n)
        return sid, "".join(
            e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta"
        )

    def rest_text(self, data):
        return sse_text(data, ["delta", "text"])


class GoogleGenai(SdkCases, unittest.TestCase):
    PATH = "/v1beta/models/gemini-x:streamGenerateContent"
    FIXTURE = "gemini/lf-happy.sse"
    OVERLOADED = {"headers": SSE, "body": [{"fixture": "gemini/error-chunk.sse"}]}
    OVERLOADED_MESSAGE = "The model is overloaded"
    CUT_AFTER = 0
    HEAD_EVENTS = 0
    RECONNECT_AUTH = ("x-goog-api-key", KEY)
    IDS = False

    def expected(self):
        return sse_text(fixture_bytes(self.FIXTURE), ["candidates", 0, "content", "parts", 0, "text"])

    def stream(self, prefix):
        # The client closes its connections when it is collected: it is
        # kept for as long as the test reads the stream.
        self.client = client = google.genai.Client(
            api_key=KEY,
            http_options=google.genai.types.HttpOptions(
                base_url=f"{GATEWAY}{prefix}",
                api_version="v1beta",
                retry_options=google.genai.types.HttpRetryOptions(attempts=1),
            ),
        )
        return client.models.generate_content_stream(model="gemini-x", contents="hi")

    def read(self, prefix):
        stream = self.stream(prefix)
        return "".join(chunk.text or "" for chunk in stream)

    def api_error(self):
        return google.genai.errors.APIError

    def read_first(self, prefix, n):
        stream = self.stream(prefix)
        chunks = first_n(stream, n)
        stream.close()
        headers = chunks[0].sdk_http_response.headers or {}
        sid = {k.lower(): v for k, v in headers.items()}.get("x-recovery-stream-id")
        return sid, "".join(c.text or "" for c in chunks)

    def rest_text(self, data):
        return sse_text(data, ["candidates", 0, "content", "parts", 0, "text"])

    def test_6_a_reconnect_reads_the_rest_with_the_same_key_only(self):
        # Gemini streams carry no ids: the rest after the events received
        # is the upstream's bytes from there.
        path = self.path("reconnect")
        load({path: [self.happy()]})
        status, headers, body = gateway_post(path, {"x-goog-api-key": KEY}, {"contents": []})
        self.assertEqual(status, 200, body)
        self.assertEqual(body, fixture_bytes(self.FIXTURE), "only data lines, as sent")
        sid = {k.lower(): v for k, v in headers.items()}["x-recovery-stream-id"]
        after = event_ends(body)[1]
        rest = gateway_get(f"/streams/{sid}?after=2", {"x-goog-api-key": KEY})
        self.assertEqual((rest[0], rest[2]), (200, body[after:]))
        for other in ({"x-goog-api-key": OTHER}, {}):
            self.assertEqual(gateway_get(f"/streams/{sid}?after=2", other)[0], 404)


class Ollama(SdkCases, unittest.TestCase):
    PATH = "/api/chat"
    HEADERS = NDJSON
    FIXTURE = "ollama/chat-happy.ndjson"
    SEP = b"\n"
    CUT_AFTER = 0
    HEAD_EVENTS = 0
    IDS = False
    # Ollama says "busy" with a 503. (An in-stream `{"error": "..."}` line is
    # free text that says nothing of waiting: the gateway does not replay it.)
    OVERLOADED = {"status": 503, "headers": {"content-type": "application/json"},
                  "body": ['{"error":"server busy, please try again. maximum pending requests exceeded"}']}
    OVERLOADED_MESSAGE = "server busy"
    # The in-stream error of tests/fixtures/ollama/error-midstream.ndjson,
    # before any output.

    def expected(self):
        lines = fixture_bytes(self.FIXTURE).decode().splitlines()
        return "".join(json.loads(line)["message"]["content"] for line in lines if line.strip())

    def read(self, prefix):
        client = ollama.Client(host=f"{GATEWAY}{prefix}")
        stream = client.chat(model="llama3", messages=[{"role": "user", "content": "hi"}], stream=True)
        return "".join(part["message"]["content"] for part in stream)

    def api_error(self):
        return ollama.ResponseError

    def test_5_comment_blocks_mid_stream_are_harmless(self):
        self.skipTest("NDJSON has no comments")


if __name__ == "__main__":
    unittest.main()
