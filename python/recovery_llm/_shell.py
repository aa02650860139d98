"""The Python shell of recovery_llm: everything that touches the platform.

The Rust module (``recovery_llm._machine``, one ``Machine`` per logical
request) decides every step from plain values; this shell does what it
answers with an inner httpx2 (or httpx) transport, its byte streams, the
clock and the caller's callbacks, and tells the machine what happened. It
decides nothing: whatever it decided on its own would be a defect.

The same code serves httpx2 and legacy httpx: each public transport class
names its ``_http`` module.
"""

from __future__ import annotations

import copy
import random
import socket
import ssl
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any, AsyncIterator, Callable, List, Optional, Tuple

import anyio

from . import _machine as M

SEND = M.SEND
AWAIT_HEAD = M.AWAIT_HEAD
READ = M.READ
RELEASE = M.RELEASE
RESPOND = M.RESPOND
RESPOND_ERROR = M.RESPOND_ERROR
DELIVER = M.DELIVER
SLEEP = M.SLEEP
WAIT_ONLINE = M.WAIT_ONLINE
ASK_ADMISSION = M.ASK_ADMISSION
AWAIT_ADMISSION = M.AWAIT_ADMISSION
ASK_CONTINUATION = M.ASK_CONTINUATION
END_OK = M.END_OK
END_ERR = M.END_ERR
HEDGE = M.HEDGE
RACE = M.RACE
RELEASE_HEDGE = M.RELEASE_HEDGE
PROMOTE = M.PROMOTE
ROLE_FIRST = M.ROLE_FIRST
ROLE_HEDGE = M.ROLE_HEDGE
DELIVER_THIS = M.DELIVER_THIS
EVENTS = M.EVENTS
DEADLINE = M.DEADLINE
FLAGS = EVENTS | DEADLINE

# Headers that describe a request body, dropped with it on a resume.
BODY_HEADERS = ("content-type", "content-length", "transfer-encoding")
# How long a wait for connectivity sleeps before it looks again.
ONLINE_POLL_S = 1.0


class _Default:
    """The value of an option left out: the policy's default."""

    def __repr__(self) -> str:
        return "default"

    def __bool__(self) -> bool:
        return False


DEFAULT: Any = _Default()


class UnsupportedOptionError(ValueError):
    """An option this transport cannot carry out, though the policy takes
    it: ``hedge_after_ms`` on a sync transport (``RecoveringTransport``),
    whose blocking reads cannot race a second attempt (use
    ``AsyncRecoveringTransport``)."""


class RecoveryErrorMixin:
    """What a recovery failure carries, whatever httpx it is raised through.

    ``outcome`` and ``report`` are the typed outcome and the report as dicts
    (the documented JSON forms of the Rust types); ``committed`` says whether
    a response had reached the caller.
    """

    outcome: Optional[dict]
    report: dict
    committed: bool

    def _fill(self, outcome: Optional[dict], report: dict, committed: bool) -> None:
        self.outcome = outcome
        self.report = report
        self.committed = committed


class Platform:
    """The clocks, ids and connectivity the shell gives the machine.

    Tests replace it (a virtual clock); ``now`` is the clock that sleeps and
    timeouts use: ``time.monotonic`` for the sync transports, the event
    loop's clock for the async ones.
    """

    jitter: Optional[float] = None

    def __init__(self, asynchronous: bool) -> None:
        self.now: Callable[[], float] = anyio.current_time if asynchronous else time.monotonic

    def wall(self) -> float:
        return time.time()

    def id(self) -> int:
        return random.getrandbits(64)

    def online(self) -> bool:
        return True

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def watch(self, response: Any, at: float) -> Optional["SocketWatch"]:
        """Cuts the connection under ``response`` at ``at`` (on ``now``'s
        clock) unless disarmed first, so that a blocking read of its body
        ends there. None where that connection cannot be reached: another
        transport than httpcore's, or HTTP/2 (whose connection carries other
        requests)."""
        ext = getattr(response, "extensions", None) or {}
        if ext.get("http_version") not in (b"HTTP/1.1", b"HTTP/1.0"):
            return None
        info = getattr(ext.get("network_stream"), "get_extra_info", None)
        sock = info("socket") if info is not None else None
        if not isinstance(sock, socket.socket):
            return None
        return SocketWatch(sock, at - self.now())


class SocketWatch:
    """A timer that shuts a socket down after ``delay`` seconds unless
    disarmed first: a read blocked on it then ends at once. Its thread ends
    when it fires or is disarmed."""

    def __init__(self, sock: socket.socket, delay: float) -> None:
        self.fired = False
        self._sock = sock
        self._lock = threading.Lock()
        self._armed = True
        self._timer = threading.Timer(max(delay, 0.0), self._cut)
        self._timer.daemon = True
        self._timer.start()

    def _cut(self) -> None:
        with self._lock:
            if not self._armed:
                return
            self.fired = True
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def disarm(self) -> bool:
        """Stops the timer (its thread is gone when this returns); answers
        whether it had cut the connection."""
        with self._lock:
            self._armed = False
        self._timer.cancel()
        self._timer.join()
        return self.fired


def body_headers(head: Any) -> Any:
    """The headers of the response handed out for ``head``: a copy of its
    parsed list, without the content length (the body handed out is the
    machine's, not the attempt's)."""
    headers = head.headers.copy()
    headers.pop("content-length", None)
    return headers


_STREAM_CLASSES: dict = {}


def stream_class(body: type, base: type) -> type:
    """``body`` as a ``base`` (the HTTP module's byte stream type), made
    once per pair: a class made per response cost as much as the rest of
    the shell's work for a short request."""
    key = (body, base)
    made = _STREAM_CLASSES.get(key)
    if made is None:
        made = _STREAM_CLASSES[key] = type(body.__name__, (body, base), {})
    return made


class ReportView(Mapping):
    """The report of one request as it stands now (a read-only mapping;
    ``dict(view)`` copies it)."""

    def __init__(self, machine: Any) -> None:
        self._m = machine

    def _get(self) -> dict:
        return self._m.report()

    def __getitem__(self, key: str) -> Any:
        return self._get()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())

    def __repr__(self) -> str:
        return f"ReportView({self._get()!r})"


def _cause_kind(exc: BaseException) -> str:
    """The transport kind an exception's cause chain shows."""
    seen = 0
    e: Optional[BaseException] = exc
    while e is not None and seen < 8:
        if isinstance(e, socket.gaierror):
            return "dns"
        if isinstance(e, ConnectionRefusedError):
            return "refused"
        if isinstance(e, ssl.SSLCertVerificationError):
            return "tls"
        if isinstance(e, (ConnectionResetError, BrokenPipeError)):
            return "reset"
        e = e.__cause__ or e.__context__
        seen += 1
    return ""


