"""The connection cuts a test's requests left behind: timer threads of
``SocketWatch`` still alive. Counted by kind, not as all the process's
threads: threads of other tests (a connection pool's, a reader of the
fault provider's output) come and go meanwhile."""

from __future__ import annotations

import threading

from recovery_llm._shell import SocketWatch


def cut_timers() -> list:
    """The live timer threads of connection cuts."""
    return [
        t
        for t in threading.enumerate()
        if isinstance(getattr(getattr(t, "function", None), "__self__", None), SocketWatch)
    ]
