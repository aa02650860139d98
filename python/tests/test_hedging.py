"""Hedging the first token through the async transports (httpx2 and legacy
httpx, on asyncio and trio), over in-memory inner transports: the loser's
response is closed (``aclose``) before the winner's reaches the caller, the
consumer reads only the winner's answer, a cancellation during the race
closes both responses; the module's inputs of each role; openai's client
over loopback sockets, the loser's connection closed; the sync transports
refuse to hedge with a typed error. The timings are the machine's
(``hedge_after_ms``) against streams that wait on the loop's clock."""

from __future__ import annotations

import uuid

import anyio
import httpx
import httpx2
import pytest

import recovery_llm
import recovery_llm.httpx
import provider
from provider import SSE as SSE_HEADERS
from provider import event_ends, fixture_bytes, load

URL = "http://hedge.invalid/v1/chat/completions"
BODY = b'{"model":"m","stream":true,"messages":[]}'
SSE = {"content-type": "text/event-stream"}
FIRST = b'data: {"choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n'


def text(said: str) -> bytes:
    return b'data: {"choices":[{"index":0,"delta":{"content":"%s"}}]}\n\n' % said.encode()


STOP = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
# Far above any wait of these tests: a stream that has nothing more.
FOREVER_S = 3600

FLAVOURS = {
    "httpx2": (httpx2, recovery_llm),
    "httpx": (httpx, recovery_llm.httpx),
}


def inner_of(http, *scripts):
    """An inner transport answering its n-th send with the n-th script: a
    list of ``(seconds to wait, chunk)``, then a stall when it ends with
    ``None``. Each stream records its ``aclose``."""

    class Stream(http.AsyncByteStream):
        def __init__(self, script: list) -> None:
            self.script = script
            self.closed_at = None
            self.sent_all = False

        async def __aiter__(self):
            for step in self.script:
                if step is None:
                    await anyio.sleep(FOREVER_S)
                    continue
                wait, chunk = step
                if wait:
                    await anyio.sleep(wait)
                yield chunk
            self.sent_all = True

        async def aclose(self) -> None:
            if self.closed_at is None:
                self.closed_at = anyio.current_time()

    class Inner(http.AsyncBaseTransport):
        def __init__(self) -> None:
            self.streams = [Stream(s) for s in scripts]
            self.requests: list = []

        async def handle_async_request(self, request):
            await request.aread()
            self.requests.append(request)
            stream = self.streams[len(self.requests) - 1]
            return http.Response(200, headers=SSE, stream=stream)

    return Inner()


def transport(module, inner, events: list, **options):
    return module.AsyncRecoveringTransport(
        inner,
        retry_budget=None,
        hedge_after_ms=options.pop("hedge_after_ms", 100),
        on_event=lambda e: events.append(e),
        **options,
    )


def names(events: list) -> list:
    return [e["event"] for e in events if e["event"] != "committed"]


@pytest.mark.anyio
@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_the_first_winning_closes_the_hedges_response_before_the_caller_has_its_own(anyio_backend, flavour):
    http, module = FLAVOURS[flavour]
    # The first shows its role at once and its first token at 0.6 s; the
    # hedge, sent at 0.1 s, shows only its role and would answer at an hour.
    inner = inner_of(
        http,
        [(0, FIRST), (0.6, text("first")), (0, STOP)],
        [(0, FIRST), None, (0, text("hedge")), (0, STOP)],
    )
    events: list = []
    t = transport(module, inner, events)
    with anyio.fail_after(10):
        r = await t.handle_async_request(http.Request("POST", URL, content=BODY))
        first, hedge = inner.streams
        # The race is over before the response: the hedge's is closed.
        assert hedge.closed_at is not None, "the released hedge's response was not closed"
        assert first.closed_at is None
        body = b"".join([c async for c in r.stream])
    assert body == FIRST + text("first") + STOP
    assert len(inner.requests) == 2
    assert names(events) == [
        "attempt_started",
        "hedge_started",
        "attempt_started",
        "hedge_cancelled",
        "attempt_succeeded",
        "completed",
    ]
    started = next(e for e in events if e["event"] == "hedge_started")
    assert (started["hedge"], started["after_ms"]) == (2, 100), started
    cancelled = next(e for e in events if e["event"] == "hedge_cancelled")
    assert (cancelled["reason"], cancelled["wire_attempt"]) == ("rival_won", 2), cancelled
    report = t.last_report
    assert [a.get("role") for a in report["attempts"]] == ["first", "hedge"]
    assert report["attempts"][1]["result"] == "hedge_cancelled"
    assert report["attempts"][1]["reason"] == "rival_won"
    assert report["committed_attempt"] == 1
    assert report["outcome"]["outcome"] == "completed"