def evidence(http: Any, exc: BaseException, streaming: bool) -> "tuple[str, str]":
    """Maps an exception of the inner transport to the failure evidence the
    machine takes: a transport kind and a phase. An inner transport that
    knows better says so on the exception (``recovery_evidence = (kind,
    phase)``)."""
    given = getattr(exc, "recovery_evidence", None)
    if isinstance(given, tuple) and len(given) == 2:
        return given
    kind = _cause_kind(exc)
    if streaming:
        if isinstance(exc, http.RemoteProtocolError):
            return kind or "closed", "streaming"
        return kind or ("reset" if isinstance(exc, http.ReadError) else "other"), "streaming"
    if isinstance(exc, (http.ConnectError, http.ConnectTimeout)):
        return kind or "other", "connecting"
    if isinstance(exc, (http.WriteError, http.WriteTimeout)):
        return kind or "other", "sending"
    if isinstance(exc, http.RemoteProtocolError):
        return kind or "closed", "awaiting_headers"
    if isinstance(exc, (http.ReadError, http.ReadTimeout)):
        return kind or "reset", "awaiting_headers"
    return kind or "other", "unknown"


class Options:
    """A transport's options, checked once; what its requests share."""

    def __init__(self, http: Any, given: dict, hooks: dict, alternates: Any, platform: Platform) -> None:
        given = dict(given)
        alts = []
        self.alternate_headers: list = []
        self.alternate_bodies: list = []
        for i, a in enumerate(alternates or ()):
            if not isinstance(a, Mapping):
                names = ("label", "url", "model", "protocol", "context_window", "headers", "body", "continuation", "prefill_template")
                a = {k: getattr(a, k) for k in names if hasattr(a, k)}
            known = {"label", "url", "model", "protocol", "context_window", "headers", "body", "continuation", "prefill_template"}
            unknown = set(a) - known
            if unknown:
                raise TypeError(f"unknown recovery option `alternates[{i}].{sorted(unknown)[0]}`")
            alt = {k: a.get(k) for k in ("label", "url", "model", "protocol", "context_window")}
            declared = a.get("continuation")
            if declared not in (None, "prefill"):
                raise ValueError(f"invalid recovery option `alternates[{i}].continuation`: only \"prefill\"")
            if a.get("prefill_template") is not None and declared != "prefill":
                raise ValueError(f"invalid recovery option `alternates[{i}].prefill_template`: applies only with continuation=\"prefill\"")
            if declared == "prefill":
                alt["prefill_template"] = a.get("prefill_template") or "auto"
            alts.append(alt)
            self.alternate_headers.append(list(http.Headers(a.get("headers") or {}).multi_items()))
            body = a.get("body")
            if body is not None and not (isinstance(body, (str, bytes)) or callable(body)):
                raise TypeError(f"invalid recovery option `alternates[{i}].body`: expected str, bytes or a callable")
            self.alternate_bodies.append(body)
        if hooks.get("continuation") == "prefill":
            hooks = {**hooks, "continuation": None}
            given = {**given, "prefill_template": given.get("prefill_template") or "auto"}
        elif "prefill_template" in given:
            raise ValueError('invalid recovery option `prefill_template`: applies only with continuation="prefill"')
        for name, hook in hooks.items():
            if hook is not None and not callable(hook):
                raise TypeError(f"invalid recovery option `{name}`: expected a callable")
        self.client = M.Client(given, alts, platform.jitter)
        # Whether the machine may ask for a hedge: the async shell then
        # reads each attempt before the response without ever cutting a
        # read at the machine's deadline (a hedge may start there).
        self.hedging = self.client.policy()["hedge_after_ms"] != "off"
        self.hooks = hooks
        self.platform = platform
        self.http = http

    def bodies(self, body: Optional[bytes]) -> Optional[list]:
        if not self.alternate_bodies:
            return None
        out = []
        for own in self.alternate_bodies:
            if callable(own):
                own = own((body or b"").decode("utf-8", "replace"))
            if isinstance(own, str):
                own = own.encode()
            if own is not None and not isinstance(own, bytes):
                raise TypeError("an alternate's body callable must return str or bytes")
            out.append(own)
        return out


def given_options(values: dict) -> dict:
    """The options the caller gave (every other one keeps its default)."""
    return {k: v for k, v in values.items() if v is not DEFAULT}


def read_timeouts(original: Any, head_left: Optional[float]) -> dict:
    """The inner request's timeouts: the caller's connect, write and pool
    timeouts, none longer than the machine's head deadline; reads bounded by
    the shell."""
    t = dict(original or {})
    for name in ("connect", "write", "pool"):
        v = t.get(name)
        if head_left is not None:
            v = head_left if v is None else min(v, head_left)
        t[name] = v
    t["read"] = head_left
    return t


