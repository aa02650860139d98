"""Every engine conformance vector (tests/conformance/engine/*.json) through
AsyncRecoveringTransport and RecoveringTransport on a virtual clock,
checked by the same expectations as the engine's, the tower and the npm
runners."""

import pytest

import conformance_sync
from conformance import check, prepared, run_one

VECTORS = prepared()

# Vectors the transport cannot run yet, each with why; each must still fail
# (strict), so the list cannot outlive the gap. None today.
NOT_YET: dict = {}


def marked(v):
    reason = NOT_YET.get(v["name"])
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    return pytest.param(v, id=v["name"], marks=marks)


def test_there_are_vectors():
    assert len(VECTORS) >= 60, len(VECTORS)


@pytest.mark.parametrize("v", [marked(v) for v in VECTORS])
def test_vector(v):
    ok, output = check([run_one(v)])
    assert ok, output


# Far beyond any vector's run: hedging on, but no hedge is ever due.
NEVER_MS = 10**9


@pytest.mark.parametrize("v", [marked(v) for v in VECTORS if "hedgeAfterMs" not in v["options"]])
def test_vector_read_as_a_race_reads(v):
    """The vector with hedging on and never due: every attempt before its
    response is read as a race reads it (in a task of its own, a wait at
    the machine's deadline cutting no read), to the same expectations."""
    ok, output = check([run_one({**v, "options": {**v["options"], "hedgeAfterMs": NEVER_MS}})])
    assert ok, output


def test_the_runner_can_fail_another_jitter_does_not_match():
    v = next(x for x in VECTORS if x["name"] == "503_then_success")
    assert check([run_one(v)])[0]
    ok, output = check([run_one({**v, "jitter": 1.0})])
    assert not ok
    assert "delays_ms" in output


SYNC = [v for v in VECTORS if conformance_sync.unsupported(v) is None]

# Vectors the sync transport does not meet yet, each marked strictly.
SYNC_NOT_YET: dict = {}


def sync_marked(v):
    reason = SYNC_NOT_YET.get(v["name"])
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    return pytest.param(v, id=v["name"], marks=marks)


def test_the_sync_transport_runs_all_but_what_it_refuses():
    """Left out: hedging (refused) and admission answers a call cannot
    give (pending); everything else runs."""
    left_out = {v["name"]: conformance_sync.unsupported(v) for v in VECTORS if v not in SYNC}
    assert len(SYNC) >= 60, left_out
    assert all(n.startswith(("hg", "at5_", "cancel_during_admission")) for n in left_out), left_out


def test_the_sync_runner_can_fail_another_jitter_does_not_match():
    v = next(x for x in SYNC if x["name"] == "503_then_success")
    assert check([conformance_sync.run_one(v)])[0]
    ok, output = check([conformance_sync.run_one({**v, "jitter": 1.0})])
    assert not ok
    assert "delays_ms" in output


@pytest.mark.parametrize("v", [sync_marked(v) for v in SYNC])
def test_vector_through_the_sync_transport(v):
    """The vector through RecoveringTransport: the same expectations as
    every other runner's."""
    ok, output = check([conformance_sync.run_one(v)])
    assert ok, output


def test_the_sync_body_ends_at_the_drain_after_proof_not_at_the_read_timeout():
    """at8: terminal proof, then a body that never ends. Its reads were
    given the 30 s quiet window as their timeout; the machine gives what
    follows proof a 1 s drain (and a read one more second of slack), so
    the consumer's iteration ends there, as in every other driver."""
    v = next(x for x in SYNC if x["name"] == "at8_stall_after_terminal_proof_completes")
    assert v["options"]["idleTimeoutMs"] == 30_000, v["options"]
    run = conformance_sync.Run(v)
    ok, output = check([conformance_sync.run_one(v, run)])
    assert ok, output
    assert run.body_ended_at is not None
    assert run.body_ended_at <= 2.0, run.body_ended_at