@pytest.mark.anyio
@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_the_consumer_reads_the_hedges_answer_when_it_wins(anyio_backend, flavour):
    http, module = FLAVOURS[flavour]
    # The first shows its role and stalls; the hedge answers at once, and
    # its answer goes on after the response (read the usual way).
    hedge_answer = [(0, FIRST), (0, text("hedge"))] + [(0.01, text("more"))] * 5 + [(0, STOP)]
    inner = inner_of(http, [(0, FIRST), None], hedge_answer)
    events: list = []
    t = transport(module, inner, events)
    with anyio.fail_after(10):
        r = await t.handle_async_request(http.Request("POST", URL, content=BODY))
        first, hedge = inner.streams
        assert first.closed_at is not None, "the first attempt that lost was not closed"
        assert hedge.closed_at is None
        body = b"".join([c async for c in r.stream])
    assert body == b"".join(c for _, c in hedge_answer)
    assert hedge.sent_all
    assert names(events) == [
        "attempt_started",
        "hedge_started",
        "attempt_started",
        "hedge_cancelled",
        "attempt_succeeded",
        "completed",
    ]
    cancelled = next(e for e in events if e["event"] == "hedge_cancelled")
    assert (cancelled["reason"], cancelled["wire_attempt"]) == ("rival_won", 1), cancelled
    report = t.last_report
    assert [a.get("role") for a in report["attempts"]] == ["first", "hedge"]
    assert report["committed_attempt"] == 2
    assert report["attempts"][0]["result"] == "hedge_cancelled"
    assert report["outcome"]["outcome"] == "completed"
    # Both went to the request's own endpoint (no alternates), with its body.
    assert [str(q.url) for q in inner.requests] == [URL, URL]
    assert [q.content for q in inner.requests] == [BODY, BODY]


@pytest.mark.anyio
async def test_a_hedge_waits_for_a_head_that_is_late_and_goes_to_the_alternate(anyio_backend):
    # The first's head never comes: the hedge starts while it is awaited
    # (the wait for the head is not cut at the hedge's time), goes to the
    # alternate with its URL and body, and wins.
    class Inner(httpx2.AsyncBaseTransport):
        def __init__(self) -> None:
            self.requests: list = []
            self.cancelled_heads = 0

        async def handle_async_request(self, request):
            await request.aread()
            self.requests.append(request)
            if len(self.requests) == 1:
                try:
                    await anyio.sleep(FOREVER_S)
                except anyio.get_cancelled_exc_class():
                    self.cancelled_heads += 1
                    raise
            stream = httpx2.ByteStream(FIRST + text("alt") + STOP)
            return httpx2.Response(200, headers=SSE, stream=stream)

    inner = Inner()
    events: list = []
    t = transport(
        recovery_llm,
        inner,
        events,
        alternates=[{"label": "alt", "url": "/alt/v1/chat/completions", "body": b'{"model":"alt"}'}],
    )
    with anyio.fail_after(10):
        r = await t.handle_async_request(httpx2.Request("POST", URL, content=BODY))
        body = b"".join([c async for c in r.stream])
    assert body == FIRST + text("alt") + STOP
    assert [str(q.url) for q in inner.requests] == [URL, "http://hedge.invalid/alt/v1/chat/completions"]
    assert inner.requests[1].content == b'{"model":"alt"}'
    # The first's send, still awaiting its head when it lost, was stopped.
    assert inner.cancelled_heads == 1
    report = t.last_report
    assert [a.get("role") for a in report["attempts"]] == ["first", "hedge"]
    assert report["served_by"] == "alt"
    assert report["committed_attempt"] == 2