class Exchange:
    """One logical request: its machine, what it sends and what it holds.
    The I/O is the subclasses' (sync or async)."""

    def __init__(self, options: Options, request: Any, body: Optional[bytes]) -> None:
        self.o = options
        self.http = options.http
        self.p = options.platform
        self.request = request
        self.url = str(request.url)
        self.method = request.method
        self._headers: Optional[List[Tuple[str, str]]] = None
        self.body = body
        # The caller's headers describe ``body`` as it is sent (its length,
        # not chunked): a send of the request as it came copies them.
        length = request.headers.get("content-length")
        self.as_sent = "transfer-encoding" not in request.headers and (
            length == str(len(body)) if length is not None else not body
        )
        self.extensions = dict(request.extensions)
        hooks = options.hooks
        key = None
        if hooks.get("cooldown_key"):
            key = hooks["cooldown_key"](self.url, (body or b"").decode("utf-8", "replace"))
            if not isinstance(key, str) or not key:
                raise TypeError("cooldown_key must return a non-empty str")
        self.m = options.client.start(
            self.method,
            self.url,
            body,
            self.p.now(),
            self.p.wall(),
            self.p.id(),
            admission=hooks.get("admission") is not None,
            continuation=hooks.get("continuation") is not None,
            bodies=options.bodies(body),
            key=key,
        )
        self.on_event = hooks.get("on_event")
        self.on_status = hooks.get("on_status")
        self.action = 0
        self.deadline: Optional[float] = None
        self.inner: Any = None  # the attempt's response
        self.it: Any = None  # its byte iterator
        self.sent: Any = None  # the request of the send in flight
        self.head: Any = None
        self.continuation_request: Any = None
        self.cause: Optional[BaseException] = None
        self.ended = False
        self.cancelled = False
        self.report = ReportView(self.m)

    @property
    def headers(self) -> List[Tuple[str, str]]:
        """The caller's headers as pairs, made the first time a send is
        built anew (most sends copy the caller's parsed headers instead)."""
        if self._headers is None:
            self._headers = [(k, v) for k, v in self.request.headers.multi_items()]
        return self._headers

    # -- machine plumbing -------------------------------------------------

    def take(self, code: int) -> int:
        if code & EVENTS:
            self.flush()
        if code & DEADLINE:
            self.deadline = self.m.deadline()
        self.action = code & 0xFF
        return code

    def due(self) -> bool:
        """Before a read, the machine judges its timers if its deadline has
        passed (its stall watch moves lazily, so the deadline may lie behind
        the reads that came since); answers whether it then asks for
        something other than the read. Judged where the machine asks for a
        read, never between an output it gave and the shell acting on it:
        an input there would take the output's place."""
        d = self.deadline
        if d is None:
            return False
        now = self.p.now()
        if now < d:
            return False
        self.take(self.m.on_timeout(now))
        # Still a read: it goes on now, bounded by the deadline judged.
        return self.action != READ

    def flush(self) -> None:
        if self.on_event is None and self.on_status is None:
            self.m.skip_events()
            return
        for event, status in self.m.events():
            if self.on_event is not None:
                try:
                    self.on_event(event)
                except Exception:  # a throwing callback changes nothing
                    pass
            if status is not None and self.on_status is not None:
                try:
                    self.on_status(status)
                except Exception:
                    pass

    def failure(self, error_class: Any) -> BaseException:
        """The typed error of a request that failed."""
        m = self.m
        text = m.error_text() or "recovery failed"
        e = error_class(text, request=self.request)
        e._fill(m.outcome(), m.report(), m.committed())
        if self.cause is not None:
            e.__cause__ = self.cause
        return e

    # -- what a send carries ----------------------------------------------

    def outgoing(self, hedge: bool = False) -> Any:
        """The request the machine asked for (with ``hedge``, the hedge's:
        the original request to its target), or None when it cannot be
        made (the machine is told)."""
        if hedge:
            kind, target, url, method, header, with_body = 0, self.m.hedge_target(), "", "", None, True
        else:
            kind, target, url, method, header, with_body = self.m.send_info()
        if kind == 0 and target == 0 and self.as_sent:
            return self.as_it_came()
        spec_url, spec_headers, spec_body = self.url, self.headers, self.body
        if target > 0:
            names = [n for n, _ in self.headers]
            out = self.m.retarget(self.url, self.body or b"", names, target)
            if out is not None:
                spec_url, left, new_body = out
                own = self.o.alternate_headers[target - 1]
                own_names = {n for n, _ in own}
                dropped = set(left) | own_names
                spec_headers = [(n, v) for n, v in self.headers if n not in dropped] + own
                spec_headers = [(n, v) for n, v in spec_headers if n != "content-length"]
                spec_body = None if self.body is None else bytes(new_body)
        if kind == 1:
            hname = header[0] if header else None
            headers = [
                (n, v)
                for n, v in spec_headers
                if n != hname and (with_body or n not in BODY_HEADERS)
            ]
            if header:
                headers.append(header)
            spec = (url, method, headers, spec_body if with_body else None)
        elif kind == 2:
            c = self.continuation_request
            self.continuation_request = None
            if c is None:
                return None
            c_body = c.content if c.method not in ("GET", "HEAD") else None
            spec = (str(c.url), c.method, list(c.headers.multi_items()), c_body)
        elif kind == 0:
            spec = (spec_url, self.method, spec_headers, spec_body)
        elif kind == 3:
            spec = (spec_url, self.method, spec_headers, self.m.send_body())
        else:
            return None
        url, method, headers, body = spec
        headers = [(n, v) for n, v in headers if n not in ("accept-encoding",)]
        # The machine reads the body's bytes: none compressed.
        headers.append(("accept-encoding", "identity"))
        has_key = any(n == "idempotency-key" for n, _ in headers)
        key = self.m.idempotency_key(has_key)
        if key:
            headers.append(("idempotency-key", key))
        if body is not None:
            headers = [(n, v) for n, v in headers if n not in ("content-length", "transfer-encoding")]
        if url is self.url:
            # The caller's URL, parsed already.
            url = self.request.url
        return self.http.Request(method, url, headers=headers, content=body, extensions=self.send_extensions(hedge))

    def as_it_came(self) -> Any:
        """The caller's request as it came, but for what every send
        carries: its headers copied (a copy of the parsed list, where
        building them again from pairs costs five times as much), the
        body's bytes read once."""
        headers = self.request.headers.copy()
        # The machine reads the body's bytes: none compressed.
        headers["accept-encoding"] = "identity"
        key = self.m.idempotency_key("idempotency-key" in headers)
        if key:
            headers["idempotency-key"] = key
        return self.http.Request(
            self.method,
            self.request.url,
            headers=headers,
            stream=self.http.ByteStream(self.body or b""),
            extensions=self.send_extensions(False),
        )

    def send_extensions(self, hedge: bool) -> dict:
        """The caller's extensions, with timeouts that end the head's wait
        at the machine's deadline."""
        ext = {k: v for k, v in self.extensions.items() if k != "timeout"}
        # A hedge's head has a deadline of its own, which the machine's (the
        # earliest of both attempts') may not be.
        d = None if hedge else self.deadline
        head_left = None if d is None else max(d - self.p.now(), 0.001)
        ext["timeout"] = read_timeouts(self.extensions.get("timeout"), head_left)
        return ext

    def head_pairs(self, response: Any) -> list:
        return list(response.headers.multi_items())

    def response_extensions(self, head: Any) -> dict:
        ext = {k: v for k, v in head.extensions.items() if k != "network_stream"}
        ext["recovery_report"] = self.report
        ext["recovery"] = self
        return ext

    @property
    def outcome(self) -> Optional[dict]:
        """The outcome once the request ended (a dict), else None."""
        return self.m.outcome()

    @property
    def protocol(self) -> str:
        """The protocol the answer is decoded as."""
        return self.m.protocol()


# ----------------------------------------------------------------- sync


