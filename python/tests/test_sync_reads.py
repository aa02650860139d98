"""The reads of a sync body: while the machine asks for nothing but reads,
the module's ``Reader`` pulls the chunks and gives them to the machine; at
anything else the shell takes over. Each way out of those reads keeps the
behaviour of a read made by the shell: the end, an error of the inner
stream (a reset, a timeout), a chunk that is not bytes, the consumer
closing the body mid-answer, a second attempt after a failure before the
response; and a read the read timeout would let run past the machine's
deadline, whose connection is cut at that deadline."""

from __future__ import annotations

import socket
import time

import httpx2
import pytest

import recovery_llm
from watches import cut_timers

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


class OnSocket(httpx2.SyncByteStream):
    """``chunks``, then a read of ``sock`` (an end of a socket pair) that
    only ends when the socket is shut down; or, with ``then``, that
    exception instead of the read."""

    def __init__(self, sock: socket.socket, chunks: list, then: "BaseException | None" = None) -> None:
        self.sock = sock
        self.chunks = chunks
        self.then = then

    def __iter__(self):
        yield from self.chunks
        if self.then is not None:
            raise self.then
        if not self.sock.recv(16):
            raise httpx2.RemoteProtocolError("peer closed connection without sending complete message body")
        raise AssertionError("nothing is ever sent on the socket")


class SocketInner(httpx2.BaseTransport):
    """The first send answers over one end of a socket pair (as httpcore
    shows its connection: the HTTP version and the network stream in the
    response's extensions), with ``chunks`` (the role event by default)
    before its read; the next ones answer whole."""

    def __init__(self, then: "BaseException | None" = None, chunks: "list | None" = None) -> None:
        self.ours, self.theirs = socket.socketpair()
        self.chunks = [ROLE] if chunks is None else chunks
        # A read the cut never ends fails the test instead of hanging it.
        self.ours.settimeout(10)
        self.then = then
        self.sends = 0

    def get_extra_info(self, name: str):
        return self.ours if name == "socket" else None

    def handle_request(self, request):
        self.sends += 1
        if self.sends > 1:
            return httpx2.Response(200, headers={"content-type": "text/event-stream"}, stream=Body([ROLE, DELTA, STOP], None))
        return httpx2.Response(
            200,
            headers={"content-type": "text/event-stream"},
            stream=OnSocket(self.ours, self.chunks, self.then),
            extensions={"http_version": b"HTTP/1.1", "network_stream": self},
        )


def test_a_read_past_the_first_token_deadline_is_cut_there_and_replayed():
    # The body's reads are given the 300 s quiet window as their read
    # timeout; the first-token deadline, 0.2 s after the send, comes first.
    inner = SocketInner()
    t = transport(inner, first_token_timeout_ms=200)
    started = time.monotonic()
    body = b"".join(send(t).stream)
    assert time.monotonic() - started < 5
    assert body == ROLE + DELTA + STOP
    assert inner.sends == 2
    assert len(t.last_report["attempts"]) == 2
    assert not cut_timers(), "the cut's timer thread is gone"


def test_a_watched_read_the_caller_interrupts_leaves_no_timer_behind():
    class Interrupted(BaseException):
        pass

    inner = SocketInner(then=Interrupted())
    t = transport(inner, first_token_timeout_ms=5_000)
    with pytest.raises(Interrupted):
        send(t)
    assert not cut_timers(), "the cut's timer thread is gone"


def test_a_body_that_never_ends_after_proof_is_cut_at_the_drain():
    # After terminal proof the machine waits 1 s for the body's end; the
    # body's reads were given the 20 s quiet window as their timeout. The
    # read after proof is the shell's, with the connection cut at the
    # drain's bound, so the consumer's iteration ends within seconds,
    # completed, not after the quiet window.
    # A whole answer, terminal proof included, then a server that never
    # closes the body.
    inner = SocketInner(chunks=[ROLE, DELTA, STOP])
    t = transport(inner, idle_timeout_ms=20_000)
    started = time.monotonic()
    body = b"".join(send(t).stream)
    assert time.monotonic() - started < 5
    assert body == ROLE + DELTA + STOP
    assert inner.sends == 1
    assert t.last_report["outcome"]["outcome"] == "completed"
    assert not cut_timers(), "the cut's timer thread is gone"


class Recording(httpx2.BaseTransport):
    """Answers with ``answers`` (chunks, then) in turn, noting each request
    as the inner transport got it (its body read)."""

    def __init__(self, *answers) -> None:
        self.answers = list(answers)
        self.requests: list = []

    def handle_request(self, request):
        request.read()
        self.requests.append(request)
        chunks, then = self.answers.pop(0)
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, stream=Body(chunks, then))


def test_a_send_is_the_callers_request_with_an_identity_encoding_and_resends_are_the_same():
    inner = Recording(([ROLE], httpx2.ReadError("reset")), ([ROLE, DELTA, STOP], None))
    t = transport(inner)
    caller = httpx2.Request(
        "POST",
        URL,
        headers={"Authorization": "Bearer k", "X-Trace": "a", "Accept-Encoding": "gzip, br"},
        content=BODY,
    )
    assert b"".join(t.handle_request(caller).stream) == ROLE + DELTA + STOP
    first, second = inner.requests
    for sent in (first, second):
        assert sent.method == "POST" and sent.url == caller.url
        assert sent.content == BODY
        assert sent.headers.get_list("content-length") == [str(len(BODY))]
        assert sent.headers.get_list("accept-encoding") == ["identity"]
        assert sent.headers["authorization"] == "Bearer k"
        assert sent.headers["x-trace"] == "a"
        assert "transfer-encoding" not in sent.headers
    assert first.headers.raw == second.headers.raw, "a replay resends the same head"
    assert caller.headers["accept-encoding"] == "gzip, br", "the caller's request is left as it was"


def test_a_chunked_request_is_sent_with_the_length_of_its_body():
    inner = Recording(([ROLE, DELTA, STOP], None))
    t = transport(inner)
    caller = httpx2.Request("POST", URL, content=iter([BODY[:10], BODY[10:]]))
    assert caller.headers["transfer-encoding"] == "chunked"
    assert b"".join(t.handle_request(caller).stream) == ROLE + DELTA + STOP
    (sent,) = inner.requests
    assert sent.content == BODY
    assert sent.headers.get_list("content-length") == [str(len(BODY))]
    assert "transfer-encoding" not in sent.headers


def test_events_skipped_where_nobody_listens_are_gone_and_the_rest_come_as_they_would():
    client = recovery_llm._machine.Client({}, [], None)
    stop = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
    text = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'

    def events_after(skipped):
        m = client.start("POST", URL, BODY, 0.0, 0.0, 7)
        steps = [
            lambda: m.poll(0.0),
            lambda: m.on_sent(0.001),
            lambda: m.on_head(0.002, 200, [("content-type", "text/event-stream")]),
            lambda: m.on_chunk(0.003, text),
            lambda: m.on_chunk(0.004, stop),
            lambda: m.on_end(0.005),
        ]
        seen = []
        for i, step in enumerate(steps):
            step()
            if i < skipped:
                m.skip_events()
            else:
                seen.append(m.events())
        return seen

    every = events_after(0)
    assert [e["event"] for step in every for e, _ in step][:1] == ["attempt_started"]
    for skipped in range(1, 6):
        assert events_after(skipped) == every[skipped:], skipped
