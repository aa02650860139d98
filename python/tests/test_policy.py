"""The policy spec through the Python keywords: the cases of
tests/conformance/policy/knobs.json (the same file the gateway, recover,
the npm package and the vectors are held to) build the same policy here,
with "off" or None turning a bound off, and a refused spec fails with the
same words."""

from __future__ import annotations

import inspect
import json
import os

import pytest

from recovery_llm import AsyncRecoveringTransport, RecoveringTransport, UnsupportedOptionError, _machine
from recovery_llm._api import Configured

KNOBS_FILE = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "conformance", "policy", "knobs.json")
with open(KNOBS_FILE, encoding="utf-8") as f:
    KNOBS = json.load(f)

FIELDS = _machine.policy_fields()


def expected(changes: dict) -> dict:
    return {**KNOBS["defaults"], **changes}


def test_the_policy_keywords_are_the_policy_table():
    """Every knob of the table is a keyword of the transports, in the
    table's order, and no other keyword is a knob."""
    names = [f[0] for f in FIELDS]
    params = list(inspect.signature(Configured.__init__).parameters)
    assert [p for p in params if p in names] == names
    assert len(names) == len(KNOBS["defaults"]) and set(names) == set(KNOBS["defaults"])


def hedges(case: dict) -> bool:
    return expected(case["policy"])["hedge_after_ms"] != "off"


@pytest.mark.parametrize("case", KNOBS["cases"], ids=lambda c: json.dumps(c["spec"]))
def test_one_spec_builds_one_policy(case):
    t = AsyncRecoveringTransport(**case["spec"])
    assert t.policy == expected(case["policy"])
    if hedges(case):
        # The sync transports do not hedge: they refuse the spec that does.
        with pytest.raises(UnsupportedOptionError, match="hedge_after_ms"):
            RecoveringTransport(**case["spec"])
    else:
        assert RecoveringTransport(**case["spec"]).policy == expected(case["policy"])


@pytest.mark.parametrize("case", [c for c in KNOBS["cases"] if "off" in c["spec"].values()])
def test_none_is_off_as_off_is(case):
    spec = {k: (None if v == "off" else v) for k, v in case["spec"].items()}
    t = AsyncRecoveringTransport(**spec)
    assert t.policy == expected(case["policy"])


@pytest.mark.parametrize("refused", KNOBS["refused"], ids=lambda r: json.dumps(r["spec"]))
@pytest.mark.parametrize("kind", [RecoveringTransport, AsyncRecoveringTransport], ids=["sync", "async"])
def test_a_refused_spec_fails_with_the_same_words(refused, kind):
    with pytest.raises(ValueError) as e:
        kind(**refused["spec"])
    assert not isinstance(e.value, UnsupportedOptionError)
    assert str(e.value) == f"invalid recovery policy: {refused['error']}"


def test_a_value_of_the_wrong_type_is_a_type_error():
    for kw in ({"max_attempts": "3"}, {"max_attempts": None}, {"idempotency_key": 1}, {"endpoint": 1},
               {"retryable_statuses": "503"}, {"idle_timeout_ms": True}):
        with pytest.raises(TypeError):
            RecoveringTransport(**kw)
    with pytest.raises(ValueError, match="got 1.5"):
        RecoveringTransport(budget_ms=1.5)
    assert RecoveringTransport(budget_ms=300.0).policy["budget_ms"] == 300