class SyncExchange(Exchange):
    """The I/O of one request for a sync transport."""

    def __init__(self, options: Options, request: Any, body: Optional[bytes], inner: Any, error_class: Any) -> None:
        super().__init__(options, request, body)
        self.transport = inner
        self.error_class = error_class
        self.reader_of_it: Any = None  # the machine's Reader over ``it``
        # The longest a read of the attempt's body blocks (its read timeout).
        self.read_bound = float("inf")

    def release(self) -> None:
        inner, self.inner, self.it = self.inner, None, None
        self.sent = None
        r, self.reader_of_it = self.reader_of_it, None
        if r is not None:
            r.close()
        if inner is not None:
            try:
                inner.close()
            except Exception:
                pass

    def cancel(self) -> None:
        """The consumer closed the body (or the caller gave up)."""
        if self.ended or self.cancelled:
            self.release()
            return
        self.cancelled = True
        self.take(self.m.on_cancel(self.p.now()))
        self.release()
        while self.action in (RELEASE, DELIVER):
            self.take(self.m.poll(self.p.now()))
        self.ended = True

    def send(self) -> None:
        self.release()
        self.head = None
        req = self.outgoing()
        if req is None:
            self.take(self.m.on_error(self.p.now(), "other", "sending"))
            return
        self.sent = req
        self.take(self.m.on_sent(self.p.now()))

    def await_head(self) -> None:
        req, self.sent = self.sent, None
        if req is None:
            self.take(self.m.on_error(self.p.now(), "other", "unknown"))
            return
        try:
            response = self.transport.handle_request(req)
        except self.http.TimeoutException as e:
            self.cause = e
            self.timed_out(False, e)
            return
        except Exception as e:
            self.cause = e
            kind, phase = evidence(self.http, e, False)
            self.take(self.m.on_error(self.p.now(), kind, phase))
            return
        self.inner = response
        self.head = response
        code = self.m.on_head(self.p.now(), response.status_code, self.head_pairs(response))
        # Reads of the body are bounded by the machine's quiet window: the
        # connection is only given up when a stall is certain.
        timeouts = req.extensions.get("timeout")
        self.read_bound = float("inf")
        if isinstance(timeouts, dict):
            timeouts["read"] = self.m.read_slack(True)
            if timeouts["read"] is not None:
                self.read_bound = timeouts["read"]
        self.it = iter(response.stream)
        self.take(code)

    def timed_out(self, streaming: bool, e: BaseException) -> None:
        """A read or the head timed out: the connection is gone. The machine
        judges its timers when they are due; a wait with nothing due left is
        the failure the exception shows."""
        if streaming:
            self.it = None
        d = self.deadline
        now = self.p.now()
        if d is not None and d <= now:
            self.take(self.m.on_timeout(d))
        self.take(self.m.on_timeout(self.p.now()))
        while self.action in (READ, AWAIT_HEAD) and not self.ended:
            d = self.deadline
            if d is None:
                kind, phase = evidence(self.http, e, streaming)
                self.take(self.m.on_error(self.p.now(), kind, phase))
                return
            left = d - self.p.now()
            if left > 0:
                self.p.sleep(left)
            self.take(self.m.on_timeout(self.p.now()))

    def read(self) -> Optional[bytes]:
        it = self.it
        if it is None:
            self.take(self.m.on_end(self.p.now()))
            return None
        if self.due():
            return None
        watch = self.cut_at_bound()
        cut = False
        try:
            try:
                chunk = next(it)
            finally:
                # Disarmed however the read ends (a KeyboardInterrupt too).
                cut = watch is not None and watch.disarm()
        except StopIteration:
            self.read_end()
            return None
        except Exception as e:
            if cut:
                # Cut at the bound: whatever the read raised is the deadline's.
                self.cause = e
                self.timed_out(True, e)
            else:
                self.read_failed(e)
            return None
        return self.read_chunk(chunk)

    def cut_at_bound(self) -> Any:
        """Before a blocking read: the read is bounded by the machine's
        deadline (plus the slack it names when that deadline may be only a
        check of its stall timers), as the async shell bounds it. Where the
        read's own timeout ends later (a first-token deadline before the
        quiet window the body's reads were given), the connection is cut
        at that bound."""
        d = self.deadline
        if d is None or self.inner is None:
            return None
        slack = self.m.read_slack(False)
        bound = d + (slack or 0.0)
        if bound >= self.p.now() + self.read_bound:
            return None
        return self.p.watch(self.inner, bound)

    def read_end(self) -> None:
        """The body ended."""
        self.it = None
        self.take(self.m.on_end(self.p.now()))

    def read_failed(self, e: Exception) -> None:
        """A read raised ``e``."""
        self.cause = e
        if isinstance(e, self.http.TimeoutException):
            self.timed_out(True, e)
            return
        self.it = None
        kind, phase = evidence(self.http, e, True)
        self.take(self.m.on_error(self.p.now(), kind, phase))

    def read_chunk(self, chunk: Any) -> Optional[bytes]:
        """A chunk was read: the machine takes it; answers it when it goes
        to the consumer now."""
        return self.answered(chunk, self.m.on_chunk(self.p.now(), chunk))

    def answered(self, chunk: Any, code: int) -> Optional[bytes]:
        if code & FLAGS:
            self.take(code)
        else:
            self.action = code & 0xFF
        return chunk if code & DELIVER_THIS else None

    def reader(self) -> Any:
        """The machine's ``Reader`` of the attempt's body (made again for
        each attempt): it reads while the machine only asks for reads."""
        r = self.reader_of_it
        if r is None or r.source is not self.it:
            r = self.reader_of_it = M.Reader(self.m, self.it, self.p.now, self.read_bound)
        return r

    def reader_stopped(self, stop: Any) -> Optional[bytes]:
        """What the reader stopped with (see ``Reader``): the machine is
        told what it has not been; answers a chunk for the consumer."""
        if stop is None:
            return None
        tag = stop[0]
        if tag == "answer":
            return self.answered(stop[1], stop[2])
        if tag == "end":
            self.read_end()
            return None
        return self.read_chunk(stop[1])

    def next(self) -> Any:
        """Runs the machine until it has something for the caller: the
        response (``("respond", head)``), the final error response
        (``("error", head)``), a chunk (bytes), ``None`` at the end, or a
        raised error."""
        while True:
            a = self.action
            if a == READ:
                if self.ended:
                    return None
                chunk = self.read()
                if chunk is not None:
                    return chunk
            elif a == 0:
                self.take(self.m.poll(self.p.now()))
            elif a == SEND:
                self.send()
            elif a == AWAIT_HEAD:
                self.await_head()
            elif a == RELEASE:
                self.release()
                self.take(self.m.poll(self.p.now()))
            elif a == RESPOND:
                head, self.head = self.head, None
                self.take(self.m.poll(self.p.now()))
                if head is None:
                    raise self.end_failure()
                return ("respond", head)
            elif a == RESPOND_ERROR:
                head, self.head = self.head, None
                self.ended = True
                if head is None:
                    raise self.end_failure()
                return ("error", head)
            elif a == DELIVER:
                chunk = self.m.deliver()
                self.take(self.m.poll(self.p.now()))
                if chunk:
                    return chunk
            elif a in (SLEEP, AWAIT_ADMISSION):
                d = self.deadline
                if d is not None:
                    left = d - self.p.now()
                    if left > 0:
                        self.p.sleep(left)
                    self.take(self.m.on_timeout(self.p.now()))
                else:
                    self.take(self.m.poll(self.p.now()))
            elif a == WAIT_ONLINE:
                self.wait_online()
            elif a == ASK_ADMISSION:
                self.ask_admission()
            elif a == ASK_CONTINUATION:
                self.ask_continuation()
            elif a == END_OK:
                self.ended = True
                self.release()
                return None
            else:
                raise self.end_failure()

    def end_failure(self) -> BaseException:
        self.ended = True
        self.release()
        return self.failure(self.error_class)

    def wait_online(self) -> None:
        d = self.deadline
        left = ONLINE_POLL_S if d is None else min(ONLINE_POLL_S, d - self.p.now())
        if left > 0:
            self.p.sleep(left)
        if self.p.online():
            self.take(self.m.on_online(self.p.now()))
        elif d is not None and self.p.now() >= d:
            self.take(self.m.on_timeout(self.p.now()))

    def ask_admission(self) -> None:
        context = self.m.admission_request()
        try:
            value = self.o.hooks["admission"](context)
        except Exception:
            value = None
        self.take(self.m.on_admission(self.p.now(), admission_answer(value)))

    def ask_continuation(self) -> None:
        prefix = self.m.prefix()
        hook = self.o.hooks.get("continuation")
        given = None
        if hook is not None:
            given = hook({"delivered": prefix, "request": self.copy_request()})
        self.continuation_request = self.as_request(given)
        self.take(self.m.on_continuation(self.p.now(), self.continuation_request is not None))

    def copy_request(self) -> Any:
        return self.http.Request(self.method, self.url, headers=self.headers, content=self.body)

    def as_request(self, given: Any) -> Any:
        if given is None:
            return None
        if isinstance(given, self.http.Request):
            given.read()
            return given
        if isinstance(given, Mapping):
            return self.http.Request(
                given.get("method", "POST"),
                given["url"],
                headers=given.get("headers"),
                content=given.get("body"),
            )
        raise TypeError("the continuation hook returns a Request, a dict or None")


