"""The options every recovering transport takes, documented once."""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Optional, Sequence, Union

from ._shell import DEFAULT, Platform

__all__ = ["Configured"]

Event = Mapping[str, Any]
# Whole milliseconds (a float that is a whole number is taken too).
Millis = Union[int, float]
# A bound in milliseconds, or "off" (None is its synonym).
Bound = Union[int, float, str, None]


class Configured:
    """A recovering transport: every request sent through it is one logical
    request run by the Recovery engine (a replay before the first token, a
    resume or a typed error after it, never a silent short answer).

    ``transport`` is the transport requests are sent through (by default a
    new ``HTTPTransport()`` / ``AsyncHTTPTransport()``). Turn the SDK's own
    retries off (``max_retries=0``): this transport retries, within its
    policy.

    Policy: the knobs of the policy spec every front end reads, by the
    same names (the gateway's ``[policy]`` keys, ``recover``'s flags with
    dashes, the npm options in camelCase; ``recovery_llm._machine.
    policy_fields()`` lists them). A knob left out keeps its default;
    durations in whole milliseconds; ``"off"`` (or its synonym ``None``)
    turns a bound off, and 0 is refused where it would mean nothing, with
    ``ValueError`` and the words every front end uses
    (``idle_timeout_ms: 0 is not a duration; use "off" to turn it off``):
    ``max_attempts`` (3, the first send included), ``attempts_per_target``
    (1), ``max_resumes`` (1), ``budget_ms`` (60000, from the first failure),
    ``deadline_ms`` (off, from the start), ``backoff_base_ms`` (500),
    ``backoff_ceiling_ms`` (8000), ``retry_after_ceiling_ms`` (60000; a
    ``Retry-After`` above it is refused, never shortened, unless
    ``over_ceiling="backoff"``), ``head_timeout_ms`` (300000),
    ``idle_timeout_ms`` (600000), ``progress_timeout_ms`` (600000),
    ``first_token_timeout_ms`` (off), ``hedge_after_ms`` (off: with no
    token this long after a send, before any output, a second send of the
    original request races it and the first semantic fragment wins;
    async transports only, a sync one raises ``UnsupportedOptionError``),
    ``max_hedges`` (1, hedges a request may start in all; each is a send,
    counted by ``max_attempts`` and the retry budget),
    ``retryable_statuses`` (408, 429, 500, 502, 503, 504, 529),
    ``retryable_categories``, ``endpoint``
    (``"remote"``, or ``"local"``: an ambiguous resend then needs
    ``admission``), ``replay_body_cap``, ``holdback_cap``, ``evidence_cap``
    (bytes), ``max_event_bytes`` (33554432: the largest line, event or
    whole JSON answer read; an image arrives as one event of several MiB),
    ``idempotency_key`` (False), ``retry_protocol_violations`` (False).

    What the requests of this transport share: ``retry_budget`` (the default
    budget, 20 % of requests plus 1 retry/s over 10 s; ``None`` for none, or
    ``{"ttl_ms", "min_retries_per_sec", "percent"}``) and ``cooldowns``
    (True: a ``Retry-After`` one request learns holds the others bound for
    the same origin and model; ``cooldown_key(url, body_text)`` names the key
    yourself).

    ``protocol``: ``"auto"`` (guessed from the URL), ``"openai-chat"``,
    ``"openai-responses"``, ``"anthropic"``, ``"gemini"``, ``"ollama"`` or
    ``"sse"`` (with ``sse_terminal={"data": "[DONE]"}`` or ``{"event":
    "end"}``). ``resumable_sse``: the endpoint resumes an SSE stream from
    ``Last-Event-ID``. ``alternates``: where a request may go instead
    before its first token, in order: dicts (or objects) with ``label``,
    ``url`` (absolute, or a path on the request's origin), ``model``,
    ``protocol``, ``context_window``, ``headers`` and ``body`` (str, bytes,
    or a callable of the request's body text); ``context_window`` the
    request's own declared window, in tokens.

    Callbacks: ``on_event(event)`` gets each lifecycle event as a dict (the
    documented JSON form: ``event``, ``logical_id``, ``attempt_id``,
    ``wire_attempt``, ``at_ms`` and the event's fields; a race adds
    ``hedge_started`` with ``hedge`` and ``after_ms``, and
    ``hedge_cancelled`` with ``reason`` and ``role``); ``on_status(status)``
    each change of the request's status (``"in_progress"``,
    ``"reconnecting"``, ``"completed"``, ``"failed"``, ``"cancelled"``, ...);
    ``admission(context)`` answers ``"allow"``/``"reject"`` (or True/False,
    or an awaitable of them, async only) for an ambiguous resend;
    ``continuation({"delivered": prefix, "request": request})`` returns a
    request (an httpx ``Request`` or ``{"url", "method", "headers",
    "body"}``) that continues a committed answer no native resume can, or
    None; or ``continuation="prefill"`` declares that the endpoint continues
    an answer from its own prefix sent as the final assistant message
    (``prefill_template``: ``"auto"``, ``"assistant"``, ``"prefix"`` or
    ``"continue_final_message"``; alternates take the same two keys). A
    callback that raises changes nothing.

    After the first byte reaches the caller, a failure surfaces from the
    response stream as ``RecoveryError`` (a ``ReadError``: each SDK raises
    its own connection error from it), with ``.outcome`` and ``.report``;
    before it, the caller gets a normal response, the provider's final
    error response as it came, or ``RecoveryError``. Each response's
    ``extensions["recovery_report"]`` is its report (a live mapping; an
    attempt of a race has ``role``, ``"first"`` or ``"hedge"``, and one
    released without failing the result ``"hedge_cancelled"`` with its
    ``reason``); ``transport.last_report`` the last request's.
    """

    def __init__(
        self,
        transport: Any = None,
        *,
        max_attempts: int = DEFAULT,
        attempts_per_target: int = DEFAULT,
        max_resumes: int = DEFAULT,
        budget_ms: Bound = DEFAULT,
        deadline_ms: Bound = DEFAULT,
        backoff_base_ms: Millis = DEFAULT,
        backoff_ceiling_ms: Millis = DEFAULT,
        retry_after_ceiling_ms: Millis = DEFAULT,
        over_ceiling: str = DEFAULT,
        head_timeout_ms: Bound = DEFAULT,
        idle_timeout_ms: Bound = DEFAULT,
        progress_timeout_ms: Bound = DEFAULT,
        first_token_timeout_ms: Bound = DEFAULT,
        hedge_after_ms: Bound = DEFAULT,
        max_hedges: int = DEFAULT,
        retryable_statuses: Iterable[int] = DEFAULT,
        retryable_categories: Iterable[str] = DEFAULT,
        endpoint: str = DEFAULT,
        replay_body_cap: int = DEFAULT,
        holdback_cap: int = DEFAULT,
        evidence_cap: int = DEFAULT,
        max_event_bytes: int = DEFAULT,
        idempotency_key: bool = DEFAULT,
        retry_protocol_violations: bool = DEFAULT,
        retry_budget: Union[None, bool, Mapping[str, Any]] = DEFAULT,
        cooldowns: bool = DEFAULT,
        protocol: str = "auto",
        sse_terminal: Optional[Mapping[str, str]] = DEFAULT,
        resumable_sse: bool = False,
        alternates: Optional[Sequence[Any]] = None,
        context_window: Optional[int] = DEFAULT,
        on_event: Optional[Callable[[Event], Any]] = None,
        on_status: Optional[Callable[[str], Any]] = None,
        admission: Optional[Callable[[Event], Any]] = None,
        continuation: Union[None, str, Callable[[Mapping[str, Any]], Any]] = None,
        prefill_template: str = DEFAULT,
        cooldown_key: Optional[Callable[[str, str], str]] = None,
        _platform: Optional[Platform] = None,
    ) -> None:
        values = {
            "max_attempts": max_attempts,
            "attempts_per_target": attempts_per_target,
            "max_resumes": max_resumes,
            "budget_ms": budget_ms,
            "deadline_ms": deadline_ms,
            "backoff_base_ms": backoff_base_ms,
            "backoff_ceiling_ms": backoff_ceiling_ms,
            "retry_after_ceiling_ms": retry_after_ceiling_ms,
            "over_ceiling": over_ceiling,
            "head_timeout_ms": head_timeout_ms,
            "idle_timeout_ms": idle_timeout_ms,
            "progress_timeout_ms": progress_timeout_ms,
            "first_token_timeout_ms": first_token_timeout_ms,
            "hedge_after_ms": hedge_after_ms,
            "max_hedges": max_hedges,
            "retryable_statuses": retryable_statuses,
            "retryable_categories": retryable_categories,
            "endpoint": endpoint,
            "replay_body_cap": replay_body_cap,
            "holdback_cap": holdback_cap,
            "evidence_cap": evidence_cap,
            "max_event_bytes": max_event_bytes,
            "idempotency_key": idempotency_key,
            "retry_protocol_violations": retry_protocol_violations,
            "retry_budget": retry_budget,
            "cooldowns": cooldowns,
            "protocol": protocol,
            "sse_terminal": sse_terminal,
            "resumable_sse": resumable_sse,
            "context_window": context_window,
            "prefill_template": prefill_template,
        }
        hooks = {
            "on_event": on_event,
            "on_status": on_status,
            "admission": admission,
            "continuation": continuation,
            "cooldown_key": cooldown_key,
        }
        self._setup(transport, values, hooks, alternates, _platform)  # type: ignore[attr-defined]

    @property
    def policy(self) -> Mapping[str, Any]:
        """The policy in force: every knob of the policy table and its value
        (ms; ``"off"`` for a bound that is off), keywords that build it
        again."""
        return self._options.client.policy()  # type: ignore[attr-defined]