@pytest.mark.anyio
async def test_a_cancellation_during_a_race_closes_both_responses(anyio_backend):
    inner = inner_of(httpx2, [(0, FIRST), None], [(0, FIRST), None])
    events: list = []
    t = transport(recovery_llm, inner, events, hedge_after_ms=50)
    with anyio.move_on_after(0.5) as scope:
        await t.handle_async_request(httpx2.Request("POST", URL, content=BODY))
    assert scope.cancelled_caught
    first, hedge = inner.streams
    assert len(inner.requests) == 2, "the race had not started"
    assert first.closed_at is not None and hedge.closed_at is not None, (first.closed_at, hedge.closed_at)
    report = t.last_report
    assert report["outcome"]["outcome"] == "cancelled", report["outcome"]
    assert [a["result"] for a in report["attempts"]] == ["failed", "failed"]
    assert names(events)[-1] == "cancelled"


@pytest.mark.anyio
async def test_a_hedge_that_fails_leaves_the_first_to_answer(anyio_backend):
    # The hedge's connection resets before any token: it leaves the race
    # (attempt_failed), its response closed, and the first answers alone.
    class Reset(httpx2.AsyncByteStream):
        closed = False

        async def __aiter__(self):
            yield FIRST
            raise httpx2.ReadError("reset")

        async def aclose(self) -> None:
            Reset.closed = True

    inner = inner_of(httpx2, [(0, FIRST), (0.6, text("first")), (0, STOP)], [])
    inner.streams[1] = Reset()
    events: list = []
    t = transport(recovery_llm, inner, events)
    with anyio.fail_after(10):
        r = await t.handle_async_request(httpx2.Request("POST", URL, content=BODY))
        body = b"".join([c async for c in r.stream])
    assert body == FIRST + text("first") + STOP
    assert Reset.closed
    assert names(events) == [
        "attempt_started",
        "hedge_started",
        "attempt_started",
        "attempt_failed",
        "attempt_succeeded",
        "completed",
    ]
    assert t.last_report["committed_attempt"] == 1


@pytest.mark.parametrize("module", [recovery_llm, recovery_llm.httpx], ids=["httpx2", "httpx"])
def test_the_sync_transports_refuse_to_hedge(module):
    with pytest.raises(recovery_llm.UnsupportedOptionError, match="hedge_after_ms") as raised:
        module.RecoveringTransport(hedge_after_ms=800)
    assert isinstance(raised.value, ValueError)
    assert module.UnsupportedOptionError is recovery_llm.UnsupportedOptionError
    # Hedging off (the default, "off" or None) is taken, max_hedges too.
    for off in ({}, {"hedge_after_ms": "off"}, {"hedge_after_ms": None}, {"max_hedges": 2}):
        assert module.RecoveringTransport(**off).policy["hedge_after_ms"] == "off"
    assert module.AsyncRecoveringTransport(hedge_after_ms=800, max_hedges=2).policy["max_hedges"] == 2