def admission_answer(value: Any) -> str:
    if value is True or value == "allow":
        return "allow"
    if value is False or value == "reject":
        return "reject"
    return "unresolved"


class SyncBody:
    """The stitched body of a committed response."""

    def __init__(self, ex: SyncExchange) -> None:
        self.ex = ex

    def __iter__(self) -> Iterator[bytes]:
        return M.Stitched(self.chunks())

    def chunks(self) -> Iterator[Any]:
        """The body's chunks, and the machine's reader wherever it reads:
        ``Stitched`` reads with it (a chunk then costs no frame of this
        shell) and resumes this generator with what it stopped with, or
        with the inner stream's exception; the loop below does everything
        else."""
        ex = self.ex
        try:
            while True:
                if ex.action == READ and ex.it is not None and not ex.ended:
                    r = ex.reader()
                    try:
                        stop = yield r
                    except Exception as e:
                        if not r.raised:
                            raise
                        ex.read_failed(e)
                        continue
                    if stop is not None:
                        chunk = ex.reader_stopped(stop)
                        if chunk is not None:
                            yield chunk
                        continue
                chunk = ex.next()
                if chunk is None:
                    return
                if isinstance(chunk, tuple):
                    continue
                yield chunk
        finally:
            if not ex.ended:
                ex.cancel()

    def close(self) -> None:
        self.ex.cancel()


class SyncErrorBody:
    """The body of the final error response: what the machine held, then the
    rest as the server sends it."""

    def __init__(self, held: list, inner: Any, it: Any) -> None:
        self.held = held
        self.inner = inner
        self.it = it

    def __iter__(self) -> Iterator[bytes]:
        yield from self.held
        if self.it is not None:
            yield from self.it

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()


class SyncShell:
    """The body of ``RecoveringTransport`` (httpx2 and httpx)."""

    _http: Any
    _error: Any

    def _setup(self, transport: Any, values: dict, hooks: dict, alternates: Any, platform: Optional[Platform]) -> None:
        options = Options(self._http, given_options(values), hooks, alternates, platform or Platform(False))
        if options.hedging:
            raise UnsupportedOptionError(
                "invalid recovery option `hedge_after_ms`: the sync transports do not hedge (a blocking read "
                "cannot race another, nor be stopped when its attempt loses); use AsyncRecoveringTransport, "
                'or leave hedge_after_ms "off"'
            )
        self._transport = transport if transport is not None else self._http.HTTPTransport()
        self._options = options
        self._last: Optional[Exchange] = None

    @property
    def last_report(self) -> Optional[Mapping]:
        """The report of the last request this transport started (live while
        it streams), or None."""
        return None if self._last is None else self._last.report

    @property
    def inner(self) -> Any:
        """The transport the requests are sent through."""
        return self._transport

    def cooldown_remaining(self, url: str, body: bytes = b"") -> float:
        """How long sends to ``url`` with ``body`` must still wait (seconds),
        by the cooldowns this transport's requests share."""
        p = self._options.platform
        return self._options.client.cooldown(url, body, None, p.now()) / 1000.0

    def note_cooldown(self, url: str, body: bytes, seconds: float) -> None:
        """Notes that the endpoint of ``url`` with ``body`` asked for no sends
        during ``seconds`` (as a learned ``Retry-After`` is)."""
        p = self._options.platform
        self._options.client.cooldown(url, body, None, p.now(), seconds * 1000.0)

    def handle_request(self, request: Any) -> Any:
        body = request.read()
        ex = SyncExchange(self._options, request, body, self._transport, self._error)
        self._last = ex
        try:
            first = ex.next()
        except BaseException:
            if not ex.ended:
                ex.cancel()
            raise
        kind, head = first
        if kind == "error":
            held = list(ex.m.take_held())
            inner, it = ex.inner, ex.it
            ex.inner = ex.it = None
            return self._http.Response(
                status_code=head.status_code,
                headers=head.headers,
                stream=self._error_stream(held, inner, it),
                extensions=ex.response_extensions(head),
            )
        return self._http.Response(
            status_code=head.status_code,
            headers=body_headers(head),
            stream=self._body_stream(ex),
            extensions=ex.response_extensions(head),
        )

    def _body_stream(self, ex: SyncExchange) -> Any:
        return stream_class(SyncBody, self._http.SyncByteStream)(ex)

    def _error_stream(self, held: list, inner: Any, it: Any) -> Any:
        return stream_class(SyncErrorBody, self._http.SyncByteStream)(held, inner, it)

    def close(self) -> None:
        self._transport.close()


# ----------------------------------------------------------------- async


class AsyncioWatch:
    """The bound of a request's reads on asyncio: one loop timer per request,
    armed at the first read's bound and moved only when it fires early (a
    lazy timer), so that a chunk pays for no timer of its own; a per-read
    ``asyncio.timeout_at`` costs about 6 µs a chunk, this a few attribute
    writes. A read still running at its bound is cancelled as
    ``asyncio.timeout`` cancels it, and takes the cancellation back
    (``Task.uncancel``) unless another was asked for meanwhile."""

    __slots__ = ("asyncio", "loop", "task", "handle", "at", "bound", "reading", "fired")

    def __init__(self, asyncio: Any) -> None:
        self.asyncio = asyncio
        self.loop: Any = None
        self.task: Any = None
        self.handle: Any = None
        self.at = 0.0
        self.bound: Optional[float] = None
        self.reading = False
        self.fired = False

    def begin(self, bound: Optional[float]) -> int:
        """Before a read bounded by ``bound`` (the loop's time; None: no
        bound). Answers the task's count of cancellations asked for."""
        task = self.task = self.asyncio.current_task()
        self.bound = bound
        if bound is not None:
            h = self.handle
            if h is None or self.at > bound:
                if h is not None:
                    h.cancel()
                if self.loop is None:
                    self.loop = self.asyncio.get_running_loop()
                self.handle = self.loop.call_at(bound, self.alarm)
                self.at = bound
        self.reading = True
        return task.cancelling()

    def cut_off(self, cancelling: int) -> bool:
        """The read was cancelled: whether by its bound alone (the
        cancellation is then taken back)."""
        self.reading = False
        if not self.fired:
            return False
        self.fired = False
        return self.task.uncancel() <= cancelling

    def done(self) -> None:
        """After the read, however it ended."""
        self.reading = False
        if self.fired:
            # The alarm cancelled a read that ended otherwise (its inner
            # stream took the cancellation): take it back.
            self.fired = False
            self.task.uncancel()

    def alarm(self) -> None:
        self.handle = None
        bound = self.bound
        if not self.reading or bound is None:
            return
        if self.loop.time() < bound:
            self.handle = self.loop.call_at(bound, self.alarm)
            self.at = bound
            return
        self.fired = True
        self.task.cancel()

    def stop(self) -> None:
        """No read is due: the timer goes (it would keep the request alive
        until it fired)."""
        h, self.handle = self.handle, None
        if h is not None:
            h.cancel()


