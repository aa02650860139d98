"""The shared conformance vectors through AsyncRecoveringTransport, on a
virtual clock.

The vectors come prepared by ``conformance-js prepare`` (the one Rust
translation of each vector into the sends played byte for byte, its npm
options and its hooks); what a run observed goes back to ``conformance-js
check``, which holds the vectors' expectations (``Expected::check``). Each
send is played by an in-memory inner transport, the i-th send (a hedge's
included) the i-th played attempt, its head and each chunk at their times
after that send; the run is a trio task on
``trio.testing.MockClock(autojump_threshold=0)``: the clock moves to the
next deadline only when every task waits, as the npm runner's does.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from typing import Any

import anyio
import httpx2
import trio
import trio.testing

from recovery_llm import AsyncRecoveringTransport
from recovery_llm._shell import Platform

ORIGIN = "http://vector.invalid"
TOOL = os.environ.get("RECOVERY_CONFORMANCE_TOOL", "conformance-js")
def snake(name: str) -> str:
    return re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), name)


def options_of(v: dict) -> dict:
    """The vector's npm options as the Python transport's keywords, and the
    retry budget it draws from when not the default."""
    out = {}
    for k, x in v["options"].items():
        if k == "alternates":
            x = [{snake(a): b for a, b in alt.items()} for alt in x]
        elif k == "retryBudget":
            x = {snake(a): b for a, b in x.items()}
        out[snake(k)] = x
    return out


class VirtualPlatform(Platform):
    def __init__(self, v: dict) -> None:
        super().__init__(True)
        self.jitter = v["jitter"]
        self.wall_origin = v["wallOriginMs"] / 1000.0
        self.is_online = True

    def wall(self) -> float:
        return self.wall_origin + anyio.current_time()

    def id(self) -> int:
        return 1

    def online(self) -> bool:
        return self.is_online


async def at(sent: float, ms: int) -> None:
    """Waits until ``ms`` after the send at ``sent`` (no wait once there)."""
    due = sent + ms / 1000
    if due > anyio.current_time():
        await anyio.sleep_until(due)


class Played(httpx2.AsyncByteStream):
    """One played body: each chunk at its time after the send, then the
    keepalives, then the end."""

    def __init__(self, p: dict, run: "Run", sent: float) -> None:
        self.p = p
        self.run = run
        self.sent = sent
        self.closed = False

    async def __aiter__(self):
        p = self.p
        for chunk, ms in zip(p["chunks"], p["chunks_at_ms"]):
            await at(self.sent, ms)
            yield chunk.encode()
        if p["keepalive_every_ms"]:
            while True:
                await anyio.sleep(p["keepalive_every_ms"] / 1000)
                yield b": keepalive\n\n"
        end = ending(p, self.run)
        if end == "eof":
            return
        if end == "stop":
            self.run.stop()
        await anyio.sleep_forever()

    async def aclose(self) -> None:
        self.closed = True


def reset() -> Exception:
    """A connection reset while the body streams."""
    e = httpx2.ReadError("connection reset")
    e.__cause__ = ConnectionResetError()
    return e


def ending(p: dict, run: Any) -> str:
    """How a played body ends once its chunks are out: the platform goes
    offline first if the send says so; a reset raises; else ``eof``,
    ``stop`` (the consumer drops or cancels) or ``hang``."""
    if p["offline"]:
        run.offline()
    end = p["end"]
    if end == "reset":
        raise reset()
    if end in ("consumer_drop", "consumer_cancel"):
        return "stop"
    return "eof" if end == "eof" else "hang"


def request_line(request: httpx2.Request) -> str:
    """How a send is recorded for the check: method, path and the
    headers the vectors expect."""
    line = f"{request.method} {request.url.raw_path.decode()}"
    for name in ("last-event-id", "idempotency-key"):
        if name in request.headers:
            line += f" {name}={request.headers[name]}"
    return line


def continuation_hook(v: dict) -> Any:
    """The vector's continuation hook, if it installs one."""
    c = v["continuation"]
    if c is None or "continuation" in v["options"]:
        return None
    return lambda _: {"url": ORIGIN + c["path"], "method": c["method"], "body": c["body"]}


def transport_for(v: dict, cls: Any, stub: Any, hooks: dict, platform: Any) -> "tuple[Any, str, Any]":
    """The run's transport (``cls`` over ``stub``, with the vector's
    options, ``hooks`` and its continuation hook, and any cooldown in force)
    and the request it sends: ``(transport, url, body)``."""
    if continuation_hook(v):
        hooks["continuation"] = continuation_hook(v)
    transport = cls(stub, **options_of(v), **hooks, _platform=platform)
    r = v["request"]
    url = ORIGIN + r["path"]
    body = r["body"].encode() if r["body"] and r["method"] != "GET" else None
    if v["cooldownMs"] is not None:
        transport.note_cooldown(url, body or b"", v["cooldownMs"] / 1000)
    return transport, url, body


