"""The gateway's rescues after the first token, through the official OpenAI
Python SDK: a second gateway whose ``[[alternates]]`` entry declares
``continuation = "prefill"`` (under the baseline policy: three sends, 30 s
head timeout, a 10 s idle timeout), the loopback fault provider behind it.

The primary (the default upstream) declares no prefill of its own, so a
committed answer cut after text only is continued by the alternate from a
prefill of that text; the SDK must read one answer, never a duplicate and
never a silent short one.

Environment: ``RECOVERY_RESCUE_GATEWAY_URL``, its alternate's path
``RECOVERY_RESCUE_ALT_PATH`` and ``FAULT_PROVIDER_URL`` (set by
``scripts/test-gateway-sdks.sh``).
"""

import json
import os
import time
import unittest

import openai
from openai import OpenAI

from provider import SSE, chunk, load, received, sends

GATEWAY = os.environ["RECOVERY_RESCUE_GATEWAY_URL"].rstrip("/")
ALT = os.environ["RECOVERY_RESCUE_ALT_PATH"]

ARGS = {
    "model": "m",
    "messages": [{"role": "user", "content": "count to sixty"}],
    "stream": True,
}


def tokens(first, last):
    return [f" w{i}" for i in range(first, last + 1)]


def stream(cid, first, last, end):
    """A Chat stream: the role chunk, tokens `first..=last`, and when `end`
    its finish reason and `[DONE]`."""
    out = chunk(cid, {"role": "assistant", "content": ""})
    out += "".join(chunk(cid, {"content": t}) for t in tokens(first, last))
    if end:
        out += chunk(cid, {}, "stop") + "data: [DONE]\n\n"
    return out


def client(prefix):
    return OpenAI(base_url=f"{GATEWAY}{prefix}/v1", api_key="test", max_retries=0, timeout=60)


def read(stream_):
    """The content the SDK yields, and the chunk ids it saw."""
    text, ids = [], set()
    for c in stream_:
        ids.add(c.id)
        for choice in c.choices:
            if choice.delta and choice.delta.content:
                text.append(choice.delta.content)
    return "".join(text), ids


class PrefillContinuation(unittest.TestCase):
    def test_a_stream_cut_after_40_of_60_tokens_is_read_whole_once(self):
        prefix = "/rescue-cut"
        path = f"{prefix}/v1/chat/completions"
        load({
            path: [{"headers": SSE, "body": [stream("c1", 1, 40, False)], "ending": "rst"}],
            ALT: [{"headers": SSE, "body": [stream("c2", 41, 60, True)]}],
        })
        before = sends(ALT)
        text, ids = read(client(prefix).chat.completions.create(**ARGS))
        self.assertEqual(text, "".join(tokens(1, 60)), "the whole answer, once")
        self.assertEqual(ids, {"c1"}, "the continuation runs on under the first chunk id")
        self.assertEqual(sends(path), 1, "the committed answer is never replayed")
        self.assertEqual(sends(ALT) - before, 1, "one continuation")
        body = json.loads(received(ALT)[-1]["body"])
        self.assertEqual(
            body["messages"][-1],
            {"role": "assistant", "content": "".join(tokens(1, 40)), "prefix": True},
            "the delivered text is the final assistant message",
        )

    def test_a_rejected_prefill_raises_the_original_interruption(self):
        prefix = "/rescue-rejected"
        path = f"{prefix}/v1/chat/completions"
        load({
            path: [{"headers": SSE, "body": [stream("c1", 1, 40, False)], "ending": "rst"}],
            ALT: [{
                "status": 400,
                "headers": {"content-type": "application/json"},
                "body": ['{"error":{"message":"prefix is not supported","type":"invalid_request_error"}}'],
            }],
        })
        seen = []
        with self.assertRaises(openai.APIError) as raised:
            for c in client(prefix).chat.completions.create(**ARGS):
                for choice in c.choices:
                    if choice.delta and choice.delta.content:
                        seen.append(choice.delta.content)
        self.assertEqual("".join(seen), "".join(tokens(1, 40)), "what was delivered, then the error")
        message = str(raised.exception)
        self.assertIn("interrupted after commit (Transport)", message, "the reset that cut it")
        self.assertNotIn("prefix is not supported", message, "never the alternate's 400")
        self.assertNotIsInstance(raised.exception, openai.BadRequestError)

    def test_a_stall_after_20_tokens_is_continued_at_the_idle_timeout(self):
        prefix = "/rescue-stall"
        path = f"{prefix}/v1/chat/completions"
        load({
            path: [{"headers": SSE, "body": [stream("c1", 1, 20, False)], "ending": "stall"}],
            ALT: [{"headers": SSE, "body": [stream("c2", 21, 60, True)]}],
        })
        started = time.monotonic()
        text, ids = read(client(prefix).chat.completions.create(**ARGS))
        took = time.monotonic() - started
        self.assertEqual(text, "".join(tokens(1, 60)), "the whole answer, once")
        self.assertEqual(ids, {"c1"})
        self.assertGreaterEqual(took, 10.0, "continued once the 10 s idle timeout passed")
        self.assertLess(took, 25.0)
        body = json.loads(received(ALT)[-1]["body"])
        self.assertEqual(body["messages"][-1]["content"], "".join(tokens(1, 20)))


if __name__ == "__main__":
    unittest.main()