def _asyncio_watch(platform: Platform) -> Optional[AsyncioWatch]:
    """An ``AsyncioWatch`` when the request runs on asyncio (3.11+:
    ``Task.uncancel``) and its clock is the loop's, else None (anyio's
    cancel scopes)."""
    if platform.now is not anyio.current_time:
        return None
    try:
        import sniffio

        if sniffio.current_async_library() != "asyncio":
            return None
        import asyncio

        if not hasattr(asyncio.Task, "uncancel"):
            return None
        return AsyncioWatch(asyncio)
    except Exception:
        return None


class Lane:
    """One attempt read in a task of its own, so that waiting on it never
    cuts it (before the first token when a hedge may race it, and during
    the race): the request still to send, its response and byte iterator,
    and its one read in flight (the head, or the next chunk) with what it
    brought (``news``: ``("head", response)``, ``("chunk", bytes)``,
    ``("end",)`` or ``("error", exception, streaming)``)."""

    __slots__ = ("sent", "inner", "it", "head", "scope", "stopped", "news")

    def __init__(self, sent: Any = None, inner: Any = None, it: Any = None, head: Any = None) -> None:
        self.sent = sent
        self.inner = inner
        self.it = it
        self.head = head
        self.scope: Any = None  # the read in flight's cancel scope
        self.stopped: Any = None  # set once that read has stopped
        self.news: Optional[tuple] = None

    @property
    def busy(self) -> bool:
        return self.scope is not None or self.news is not None


class Lanes:
    """The lanes of a request that may hedge, until its response: the
    first attempt's, a hedge's while it races, the task group their reads
    run in, the event either's news sets, and the last deadline judged
    while they waited (one attribute of the exchange: an instance with
    more than 30 attributes loses CPython's shared-key layout, and every
    read of the body pays for it)."""

    __slots__ = ("first", "hedge", "tasks", "wake", "judged")

    def __init__(self) -> None:
        self.first: Optional[Lane] = None
        self.hedge: Optional[Lane] = None
        self.tasks: Any = None
        self.wake: Any = None
        self.judged: Optional[float] = None