def recorder(v: dict, events: list, cancel_after: Any) -> Any:
    """The ``on_event`` hook of a run: it records each event's name and,
    at the wait the vector cancels during, calls ``cancel_after(seconds)``."""
    waits = [0]

    def on_event(e: dict) -> None:
        events.append(e["event"])
        if e["event"] == "delay_scheduled":
            c = v["cancelDuringWait"]
            if c and c["wait"] == waits[0]:
                cancel_after(c["after_ms"] / 1000)
            waits[0] += 1

    return on_event


def observed(v: dict, events: list, stub: Any, delivered: bytearray, transport: Any, url: str, body: Any) -> dict:
    """What a run observed, for ``conformance-js check``."""
    report = transport.last_report
    return {
        "name": v["name"],
        "events": events,
        "sends": stub.sends,
        "delivered": list(delivered),
        "requests": stub.requests,
        "bodies": stub.bodies,
        "cooldownLeftMs": transport.cooldown_remaining(url, body or b"") * 1000,
        "report": None if report is None else dict(report),
    }


def head_failure(transport: str, phase: str) -> Exception:
    exc_type = {
        "connecting": httpx2.ConnectError,
        "sending": httpx2.WriteError,
        "awaiting_headers": httpx2.ReadError,
        "streaming": httpx2.ReadError,
    }.get(phase, httpx2.TransportError)
    e = exc_type(f"{transport} while {phase}")
    e.recovery_evidence = (transport, phase)
    return e


class Sends:
    """The vector's sends, one per request, the last one repeated, and
    what each request was."""

    def __init__(self, played: list, run: Any) -> None:
        self.played = played
        self.run = run
        self.sends = 0
        self.requests: list = []
        self.bodies: list = []

    def take(self, request: httpx2.Request, body: bytes) -> dict:
        """Records ``request``; its played send, whose head fails here if
        it does (the platform going offline first if the send says so)."""
        p = self.played[min(self.sends, len(self.played) - 1)]
        self.sends += 1
        self.requests.append(request_line(request))
        self.bodies.append(body.decode())
        head = p["head"]
        if head["kind"] in ("fails", "never") and p["offline"]:
            self.run.offline()
        if head["kind"] == "fails":
            raise head_failure(head["transport"], head["phase"])
        return p


class Stub(Sends, httpx2.AsyncBaseTransport):
    """Plays the vector's sends on the event loop's virtual clock."""

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        sent = anyio.current_time()
        p = self.take(request, await request.aread())
        head = p["head"]
        if head["kind"] == "never":
            if p["cancel_awaiting"]:
                self.run.cancel()
            await anyio.sleep_forever()
        await at(sent, p["head_at_ms"])
        status = head["status"]
        return httpx2.Response(status, headers=head["headers"], stream=Played(p, self.run, sent))


class Run:
    def __init__(self, v: dict, nursery: Any) -> None:
        self.v = v
        self.nursery = nursery
        self.scope = anyio.CancelScope()
        self.transport: Any = None

    def offline(self) -> None:
        self.platform.is_online = False
        self.transport._options.client.set_online(False)

    def cancel(self) -> None:
        self.scope.cancel()

    def stop(self) -> None:
        self.scope.cancel()


async def run_vector(v: dict) -> dict:
    """Runs one prepared vector; what it observed, for ``conformance-js
    check``."""
    events: list = []
    delivered = bytearray()
    async with trio.open_nursery() as nursery:
        run = Run(v, nursery)
        run.platform = VirtualPlatform(v)
        stub = Stub(v["played"], run)

        def cancel_after(seconds: float) -> None:
            async def later() -> None:
                await anyio.sleep(seconds)
                run.cancel()

            nursery.start_soon(later)

        hooks: dict = {"on_event": recorder(v, events, cancel_after)}
        if v["admission"] is not None:
            answers = list(v["admission"])

            def admission(context: dict) -> Any:
                answer = answers.pop(0)
                if answer in ("allow", "reject"):
                    return answer
                if answer == "unresolved":
                    return "maybe"
                if answer == "cancel":
                    run.cancel()
                return anyio.sleep_forever()

            hooks["admission"] = admission
        transport, url, body = transport_for(v, AsyncRecoveringTransport, stub, hooks, run.platform)
        run.transport = transport
        r = v["request"]
        with trio.fail_after(10**7):
            with run.scope:
                try:
                    response = await transport.handle_async_request(
                        httpx2.Request(r["method"], url, content=body)
                    )
                    async for chunk in response.stream:
                        delivered.extend(chunk)
                except httpx2.TransportError:
                    pass  # the report says how it ended
        nursery.cancel_scope.cancel()
    return observed(v, events, stub, delivered, transport, url, body)


def run_one(v: dict) -> dict:
    return trio.run(run_vector, v, clock=trio.testing.MockClock(autojump_threshold=0))


def prepared() -> list:
    out = subprocess.run([TOOL, "prepare"], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def check(observed: list) -> "tuple[bool, str]":
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "observed.json")
        with open(path, "w") as f:
            json.dump(observed, f)
        r = subprocess.run([TOOL, "check", path], capture_output=True, text=True)
    return r.returncode == 0, r.stdout + r.stderr
