"""The shared conformance vectors through RecoveringTransport (the sync
transport), on a virtual clock.

The same prepared vectors and checks as ``conformance.py``; only the I/O
differs. Nothing runs beside a sync request, so the clock moves only when
the request waits: the shell's sleeps advance it, and so do the played
sends, to the time each head or chunk is due. A wait longer than the read
timeout the shell set on the request (``extensions["timeout"]["read"]``,
read when the send starts and again when the body starts, as httpcore
reads it) is a read timeout, as on a socket: the clock moves by the
timeout and the read raises ``httpx2.ReadTimeout``. A connection the shell
has the platform cut at a deadline (``Platform.watch``, a socket shut down
on a real one) ends the read waiting on it then: the clock moves to the
cut and the read raises ``httpx2.RemoteProtocolError``, as httpcore does at
a connection closed mid-body. A cancellation is what a sync caller
can do: an exception out of the call (``Cancelled``, here), at the moment
the vector names.
"""

from __future__ import annotations

from typing import Any, Optional

import httpx2

from conformance import Sends, ending, observed, recorder, transport_for
from recovery_llm import RecoveringTransport
from recovery_llm._shell import Platform


class Cancelled(BaseException):
    """The caller gives up (a sync caller's only way: an exception out of
    the call, as ``KeyboardInterrupt``)."""


class Stalled(Exception):
    """A wait with no read timeout to end it: the run would hang."""


class Cut:
    """The cut the shell asked for at ``at``, until it disarms it."""

    def __init__(self, clock: "Clock", at: float) -> None:
        self.clock = clock
        self.at = at
        self.fired = False

    def disarm(self) -> bool:
        if self.clock.cut is self:
            self.clock.cut = None
        return self.fired


class Clock:
    def __init__(self) -> None:
        self.t = 0.0
        # When the caller cancels, if a vector says so.
        self.cancel_at: Optional[float] = None
        # The connection cut armed for the read going on.
        self.cut: Optional[Cut] = None

    def advance_to(self, t: float) -> None:
        """Moves to ``t``; the caller's cancellation first if it is due."""
        if self.cancel_at is not None and self.cancel_at <= t:
            self.t = max(self.t, self.cancel_at)
            self.cancel_at = None
            raise Cancelled()
        self.t = max(self.t, t)

    def wait(self, due: float, timeout: Optional[float]) -> None:
        """A blocking read until ``due``, bounded by ``timeout`` and by a
        cut of its connection."""
        cut = self.cut
        ends = min(due, self.t + timeout) if timeout is not None else due
        if cut is not None and cut.at < ends:
            self.advance_to(cut.at)
            cut.fired = True
            raise httpx2.RemoteProtocolError("peer closed connection without sending complete message body")
        if timeout is not None and due - self.t > timeout:
            self.advance_to(self.t + timeout)
            raise httpx2.ReadTimeout("timed out")
        if due == float("inf"):
            raise Stalled("a read with no timeout on a server that never answers")
        self.advance_to(due)


class VirtualPlatform(Platform):
    def __init__(self, v: dict, clock: Clock) -> None:
        super().__init__(False)
        self.clock = clock
        self.now = lambda: clock.t
        self.jitter = v["jitter"]
        self.wall_origin = v["wallOriginMs"] / 1000.0
        self.is_online = True

    def wall(self) -> float:
        return self.wall_origin + self.clock.t

    def id(self) -> int:
        return 1

    def online(self) -> bool:
        return self.is_online

    def sleep(self, seconds: float) -> None:
        self.clock.advance_to(self.clock.t + max(seconds, 0.0))

    def watch(self, response: Any, at: float) -> Cut:
        self.clock.cut = Cut(self.clock, at)
        return self.clock.cut


def read_timeout(request: httpx2.Request) -> Optional[float]:
    t = request.extensions.get("timeout")
    return t.get("read") if isinstance(t, dict) else None


class Played(httpx2.SyncByteStream):
    """One played body: each chunk when it is due, then the keepalives,
    then the end."""

    def __init__(self, p: dict, run: "Run", request: httpx2.Request, sent: float) -> None:
        self.p = p
        self.run = run
        self.request = request
        self.sent = sent

    def __iter__(self):
        p, clock = self.p, self.run.clock
        # Read once, when the body starts, as httpcore reads it.
        timeout = read_timeout(self.request)
        for chunk, ms in zip(p["chunks"], p["chunks_at_ms"]):
            clock.wait(self.sent + ms / 1000, timeout)
            yield chunk.encode()
        if p["keepalive_every_ms"]:
            while True:
                clock.wait(clock.t + p["keepalive_every_ms"] / 1000, timeout)
                yield b": keepalive\n\n"
        end = ending(p, self.run)
        if end == "eof":
            return
        if end == "stop":
            raise Cancelled()
        clock.wait(float("inf"), timeout)

    def close(self) -> None:
        pass


class Stub(Sends, httpx2.BaseTransport):
    """Plays the vector's sends on the run's clock."""

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        clock = self.run.clock
        sent = clock.t
        p = self.take(request, request.read())
        head = p["head"]
        if head["kind"] == "never":
            if p["cancel_awaiting"]:
                raise Cancelled()
            clock.wait(float("inf"), read_timeout(request))
        clock.wait(sent + p["head_at_ms"] / 1000, read_timeout(request))
        return httpx2.Response(head["status"], headers=head["headers"], stream=Played(p, self.run, request, sent))


class Run:
    def __init__(self, v: dict) -> None:
        self.clock = Clock()
        self.platform = VirtualPlatform(v, self.clock)
        self.transport: Any = None
        # When the consumer's iteration of the body ended.
        self.body_ended_at: Optional[float] = None

    def offline(self) -> None:
        self.platform.is_online = False
        self.transport._options.client.set_online(False)


# What the sync transports cannot take, by design: each vector needing it
# is left out, with the reason.
UNSUPPORTED = {
    "hedgeAfterMs": "the sync transports do not hedge (refused with UnsupportedOptionError)",
}


def unsupported(v: dict) -> Optional[str]:
    for option, why in UNSUPPORTED.items():
        if option in v["options"]:
            return why
    if v["admission"] is not None and any(a in ("never", "cancel") for a in v["admission"]):
        return "a sync admission hook answers when called: it cannot stay pending"
    return None


def run_one(v: dict, run: Optional[Run] = None) -> dict:
    """Runs one prepared vector through the sync transport (on ``run``'s
    clock, a new one by default); what it observed, for
    ``conformance-js check``."""
    run = run if run is not None else Run(v)
    events: list = []
    delivered = bytearray()
    stub = Stub(v["played"], run)

    def cancel_after(seconds: float) -> None:
        run.clock.cancel_at = run.clock.t + seconds

    hooks: dict = {"on_event": recorder(v, events, cancel_after)}
    if v["admission"] is not None:
        answers = list(v["admission"])

        def admission(context: dict) -> Any:
            answer = answers.pop(0)
            return "maybe" if answer == "unresolved" else answer

        hooks["admission"] = admission
    transport, url, body = transport_for(v, RecoveringTransport, stub, hooks, run.platform)
    run.transport = transport
    r = v["request"]
    try:
        response = transport.handle_request(httpx2.Request(r["method"], url, content=body))
        try:
            for chunk in response.stream:
                delivered.extend(chunk)
            run.body_ended_at = run.clock.t
        finally:
            response.close()
    except (httpx2.TransportError, Cancelled):
        pass  # the report says how it ended
    return observed(v, events, stub, delivered, transport, url, body)