class AsyncExchange(Exchange):
    """The I/O of one request for an async transport (anyio: asyncio or
    trio)."""

    def __init__(self, options: Options, request: Any, body: Optional[bytes], inner: Any, error_class: Any) -> None:
        super().__init__(options, request, body)
        self.transport = inner
        self.error_class = error_class
        self.watch = _asyncio_watch(options.platform)
        if self.watch is not None:
            # On asyncio, anyio's clock is the loop's, read through anyio at
            # about 1 µs a call; the loop's own method reads it at a tenth of
            # that, and a chunk reads the clock twice.
            self.p = copy.copy(self.p)
            self.p.now = self.watch.asyncio.get_running_loop().time
        # Before the response, when the machine may hedge: each attempt is
        # read in a task of its own (``Lanes``).
        self.lanes: Optional[Lanes] = Lanes() if options.hedging else None

    async def release(self) -> None:
        lanes = self.lanes
        if lanes is not None and lanes.first is not None:
            lane = lanes.first
            # Its head stays: a failed attempt's may still be the answer.
            lanes.first = Lane(head=lane.head)
            await self.close_lane(lane)
            return
        inner, self.inner, self.it = self.inner, None, None
        self.sent = None
        if self.watch is not None:
            self.watch.stop()
        if inner is not None:
            with anyio.CancelScope(shield=True):
                try:
                    await inner.aclose()
                except Exception:
                    pass

    async def release_hedge(self) -> None:
        lanes = self.lanes
        if lanes is not None and lanes.hedge is not None:
            lane, lanes.hedge = lanes.hedge, None
            await self.close_lane(lane)

    async def close_lane(self, lane: Lane) -> None:
        """Stops the lane's read in flight, then closes its response."""
        with anyio.CancelScope(shield=True):
            if lane.scope is not None:
                lane.scope.cancel()
                await lane.stopped.wait()
            inner, lane.inner, lane.it, lane.sent, lane.news = lane.inner, None, None, None, None
            if inner is not None:
                try:
                    await inner.aclose()
                except Exception:
                    pass

    async def cancel(self) -> None:
        if self.ended or self.cancelled:
            await self.release()
            await self.release_hedge()
            return
        self.cancelled = True
        self.take(self.m.on_cancel(self.p.now()))
        await self.release()
        while self.action in (RELEASE, DELIVER, RELEASE_HEDGE):
            if self.action == RELEASE_HEDGE:
                await self.release_hedge()
            self.take(self.m.poll(self.p.now()))
        # The request is over: nothing of it stays open.
        await self.release_hedge()
        self.ended = True

    def send(self) -> None:
        self.head = None
        req = self.outgoing()
        if req is None:
            self.take(self.m.on_error(self.p.now(), "other", "sending"))
            return
        self.sent = req
        self.take(self.m.on_sent(self.p.now()))

    async def await_head(self) -> None:
        req, self.sent = self.sent, None
        if req is None:
            self.take(self.m.on_error(self.p.now(), "other", "unknown"))
            return
        timeouts = req.extensions["timeout"]
        timeouts["read"] = None
        d = self.deadline
        response = None
        with anyio.CancelScope(deadline=d if d is not None else float("inf")) as scope:
            try:
                response = await self.transport.handle_async_request(req)
            except anyio.get_cancelled_exc_class():
                raise
            except Exception as e:
                self.cause = e
                kind, phase = evidence(self.http, e, False)
                self.take(self.m.on_error(self.p.now(), kind, phase))
                return
        if scope.cancelled_caught or response is None:
            await self.expire(False)
            return
        self.inner = response
        self.head = response
        self.it = response.stream.__aiter__()
        self.take(self.m.on_head(self.p.now(), response.status_code, self.head_pairs(response)))

    async def expire(self, streaming: bool) -> None:
        """A wait reached its bound: the machine judges its timers (the
        check of its stall timers at the deadline first, when reads came
        since the last one). A read cut off by it is gone: the connection
        is released when the machine says so, else it is the failure."""
        d = self.deadline
        slack = self.m.read_slack(False)
        if slack is not None and d is not None and d <= self.p.now():
            self.take(self.m.on_timeout(d))
        self.take(self.m.on_timeout(self.p.now()))
        if streaming:
            self.it = None
        while self.action in (READ, AWAIT_HEAD) and not self.ended:
            d = self.deadline
            if d is None:
                self.take(self.m.on_error(self.p.now(), "other", "streaming" if streaming else "unknown"))
                return
            await anyio.sleep_until(d)
            self.take(self.m.on_timeout(self.p.now()))

    async def read(self) -> Optional[bytes]:
        it = self.it
        if it is None:
            self.take(self.m.on_end(self.p.now()))
            return None
        if self.due():
            return None
        d = self.deadline
        if d is not None:
            slack = self.m.read_slack(False)
            if slack is not None:
                d += slack
        chunk = None
        expired = False
        w = self.watch
        try:
            if w is not None:
                cancelling = w.begin(d)
                try:
                    chunk = await it.__anext__()
                except w.asyncio.CancelledError:
                    if not w.cut_off(cancelling):
                        raise
                    expired = True
                finally:
                    w.done()
            else:
                with anyio.CancelScope(deadline=d if d is not None else float("inf")) as scope:
                    chunk = await it.__anext__()
                expired = scope.cancelled_caught
        except StopAsyncIteration:
            self.it = None
            self.take(self.m.on_end(self.p.now()))
            return None
        except anyio.get_cancelled_exc_class():
            raise
        except Exception as e:
            self.cause = e
            self.it = None
            kind, phase = evidence(self.http, e, True)
            self.take(self.m.on_error(self.p.now(), kind, phase))
            return None
        if expired:
            await self.expire(True)
            return None
        now = self.p.now()
        code = self.m.on_chunk(now, chunk)
        if code & FLAGS:
            self.take(code)
        else:
            self.action = code & 0xFF
        return chunk if code & DELIVER_THIS else None

    async def next(self) -> Any:
        """The async twin of ``SyncExchange.next``."""
        while True:
            a = self.action
            if a == READ:
                if self.ended:
                    return None
                chunk = await self.read()
                if chunk is not None:
                    return chunk
            elif a == 0:
                self.take(self.m.poll(self.p.now()))
            elif a == SEND:
                await self.release()
                self.send()
            elif a == AWAIT_HEAD:
                if self.lanes is not None:
                    await self.read_lanes()
                else:
                    await self.await_head()
            elif a == RELEASE:
                await self.release()
                self.take(self.m.poll(self.p.now()))
            elif a == RESPOND:
                if self.lanes is not None:
                    await self.drop_lanes()
                head, self.head = self.head, None
                self.take(self.m.poll(self.p.now()))
                if head is None:
                    raise await self.end_failure()
                return ("respond", head)
            elif a == RESPOND_ERROR:
                if self.lanes is not None:
                    await self.drop_lanes()
                head, self.head = self.head, None
                self.ended = True
                if head is None:
                    raise await self.end_failure()
                return ("error", head)
            elif a == DELIVER:
                chunk = self.m.deliver()
                self.take(self.m.poll(self.p.now()))
                if chunk:
                    return chunk
            elif a in (SLEEP, AWAIT_ADMISSION):
                d = self.deadline
                if d is not None:
                    await anyio.sleep_until(d)
                    self.take(self.m.on_timeout(self.p.now()))
                else:
                    self.take(self.m.poll(self.p.now()))
            elif a == WAIT_ONLINE:
                await self.wait_online()
            elif a == ASK_ADMISSION:
                await self.ask_admission()
            elif a == ASK_CONTINUATION:
                await self.ask_continuation()
            elif a == END_OK:
                self.ended = True
                await self.release()
                await self.release_hedge()
                return None
            elif a in (HEDGE, RACE, RELEASE_HEDGE, PROMOTE):
                if self.lanes is None:
                    self.lanes = Lanes()
                await self.read_lanes()
            else:
                raise await self.end_failure()

    async def end_failure(self) -> BaseException:
        self.ended = True
        await self.release()
        await self.release_hedge()
        return self.failure(self.error_class)

    # -- lanes: the reads a hedge may race ---------------------------------

    async def drop_lanes(self) -> None:
        """The response: no hedge may start any more, and none is left."""
        await self.release_hedge()
        self.lanes = None

    async def read_lanes(self) -> None:
        """Runs the machine while it awaits, reads or races its attempts
        before the response: each attempt's head and chunks are read in a
        task of its own (``Lane``), so a wait reaching the machine's
        deadline (where a hedge may start) is only a wait, never a cut
        read. Returns at the machine's first other action, the attempt's
        parts back in place for the usual path."""
        lanes = self.lanes
        assert lanes is not None
        lanes.first = Lane(self.sent, self.inner, self.it, self.head)
        self.sent = self.inner = self.it = self.head = None
        try:
            async with anyio.create_task_group() as tasks:
                lanes.tasks = tasks
                try:
                    await self.run_lanes(lanes)
                finally:
                    for lane in (lanes.first, lanes.hedge):
                        if lane is not None and lane.scope is not None:
                            lane.scope.cancel()
        finally:
            lanes.tasks = None
            lane, lanes.first = lanes.first, None
            if lane is not None:
                self.sent, self.inner, self.it, self.head = lane.sent, lane.inner, lane.it, lane.head

    async def run_lanes(self, lanes: Lanes) -> None:
        while True:
            a = self.action
            if a == AWAIT_HEAD or a == READ:
                await self.await_lanes(lanes, None)
            elif a == RACE:
                await self.await_lanes(lanes, lanes.hedge)
            elif a == HEDGE:
                self.send_hedge(lanes)
            elif a == RELEASE:
                await self.release()
                self.take(self.m.poll(self.p.now()))
            elif a == RELEASE_HEDGE:
                await self.release_hedge()
                self.take(self.m.poll(self.p.now()))
            elif a == PROMOTE:
                # The first attempt was released just before.
                first, lanes.first, lanes.hedge = lanes.first, lanes.hedge or Lane(), None
                if first is not None:
                    await self.close_lane(first)
                self.take(self.m.poll(self.p.now()))
            elif a == 0:
                self.take(self.m.poll(self.p.now()))
            else:
                return

    def send_hedge(self, lanes: Lanes) -> None:
        """Action HEDGE: the original request to the hedge's target, sent
        beside the attempt in flight (its head is awaited with the race)."""
        lane = lanes.hedge = Lane()
        req = self.outgoing(hedge=True)
        if req is None:
            self.take(self.m.on_error_of(ROLE_HEDGE, self.p.now(), "other", "sending"))
            return
        lane.sent = req
        self.take(self.m.on_sent_of(ROLE_HEDGE, self.p.now()))

    async def await_lanes(self, lanes: Lanes, hedge: Optional[Lane]) -> None:
        """Waits for the first news of the first attempt's lane (and
        ``hedge``'s, racing it) or the machine's deadline, and tells the
        machine: the deadline first when both are due, then the first
        attempt's news, then the hedge's."""
        first = lanes.first
        d = self.deadline
        now = self.p.now()
        if d is not None and now >= d:
            if d != lanes.judged:
                lanes.judged = d
                self.take(self.m.on_timeout(now))
                return
            # Judged already and still there: only news is awaited.
            d = None
        for role, lane in ((ROLE_FIRST, first), (ROLE_HEDGE, hedge)):
            if lane is not None and not lane.busy and not self.start_read(lanes, role, lane):
                return
        if self.feed(first, hedge):
            return
        wake = lanes.wake = anyio.Event()
        with anyio.CancelScope(deadline=d if d is not None else float("inf")):
            await wake.wait()
        lanes.wake = None
        now = self.p.now()
        if d is not None and now >= d:
            lanes.judged = d
            self.take(self.m.on_timeout(now))
            return
        self.feed(first, hedge)

    def start_read(self, lanes: Lanes, role: int, lane: Lane) -> bool:
        """Starts the lane's next read: its head when its request is still
        to send, else its next chunk. With nothing left to read, tells the
        machine so at once and answers False."""
        if lane.sent is None and lane.it is None:
            now = self.p.now()
            if self.action == AWAIT_HEAD or lane.inner is None:
                self.take(self.m.on_error_of(role, now, "other", "unknown"))
            else:
                self.take(self.m.on_end_of(role, now))
            return False
        lane.scope = anyio.CancelScope()
        lane.stopped = anyio.Event()
        lanes.tasks.start_soon(self.read_lane, lanes, lane)
        return True

    async def read_lane(self, lanes: Lanes, lane: Lane) -> None:
        """One read of a lane, in its own task: the head (sending the
        request) or the next chunk; what it brought goes to ``lane.news``."""
        news: Optional[tuple] = None
        try:
            with lane.scope:
                req = lane.sent
                if req is not None:
                    lane.sent = None
                    timeouts = req.extensions.get("timeout")
                    if isinstance(timeouts, dict):
                        timeouts["read"] = None
                    try:
                        response = await self.transport.handle_async_request(req)
                    except anyio.get_cancelled_exc_class():
                        raise
                    except Exception as e:
                        news = ("error", e, False)
                    else:
                        lane.inner = lane.head = response
                        lane.it = response.stream.__aiter__()
                        news = ("head", response)
                else:
                    try:
                        chunk = await lane.it.__anext__()
                    except StopAsyncIteration:
                        lane.it = None
                        news = ("end",)
                    except anyio.get_cancelled_exc_class():
                        # A read cut off is gone with its stream.
                        lane.it = None
                        raise
                    except Exception as e:
                        lane.it = None
                        news = ("error", e, True)
                    else:
                        news = ("chunk", chunk)
        finally:
            lane.scope = None
            lane.stopped.set()
        if news is not None:
            lane.news = news
            if lanes.wake is not None:
                lanes.wake.set()

    def feed(self, first: Optional[Lane], hedge: Optional[Lane]) -> bool:
        """Tells the machine the news of the first lane that has some (the
        first attempt's before the hedge's); False when neither has."""
        for role, lane in ((ROLE_FIRST, first), (ROLE_HEDGE, hedge)):
            if lane is None or lane.news is None:
                continue
            news, lane.news = lane.news, None
            now = self.p.now()
            kind = news[0]
            if kind == "chunk":
                # Before the response no chunk goes out as it is read.
                self.take(self.m.on_chunk_of(role, now, news[1]))
            elif kind == "head":
                response = news[1]
                self.take(self.m.on_head_of(role, now, response.status_code, self.head_pairs(response)))
            elif kind == "end":
                self.take(self.m.on_end_of(role, now))
            else:
                e = self.cause = news[1]
                k, phase = evidence(self.http, e, news[2])
                self.take(self.m.on_error_of(role, now, k, phase))
            return True
        return False

    async def wait_online(self) -> None:
        d = self.deadline
        until = self.p.now() + ONLINE_POLL_S
        if d is not None:
            until = min(until, d)
        await anyio.sleep_until(until)
        if self.p.online():
            self.take(self.m.on_online(self.p.now()))
        elif d is not None and self.p.now() >= d:
            self.take(self.m.on_timeout(self.p.now()))

    async def ask_admission(self) -> None:
        context = self.m.admission_request()
        d = self.deadline
        value = None
        with anyio.CancelScope(deadline=d if d is not None else float("inf")) as scope:
            try:
                value = self.o.hooks["admission"](context)
                if hasattr(value, "__await__"):
                    value = await value
            except anyio.get_cancelled_exc_class():
                raise
            except Exception:
                value = None
        if scope.cancelled_caught:
            self.take(self.m.on_timeout(self.p.now()))
            return
        self.take(self.m.on_admission(self.p.now(), admission_answer(value)))

    async def ask_continuation(self) -> None:
        prefix = self.m.prefix()
        hook = self.o.hooks.get("continuation")
        given = None
        if hook is not None:
            given = hook({"delivered": prefix, "request": self.copy_request()})
            if hasattr(given, "__await__"):
                given = await given
        self.continuation_request = await self.as_request(given)
        self.take(self.m.on_continuation(self.p.now(), self.continuation_request is not None))

    def copy_request(self) -> Any:
        return self.http.Request(self.method, self.url, headers=self.headers, content=self.body)

    async def as_request(self, given: Any) -> Any:
        if given is None:
            return None
        if isinstance(given, self.http.Request):
            await given.aread()
            return given
        if isinstance(given, Mapping):
            return self.http.Request(
                given.get("method", "POST"),
                given["url"],
                headers=given.get("headers"),
                content=given.get("body"),
            )
        raise TypeError("the continuation hook returns a Request, a dict or None")


