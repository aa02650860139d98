"""The loopback fault provider's control endpoint, for the SDK tests.

Each test loads scripts under a path prefix of its own (merged with
``POST /__fault/script?merge``) and reads the provider's counters after.
Environment: ``RECOVERY_GATEWAY_URL`` and ``FAULT_PROVIDER_URL`` (set by
``scripts/test-gateway-sdks.sh``).
"""

import json
import os
import pathlib
import urllib.error
import urllib.request

GATEWAY = os.environ["RECOVERY_GATEWAY_URL"].rstrip("/")
PROVIDER = os.environ["FAULT_PROVIDER_URL"].rstrip("/")
FIXTURES = pathlib.Path(__file__).resolve().parents[3] / "tests" / "fixtures"
SSE = {"content-type": "text/event-stream"}
NDJSON = {"content-type": "application/x-ndjson"}
COMMENTS = ": keepalive\n\n: OPENROUTER PROCESSING\n\n"


def control(method, path, body=None):
    """A call to the provider's control endpoint; its JSON answer."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"{PROVIDER}/__fault/{path}",
        data=data,
        method=method,
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        text = response.read().decode()
    return json.loads(text) if text else None


def load(paths):
    """Adds (or replaces) the scripts of these paths, counters kept."""
    control("POST", "script?merge", {"paths": paths})


def sends(path):
    """How many requests the provider received on `path`."""
    return control("GET", "count")["paths"].get(path, 0)


def received(path):
    """The requests the provider received on `path`, in order."""
    return [r for r in control("GET", "requests") if r["target"].split("?")[0] == path]


def chunk(cid, delta, finish=None):
    """An OpenAI Chat stream chunk `cid` carrying `delta`, as an SSE event."""
    data = {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n"


def fixture_bytes(name):
    return (FIXTURES / name).read_bytes()


def event_ends(data, sep=b"\n\n"):
    """Offsets just past each event (SSE blank line, or NDJSON line)."""
    ends, start = [], 0
    while True:
        at = data.find(sep, start)
        if at < 0:
            return ends
        ends.append(at + len(sep))
        start = at + len(sep)


def gateway_get(path, headers):
    """A GET to the gateway: (status, headers, body bytes)."""
    request = urllib.request.Request(f"{GATEWAY}{path}", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def gateway_post(path, headers, body):
    """A POST to the gateway read whole: (status, headers, body bytes)."""
    request = urllib.request.Request(
        f"{GATEWAY}{path}",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", **headers},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()
