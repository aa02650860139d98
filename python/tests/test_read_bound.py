"""The bound of each read of an async body: on asyncio one loop timer per
request that moves only when it fires early, on trio a cancel scope per
read. A body that stalls is judged at the machine's idle timeout, before
the first token (a replay) and after it (a typed error); a cancellation
from outside the transport is never taken for a stall and never swallowed;
the task is left with no cancellation of the transport's own pending."""

from __future__ import annotations

import asyncio
import time

import anyio
import httpx2
import pytest

import recovery_llm

URL = "http://bound.invalid/v1/chat/completions"
BODY = b'{"model":"m","stream":true,"messages":[]}'
ROLE = b'data: {"choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n'
DELTA = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
STOP = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
# Far above any bound the tests set: a stall the transport must cut.
FOREVER_S = 3600


class Body(httpx2.AsyncByteStream):
    def __init__(self, chunks: list, stalls: bool, gaps_s: float = 0.0) -> None:
        self.chunks = chunks
        self.stalls = stalls
        self.gaps_s = gaps_s

    async def __aiter__(self):
        for chunk in self.chunks:
            if self.gaps_s:
                await anyio.sleep(self.gaps_s)
            yield chunk
        if self.stalls:
            await anyio.sleep(FOREVER_S)


class Inner(httpx2.AsyncBaseTransport):
    """Answers each send with the next body: (chunks, then stalls?, gap)."""

    def __init__(self, *bodies) -> None:
        self.bodies = list(bodies)
        self.sends = 0

    async def handle_async_request(self, request):
        self.sends += 1
        chunks, stalls, *gap = self.bodies.pop(0)
        stream = Body(chunks, stalls, gap[0] if gap else 0.0)
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, stream=stream)


def transport(inner, **options):
    options.setdefault("idle_timeout_ms", 150)
    return recovery_llm.AsyncRecoveringTransport(inner, retry_budget=None, backoff_base_ms=1, **options)


async def read_all(t) -> bytes:
    r = await t.handle_async_request(httpx2.Request("POST", URL, content=BODY))
    out = b""
    async for chunk in r.stream:
        out += chunk
    return out


def no_cancellation_left(backend: str) -> None:
    if backend == "asyncio":
        assert asyncio.current_task().cancelling() == 0


@pytest.mark.anyio
async def test_a_stall_before_the_first_token_is_replayed(anyio_backend):
    inner = Inner(([ROLE], True), ([ROLE, DELTA, STOP], False))
    with anyio.fail_after(10):
        body = await read_all(transport(inner))
    assert inner.sends == 2
    assert body == ROLE + DELTA + STOP
    no_cancellation_left(anyio_backend)


@pytest.mark.anyio
async def test_a_stall_after_the_first_token_is_a_typed_error(anyio_backend):
    inner = Inner(([ROLE, DELTA], True))
    t = transport(inner)
    started = anyio.current_time()
    with anyio.fail_after(10):
        with pytest.raises(recovery_llm.RecoveryError) as raised:
            await read_all(t)
    assert anyio.current_time() - started >= 0.15
    assert inner.sends == 1
    assert raised.value.committed
    assert raised.value.outcome["outcome"] == "interrupted", raised.value.outcome
    assert "idle" in str(raised.value.outcome), raised.value.outcome
    no_cancellation_left(anyio_backend)


@pytest.mark.anyio
async def test_chunks_that_keep_coming_are_never_cut(anyio_backend):
    # Each gap is below the idle timeout, the whole body well above it: the
    # bound moves with every chunk (on asyncio the timer fires early and is
    # moved, never cutting a read that is within its bound).
    chunks = [ROLE] + [DELTA] * 12 + [STOP]
    inner = Inner((chunks, False, 0.05))
    with anyio.fail_after(10):
        body = await read_all(transport(inner, idle_timeout_ms=200))
    assert inner.sends == 1
    assert body == b"".join(chunks)
    no_cancellation_left(anyio_backend)


@pytest.mark.anyio
async def test_a_cancellation_from_outside_is_not_a_stall(anyio_backend):
    inner = Inner(([ROLE, DELTA], True))
    t = transport(inner, idle_timeout_ms=60_000)
    with anyio.move_on_after(0.2) as scope:
        await read_all(t)
    assert scope.cancelled_caught, "the outside cancellation reached the caller"
    assert inner.sends == 1
    assert t.last_report["outcome"]["outcome"] == "cancelled", t.last_report
    no_cancellation_left(anyio_backend)


@pytest.mark.anyio
async def test_an_outside_cancellation_at_the_bound_is_kept(anyio_backend):
    # The caller's own deadline and the transport's bound fall together:
    # whichever fires first, the caller's cancellation is the one it sees.
    inner = Inner(([ROLE, DELTA], True))
    t = transport(inner, idle_timeout_ms=100)
    with anyio.move_on_after(0.1) as scope:
        try:
            await read_all(t)
        except recovery_llm.RecoveryError:
            # The bound was judged first: the stall is the failure, and
            # the caller's scope still ends the block.
            await anyio.sleep(FOREVER_S)
    assert scope.cancelled_caught
    no_cancellation_left(anyio_backend)


class SyncBody(httpx2.SyncByteStream):
    def __init__(self, chunks: list, gaps_s: float) -> None:
        self.chunks = chunks
        self.gaps_s = gaps_s

    def __iter__(self):
        for chunk in self.chunks:
            time.sleep(self.gaps_s)
            yield chunk


class SyncInner(httpx2.BaseTransport):
    def __init__(self, chunks: list, gaps_s: float) -> None:
        self.chunks = chunks
        self.gaps_s = gaps_s
        self.sends = 0

    def handle_request(self, request):
        self.sends += 1
        stream = SyncBody(self.chunks, self.gaps_s)
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, stream=stream)


def test_chunks_that_keep_coming_are_never_cut_sync():
    # The machine's deadline falls behind the reads between its checks; the
    # commit's outputs are acted on before the timers are judged again.
    chunks = [ROLE] + [DELTA] * 8 + [STOP]
    inner = SyncInner(chunks, 0.04)
    t = recovery_llm.RecoveringTransport(inner, retry_budget=None, idle_timeout_ms=150)
    r = t.handle_request(httpx2.Request("POST", URL, content=BODY))
    body = b"".join(r.stream)
    assert inner.sends == 1
    assert body == b"".join(chunks)
    assert t.last_report["outcome"]["outcome"] == "completed", t.last_report