class AsyncBody:
    """The stitched body of a committed response (async)."""

    def __init__(self, ex: AsyncExchange) -> None:
        self.ex = ex

    async def __aiter__(self) -> AsyncIterator[bytes]:
        ex = self.ex
        try:
            while True:
                chunk = await ex.next()
                if chunk is None:
                    return
                if isinstance(chunk, tuple):
                    continue
                yield chunk
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await ex.cancel()
            raise
        finally:
            if not ex.ended:
                with anyio.CancelScope(shield=True):
                    await ex.cancel()

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            await self.ex.cancel()


class AsyncErrorBody:
    def __init__(self, held: list, inner: Any, it: Any) -> None:
        self.held = held
        self.inner = inner
        self.it = it

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.held:
            yield chunk
        if self.it is not None:
            async for chunk in self.it:
                yield chunk

    async def aclose(self) -> None:
        if self.inner is not None:
            await self.inner.aclose()


class AsyncShell:
    """The body of ``AsyncRecoveringTransport`` (httpx2 and httpx)."""

    _http: Any
    _error: Any

    def _setup(self, transport: Any, values: dict, hooks: dict, alternates: Any, platform: Optional[Platform]) -> None:
        self._transport = transport if transport is not None else self._http.AsyncHTTPTransport()
        self._options = Options(self._http, given_options(values), hooks, alternates, platform or Platform(True))
        self._last: Optional[Exchange] = None

    last_report = SyncShell.last_report
    inner = SyncShell.inner
    cooldown_remaining = SyncShell.cooldown_remaining
    note_cooldown = SyncShell.note_cooldown

    async def handle_async_request(self, request: Any) -> Any:
        body = await request.aread()
        ex = AsyncExchange(self._options, request, body, self._transport, self._error)
        self._last = ex
        try:
            first = await ex.next()
        except BaseException:
            if not ex.ended:
                with anyio.CancelScope(shield=True):
                    await ex.cancel()
            raise
        kind, head = first
        http = self._http
        if kind == "error":
            held = list(ex.m.take_held())
            inner, it = ex.inner, ex.it
            ex.inner = ex.it = None
            return http.Response(
                status_code=head.status_code,
                headers=head.headers,
                stream=stream_class(AsyncErrorBody, http.AsyncByteStream)(held, inner, it),
                extensions=ex.response_extensions(head),
            )
        return http.Response(
            status_code=head.status_code,
            headers=body_headers(head),
            stream=stream_class(AsyncBody, http.AsyncByteStream)(ex),
            extensions=ex.response_extensions(head),
        )

    async def aclose(self) -> None:
        await self._transport.aclose()
