"""Hedging the first token through the gateway, read by the official
OpenAI Python SDK: a gateway whose ``[policy]`` has ``hedge_after_ms =
1000`` and one ``[[alternates]]`` entry, the loopback fault provider behind
it.

The primary sends its head and role chunk at once and would send its first
token at 8 s; the alternate answers at once. The SDK must read the
alternate's whole answer, once, in under 3 s, and the gateway must close the
primary's connection within 100 ms of the alternate's first token (the
provider notes when it wrote each piece and when each connection ended).

Environment: ``RECOVERY_HEDGE_GATEWAY_URL``, its alternate's path
``RECOVERY_HEDGE_ALT_PATH`` and ``FAULT_PROVIDER_URL`` (set by
``scripts/test-gateway-sdks.sh``).
"""

import os
import time
import unittest

from openai import OpenAI

from provider import SSE, chunk, load, received

GATEWAY = os.environ["RECOVERY_HEDGE_GATEWAY_URL"].rstrip("/")
ALT = os.environ["RECOVERY_HEDGE_ALT_PATH"]


def tokens(cid, words):
    return "".join(chunk(cid, {"content": w}) for w in words)


def end(cid):
    return chunk(cid, {}, "stop") + "data: [DONE]\n\n"


class Hedging(unittest.TestCase):
    def test_a_hedge_to_the_alternate_beats_a_primary_slow_to_its_first_token(self):
        prefix = "/hedge-slow"
        path = f"{prefix}/v1/chat/completions"
        role = lambda cid: chunk(cid, {"role": "assistant", "content": ""})
        load({
            path: [{
                "headers": SSE,
                "body": [role("p"), {"text": tokens("p", [" late"]) + end("p"), "delay_ms": 8000}],
            }],
            ALT: [{
                "headers": SSE,
                "body": [
                    role("a"),
                    {"text": tokens("a", [" one", " two"]), "delay_ms": 100},
                    {"text": end("a"), "delay_ms": 300},
                ],
            }],
        })
        client = OpenAI(base_url=f"{GATEWAY}{prefix}/v1", api_key="test", max_retries=0, timeout=30)
        started = time.monotonic()
        text, ids = [], set()
        for c in client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], stream=True
        ):
            ids.add(c.id)
            for choice in c.choices:
                if choice.delta and choice.delta.content:
                    text.append(choice.delta.content)
        took = time.monotonic() - started
        self.assertEqual("".join(text), " one two", "the alternate's answer, once")
        self.assertEqual(ids, {"a"}, "nothing of the primary")
        self.assertLess(took, 3.0, "answered before the primary's first token")
        primary, = received(path)
        hedge, = received(ALT)[-1:]
        token_at = hedge["pieces_at_ms"][1]
        closed_at = None
        for _ in range(100):
            primary, = received(path)
            closed_at = primary["closed_at_ms"]
            if closed_at is not None:
                break
            time.sleep(0.01)
        self.assertIsNotNone(closed_at, "the primary's connection was closed")
        self.assertLess(closed_at - token_at, 100.0, "closed within 100 ms of the alternate's token")
        self.assertEqual(len(primary["pieces_at_ms"]), 1, "the primary's token was never written")


if __name__ == "__main__":
    unittest.main()
