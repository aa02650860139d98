"""Overhead of recovery_llm's transports (scripts/bench-python.sh).

1. Per-chunk cost added to the plain transport: 10,000 one-event chunks
   from an in-memory inner transport, read through the inner transport
   alone and through the recovering one (sync, and async on asyncio).
2. Wall ratio over loopback HTTP: the same stream from the fault provider
   through httpx2's HTTPTransport alone and under RecoveringTransport, in
   alternating rounds (41, or RECOVERY_BENCH_ROUNDS): the ratio of the
   fastest rounds, and of the medians.
3. Memory per in-flight stream: RSS added by N committed streams held
   open mid-answer (async, in-memory inner transport).
4. Added per request: a short answer (three one-event chunks) from an
   in-memory inner transport through an httpx2 client, 1,000 requests,
   sync, plain and recovering (the shell's set-up, sends and end).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time
import urllib.request

import httpx2

from recovery_llm import AsyncRecoveringTransport, RecoveringTransport

N = 10_000
ROLE = b'data: {"choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n'
DELTA = b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'
STOP = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
URL = "http://bench.invalid/v1/chat/completions"
# Rounds of the loopback comparison, each transport once per round.
ROUNDS = int(os.environ.get("RECOVERY_BENCH_ROUNDS", "41"))
BODY = b'{"model":"m","stream":true,"messages":[]}'


class Chunks(httpx2.SyncByteStream):
    def __iter__(self):
        yield ROLE
        for _ in range(N):
            yield DELTA
        yield STOP


class AChunks(httpx2.AsyncByteStream):
    async def __aiter__(self):
        yield ROLE
        for _ in range(N):
            yield DELTA
        yield STOP


class Inner(httpx2.BaseTransport):
    def handle_request(self, request):
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, stream=Chunks())


class AInner(httpx2.AsyncBaseTransport):
    async def handle_async_request(self, request):
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, stream=AChunks())


def read_sync(transport):
    t = time.perf_counter()
    r = transport.handle_request(httpx2.Request("POST", URL, content=BODY))
    n = sum(1 for _ in r.stream)
    r.stream.close()
    return time.perf_counter() - t, n


async def read_async(transport):
    t = time.perf_counter()
    r = await transport.handle_async_request(httpx2.Request("POST", URL, content=BODY))
    n = 0
    async for _ in r.stream:
        n += 1
    await r.stream.aclose()
    return time.perf_counter() - t, n


def best(f, runs=7):
    return min(f()[0] for _ in range(runs))


def per_chunk():
    plain = best(lambda: read_sync(Inner()))
    rec = best(lambda: read_sync(RecoveringTransport(Inner(), retry_budget=None)))
    aplain = best(lambda: asyncio.run(read_async(AInner())))
    arec = best(lambda: asyncio.run(read_async(AsyncRecoveringTransport(AInner(), retry_budget=None))))
    return {
        "sync_plain_us_per_chunk": plain / N * 1e6,
        "sync_recovering_us_per_chunk": rec / N * 1e6,
        "sync_added_us_per_chunk": (rec - plain) / N * 1e6,
        "async_plain_us_per_chunk": aplain / N * 1e6,
        "async_recovering_us_per_chunk": arec / N * 1e6,
        "async_added_us_per_chunk": (arec - aplain) / N * 1e6,
    }


def loopback(provider):
    path = "/bench/v1/chat/completions"
    body = [ROLE.decode()] + [DELTA.decode()] * N + [STOP.decode()]
    req = urllib.request.Request(
        f"{provider}/__fault/script?merge",
        data=json.dumps({"paths": {path: [{"headers": {"content-type": "text/event-stream"}, "body": body}]}}).encode(),
        method="POST",
        headers={"content-type": "application/json"},
    )
    urllib.request.urlopen(req, timeout=10).read()

    def run(transport):
        with httpx2.Client(transport=transport) as c:
            t = time.perf_counter()
            with c.stream("POST", f"{provider}{path}", content=BODY) as r:
                n = sum(len(b) for b in r.iter_raw())
            return time.perf_counter() - t, n

    # Alternating rounds. On a shared machine a round is only ever slowed
    # by others, never sped up, so the fastest round of each transport is
    # its own cost; the medians show the spread.
    plain, rec = [], []
    for _ in range(ROUNDS):
        plain.append(run(httpx2.HTTPTransport())[0])
        rec.append(run(RecoveringTransport(retry_budget=None))[0])
    p, r = statistics.median(plain), statistics.median(rec)
    return {
        "loopback_plain_ms_min": min(plain) * 1e3,
        "loopback_recovering_ms_min": min(rec) * 1e3,
        "loopback_wall_ratio_min": min(rec) / min(plain),
        "loopback_plain_ms_median": p * 1e3,
        "loopback_recovering_ms_median": r * 1e3,
        "loopback_wall_ratio_median": r / p,
    }


def rss_kib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1024


class Hanging(httpx2.AsyncByteStream):
    async def __aiter__(self):
        yield ROLE
        yield DELTA
        await asyncio.sleep(3600)


class HInner(httpx2.AsyncBaseTransport):
    async def handle_async_request(self, request):
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, stream=Hanging())


async def in_flight(count):
    t = AsyncRecoveringTransport(HInner(), retry_budget=None)
    held = []
    before = rss_kib()
    for _ in range(count):
        r = await t.handle_async_request(httpx2.Request("POST", URL, content=BODY))
        it = r.stream.__aiter__()
        await it.__anext__()
        await it.__anext__()
        held.append((r, it))
    after = rss_kib()
    for r, it in held:
        await it.aclose()
    return (after - before) / count


class Short(httpx2.SyncByteStream):
    def __iter__(self):
        yield ROLE
        yield DELTA
        yield STOP


class ShortInner(httpx2.BaseTransport):
    def handle_request(self, request):
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, stream=Short())


def per_request(n=1000):
    def run(client):
        t = time.perf_counter()
        for _ in range(n):
            with client.stream("POST", URL, content=BODY, headers={"authorization": "Bearer k"}) as r:
                for _ in r.iter_raw():
                    pass
        return (time.perf_counter() - t, None)

    plain = httpx2.Client(transport=ShortInner())
    rec = httpx2.Client(transport=RecoveringTransport(ShortInner(), retry_budget=None))
    run(plain)
    run(rec)
    p = best(lambda: run(plain), runs=5)
    r = best(lambda: run(rec), runs=5)
    return {
        "sync_plain_us_per_request": p / n * 1e6,
        "sync_recovering_us_per_request": r / n * 1e6,
        "sync_added_us_per_request": (r - p) / n * 1e6,
    }


def main():
    out = per_chunk()
    out.update(per_request())
    if len(sys.argv) > 1:
        out.update(loopback(sys.argv[1]))
    asyncio.run(in_flight(100))  # warm up
    out["memory_kib_per_in_flight_stream"] = asyncio.run(in_flight(1000))
    for k, v in out.items():
        print(f"{k}: {v:.3f}")


if __name__ == "__main__":
    main()
