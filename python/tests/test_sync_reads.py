"""The reads of a sync body: while the machine asks for nothing but reads,
the module's ``Reader`` pulls the chunks and gives them to the machine; at
anything else the shell takes over. Each way out of those reads keeps the
behaviour of a read made by the shell: the end, an error of the inner
stream (a reset, a timeout), a chunk that is not bytes, the consumer
closing the body mid-answer, a second attempt after a failure before the
response."""

from __future__ import annotations

import time

import httpx2
import pytest

import recovery_llm

URL = "http://reads.invalid/v1/chat/completions"
BODY = b'{"model":"m","stream":true,"messages":[]}'
ROLE = b'data: {"choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n'
DELTA = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
STOP = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'


class Body(httpx2.SyncByteStream):
    """The chunks, then what ``then`` says: an exception to raise, or the
    end; notes whether it was closed."""

    def __init__(self, chunks: list, then: "BaseException | None") -> None:
        self.chunks = chunks
        self.then = then
        self.closed = False
        self.served = 0

    def __iter__(self):
        for chunk in self.chunks:
            self.served += 1
            yield chunk
        if self.then is not None:
            raise self.then

    def close(self) -> None:
        self.closed = True


class Inner(httpx2.BaseTransport):
    """Answers each send with the next of ``bodies``: (chunks, then)."""

    def __init__(self, *bodies) -> None:
        self.bodies = list(bodies)
        self.streams: list = []

    def handle_request(self, request):
        chunks, then = self.bodies.pop(0)
        stream = Body(chunks, then)
        self.streams.append(stream)
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, stream=stream)


def transport(inner, **options):
    return recovery_llm.RecoveringTransport(inner, retry_budget=None, backoff_base_ms=1, **options)


def send(t):
    return t.handle_request(httpx2.Request("POST", URL, content=BODY))


def test_a_whole_answer_passes_chunk_by_chunk_as_it_came():
    chunks = [ROLE] + [DELTA] * 50 + [STOP]
    inner = Inner((chunks, None))
    t = transport(inner)
    got = list(send(t).stream)
    assert got == chunks
    assert all(a is b for a, b in zip(got[1:-1], chunks[1:-1]))
    assert t.last_report["outcome"]["outcome"] == "completed"


def test_a_reset_after_the_first_token_is_a_typed_error_caused_by_it():
    reset = httpx2.ReadError("connection reset")
    inner = Inner(([ROLE, DELTA, DELTA], reset))
    t = transport(inner, max_attempts=1)
    got = []
    with pytest.raises(recovery_llm.RecoveryError) as caught:
        for chunk in send(t).stream:
            got.append(chunk)
    assert b"".join(got) == ROLE + DELTA + DELTA
    assert caught.value.committed
    assert caught.value.__cause__ is reset
    assert inner.streams[0].closed


def test_a_read_timeout_after_the_first_token_is_a_typed_error_caused_by_it():
    timeout = httpx2.ReadTimeout("timed out")
    inner = Inner(([ROLE, DELTA], timeout))
    # The shell waits for the machine's deadline before it judges a read
    # that timed out: a short idle window keeps that wait short.
    t = transport(inner, max_attempts=1, idle_timeout_ms=50)
    got = []
    with pytest.raises(recovery_llm.RecoveryError) as caught:
        for chunk in send(t).stream:
            got.append(chunk)
    assert b"".join(got) == ROLE + DELTA
    assert caught.value.__cause__ is timeout


def test_a_reset_before_the_first_token_is_replayed_on_a_new_attempt():
    inner = Inner(([ROLE], httpx2.ReadError("reset")), ([ROLE, DELTA, STOP], None))
    t = transport(inner)
    body = b"".join(send(t).stream)
    assert body == ROLE + DELTA + STOP
    assert len(inner.streams) == 2 and inner.streams[0].closed
    assert t.last_report["outcome"]["outcome"] == "completed"


@pytest.mark.parametrize("closing", ["the body", "its iterator"])
def test_leaving_the_body_mid_answer_releases_the_attempt_at_once(closing):
    inner = Inner(([ROLE] + [DELTA] * 20 + [STOP], None))
    t = transport(inner)
    r = send(t)
    it = iter(r.stream)
    for _ in range(5):
        next(it)
    if closing == "the body":
        r.stream.close()
    else:
        it.close()
    assert inner.streams[0].closed
    assert inner.streams[0].served < 22
    assert t.last_report["outcome"]["outcome"] == "cancelled", t.last_report["outcome"]


def test_a_chunk_that_is_not_bytes_is_refused():
    inner = Inner(([ROLE, DELTA, "text", STOP], None))
    t = transport(inner)
    it = iter(send(t).stream)
    with pytest.raises(TypeError):
        while True:
            next(it)


def reader_on(clock):
    client = recovery_llm._machine.Client({}, [], None)
    machine = client.start("POST", URL, BODY, clock(), time.time(), 7)
    return recovery_llm._machine.Reader(machine, iter([]), clock)


def test_the_reader_reads_time_monotonic_as_python_does():
    # The reader reads the shell's default clock from Rust: the same
    # seconds, between two readings taken through Python around it.
    reader = reader_on(time.monotonic)
    for _ in range(3):
        before = time.monotonic()
        now = reader.now()
        after = time.monotonic()
        assert before - 1e-6 <= now <= after + 1e-6, (before, now, after)


def test_the_reader_reads_any_other_clock_through_it():
    ticks = iter([100.0, 250.0, 251.5])
    reader = reader_on(lambda: next(ticks))
    assert reader.now() == 250.0
    assert reader.now() == 251.5
