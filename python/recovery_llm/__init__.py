"""Keeps streamed LLM responses whole when the network fails, in-process.

``RecoveringTransport`` (an ``httpx2.BaseTransport``) and
``AsyncRecoveringTransport`` (an ``httpx2.AsyncBaseTransport``, on anyio:
asyncio and trio) run each request through the Recovery engine, the same
sans-IO machine as the Rust layers, the gateway and the npm package::

    from recovery_llm import RecoveringTransport
    client = openai.OpenAI(max_retries=0, http_client=openai.DefaultHttpx2Client(transport=RecoveringTransport()))

A failure before the first token is replayed invisibly (or sent to an
alternate); an OpenAI Responses background stream, an SSE endpoint declared
resumable or a continuation hook continue a cut stream; anything else after
the first token ends the stream with ``RecoveryError``, never a silent short
answer. Legacy ``httpx``: ``recovery_llm.httpx``.
"""

from __future__ import annotations

from typing import Any, Optional

import httpx2

from . import _machine
from ._api import Configured
from ._shell import AsyncShell, RecoveryErrorMixin, ReportView, SyncShell, UnsupportedOptionError

__all__ = [
    "AsyncRecoveringTransport",
    "RecoveringTransport",
    "RecoveryError",
    "ReportView",
    "UnsupportedOptionError",
    "protocols",
    "__version__",
]

__version__ = "0.1.0"


class RecoveryError(RecoveryErrorMixin, httpx2.ReadError):
    """A logical request that did not complete.

    Raised from the response stream after the first byte reached the caller,
    or from the send when no response could be given. A ``ReadError``, so an
    SDK raises its own connection error from it (``openai.APIConnectionError``,
    ``anthropic.APIConnectionError``) with this as its ``__cause__``.

    ``outcome``: the typed outcome (``{"outcome": "interrupted", "cause": ...,
    "committed": true, ...}``); ``report``: the whole report (attempts,
    delays, delivered progress, the outcome); ``committed``: whether a
    response had reached the caller. Neither carries body text, header
    values or credentials.
    """

    def __init__(self, message: str, *, request: Optional[httpx2.Request] = None) -> None:
        super().__init__(message, request=request)
        self.outcome: Optional[dict] = None
        self.report: dict = {}
        self.committed = False


class RecoveringTransport(Configured, SyncShell, httpx2.BaseTransport):
    __doc__ = Configured.__doc__
    _http: Any = httpx2
    _error: Any = RecoveryError


class AsyncRecoveringTransport(Configured, AsyncShell, httpx2.AsyncBaseTransport):
    __doc__ = Configured.__doc__
    _http: Any = httpx2
    _error: Any = RecoveryError


def protocols() -> list:
    """The names the ``protocol`` option takes."""
    return list(_machine.protocols())