def test_the_module_takes_each_attempts_inputs_with_its_role():
    """The machine's I/O of a race as the module gives it: the hedge's
    target and request, the inputs of each role, the release of the loser
    and the hedge promoted; a role it does not know is refused."""
    from recovery_llm import _machine as M

    alt = {"label": "alt", "url": "https://alt.invalid/v1/messages", "model": "alt-model", "protocol": "anthropic"}
    client = M.Client({"hedge_after_ms": 1000, "protocol": "openai-chat"}, [alt], 0.5)
    m = client.start("POST", URL, BODY, 0.0, 1000.0, 7)
    sse = [("content-type", "text/event-stream")]
    assert m.poll(0.0) & 0xFF == M.SEND
    assert m.on_sent(0.0) & 0xFF == M.AWAIT_HEAD
    assert m.on_head_of(M.ROLE_FIRST, 0.0, 200, sse) & 0xFF == M.READ
    assert m.on_chunk_of(M.ROLE_FIRST, 0.0, FIRST) & 0xFF == M.READ
    assert m.deadline() == 1.0
    assert m.on_timeout(1.0) & 0xFF == M.HEDGE
    assert m.hedge_target() == 1
    url, left, body = m.retarget(URL, BODY, ["authorization"], m.hedge_target())
    assert url == "https://alt.invalid/v1/messages"
    assert b'"alt-model"' in body
    # Another origin: the request's own credentials stay behind.
    assert "authorization" in left
    assert m.retarget(URL, BODY, [], 0) is None
    assert (m.protocol(), m.protocol(M.ROLE_HEDGE)) == ("openai-chat", "anthropic")
    assert m.on_sent_of(M.ROLE_HEDGE, 1.0) & 0xFF == M.RACE
    assert m.on_head_of(M.ROLE_HEDGE, 1.1, 200, sse) & 0xFF == M.RACE
    anthropic_text = (
        b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,"
        b"\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n"
    )
    assert m.on_chunk_of(M.ROLE_HEDGE, 1.2, anthropic_text) & 0xFF == M.RELEASE
    assert m.poll(1.2) & 0xFF == M.PROMOTE
    assert m.poll(1.2) & 0xFF == M.RESPOND
    assert m.protocol() == "anthropic"
    report = m.report()
    assert [a.get("role") for a in report["attempts"]] == ["first", "hedge"]
    assert report["served_by"] == "alt"
    with pytest.raises(ValueError, match="unknown role"):
        m.on_end_of(2, 1.3)


@pytest.mark.anyio
async def test_over_loopback_the_losers_connection_is_closed(fault_provider, anyio_backend):
    """openai's async client over real sockets (httpx2's own transport
    inside): both attempts show their role and wait at the provider's stall
    gate; the first released (stall points pass in arrival order: the first
    attempt's) wins, and the transport closes the hedge's connection (the
    provider sees it hang up) while the answer is read whole."""
    import openai

    p = f"/hedge-{uuid.uuid4().hex[:12]}"
    path = f"{p}/v1/chat/completions"
    chat = "openai-chat/happy-usage.sse"
    role_end = event_ends(fixture_bytes(chat))[0]
    gated = {
        "headers": SSE_HEADERS,
        "body": [{"fixture": chat, "end": role_end}, {"fixture": chat, "start": role_end, "stall": True}],
    }
    load({path: [gated, gated]})
    before = provider.control("GET", "count")
    events: list = []
    transport = recovery_llm.AsyncRecoveringTransport(on_event=events.append, hedge_after_ms=200)
    http = openai.DefaultAsyncHttpx2Client(transport=transport)
    client = openai.AsyncOpenAI(base_url=f"{provider.URL}{p}/v1", api_key="k", max_retries=0, http_client=http)
    answer: list = []

    async def ask() -> None:
        args = {"model": "m", "messages": [{"role": "user", "content": "say hello"}], "stream": True}
        stream = await client.chat.completions.create(**args)
        answer.append("".join([c.choices[0].delta.content or "" async for c in stream if c.choices]))

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(ask)
            # Both stall points entered: the race is on.
            await anyio.to_thread.run_sync(provider.control, "GET", f"wait?stalls={before['stalls_entered'] + 2}")
            provider.control("POST", "release?n=1")
        assert answer == ["Hello world"]
        mine = [r for r in provider.control("GET", "requests") if r["target"] == path]
        assert len(mine) == 2
        while mine[1]["closed_at_ms"] is None:
            await anyio.sleep(0.02)
            mine = [r for r in provider.control("GET", "requests") if r["target"] == path]
    assert mine[0]["connection"] != mine[1]["connection"]
    assert names(events) == [
        "attempt_started",
        "hedge_started",
        "attempt_started",
        "hedge_cancelled",
        "attempt_succeeded",
        "completed",
    ]
    report = transport.last_report
    assert [a.get("role") for a in report["attempts"]] == ["first", "hedge"]
    assert report["committed_attempt"] == 1
    await http.aclose()
