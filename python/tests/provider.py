"""The loopback fault provider's control endpoint (``POST
/__fault/script?merge``, ``GET /__fault/count``), as the gateway's SDK tests
use it: each test loads scripts under a path prefix of its own."""

from __future__ import annotations

import json
import pathlib
import urllib.request

URL = ""
FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "tests" / "fixtures"
SSE = {"content-type": "text/event-stream"}


def control(method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"{URL}/__fault/{path}", data=data, method=method, headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        text = response.read().decode()
    return json.loads(text) if text else None


def load(paths):
    control("POST", "script?merge", {"paths": paths})


def sends(path):
    return control("GET", "count")["paths"].get(path, 0)


def fixture_bytes(name):
    return (FIXTURES / name).read_bytes()


def event_ends(data, sep=b"\n\n"):
    ends, start = [], 0
    while True:
        at = data.find(sep, start)
        if at < 0:
            return ends
        ends.append(at + len(sep))
        start = at + len(sep)
