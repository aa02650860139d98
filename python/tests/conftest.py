"""Fixtures of the package's tests: the loopback fault provider (the
``fault-provider`` binary of the tests crate, ``RECOVERY_FAULT_PROVIDER``),
started once on 127.0.0.1 port 0 and stopped at the end."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import provider  # noqa: E402


@pytest.fixture(scope="session")
def fault_provider():
    binary = os.environ.get("RECOVERY_FAULT_PROVIDER", "fault-provider")
    proc = subprocess.Popen([binary, "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().strip()
        if not line.startswith("listening "):
            raise RuntimeError(f"fault-provider did not start: {line!r} {proc.stderr.read()}")
        provider.URL = line.split(" ", 1)[1].rstrip("/")
        yield provider.URL
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request):
    return request.param


def pytest_configure(config):
    config.addinivalue_line("markers", "sdk: a real SDK over the fault provider")
    time.monotonic()
