"""The recovering transports for legacy ``httpx`` (LangChain and other code
still on it): the same options and behaviour as ``recovery_llm``'s, over
``httpx.BaseTransport`` and ``httpx.AsyncBaseTransport``::

    import httpx
    from recovery_llm.httpx import RecoveringTransport
    client = httpx.Client(transport=RecoveringTransport())
"""

from __future__ import annotations

from typing import Any, Optional

import httpx

from ._api import Configured
from ._shell import AsyncShell, RecoveryErrorMixin, SyncShell, UnsupportedOptionError

__all__ = ["AsyncRecoveringTransport", "RecoveringTransport", "RecoveryError", "UnsupportedOptionError"]


class RecoveryError(RecoveryErrorMixin, httpx.ReadError):
    """``recovery_llm.RecoveryError`` for legacy httpx: an ``httpx.ReadError``
    with ``outcome``, ``report`` and ``committed``."""

    def __init__(self, message: str, *, request: Optional[httpx.Request] = None) -> None:
        super().__init__(message, request=request)
        self.outcome: Optional[dict] = None
        self.report: dict = {}
        self.committed = False


class RecoveringTransport(Configured, SyncShell, httpx.BaseTransport):
    __doc__ = Configured.__doc__
    _http: Any = httpx
    _error: Any = RecoveryError


class AsyncRecoveringTransport(Configured, AsyncShell, httpx.AsyncBaseTransport):
    __doc__ = Configured.__doc__
    _http: Any = httpx
    _error: Any = RecoveryError
