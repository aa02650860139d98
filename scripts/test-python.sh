#!/usr/bin/env bash
# The Python package recovery-llm (python/) as a user gets it: the wheel
# built by `maturin build --release`, installed into a virtualenv at
# target/python-llm-venv with the pinned test dependencies from PyPI, then
# its tests run there: every conformance vector through the async
# transport on a virtual clock (checked by `conformance-js`), and the
# official SDKs (openai, anthropic) and legacy httpx in-process over the
# loopback fault provider. Idempotent: the venv is made again only when a
# pin changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PINS=(
  "maturin==1.16.0"
  "httpx2==2.16.2"
  "httpx==0.28.1"
  "openai==3.60.0"
  "anthropic==2.16.0"
  "anyio==4.16.0"
  "trio==0.35.0"
  "pytest==9.2.0"
)
VENV="target/python-llm-venv"
PY="$VENV/bin/python"
TARGET="${CARGO_TARGET_DIR:-target}"
case "$TARGET" in /*) ;; *) TARGET="$PWD/$TARGET" ;; esac

has_pinned() {
  [ -x "$PY" ] && "$PY" - "${PINS[@]}" <<'PYEOF' >/dev/null 2>&1
import sys
from importlib.metadata import version
sys.exit(0 if all(version(p.split("==")[0]) == p.split("==")[1] for p in sys.argv[1:]) else 1)
PYEOF
}

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

if ! has_pinned; then
  if ! command -v python3 >/dev/null 2>&1; then
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv
  fi
  rm -rf "$VENV"
  mkdir -p target
  if ! python3 -m venv "$VENV" >/dev/null 2>&1; then
    rm -rf "$VENV"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv
    python3 -m venv "$VENV"
  fi
  "$PY" -m pip install --quiet --disable-pip-version-check "${PINS[@]}"
  has_pinned || { echo "test-python: ${PINS[*]} did not all install" >&2; exit 1; }
fi

echo "== the wheel (maturin build --release)"
rm -rf "$TARGET/python-wheels"
"$VENV/bin/maturin" build --release --quiet --manifest-path python/Cargo.toml --out "$TARGET/python-wheels"
"$PY" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps "$TARGET"/python-wheels/recovery_llm-*.whl

echo "== the conformance tool and the fault provider"
cargo build --quiet -p recovery-tests --bin conformance-js --bin fault-provider

echo "== the package's tests (installed wheel)"
export PYTHONDONTWRITEBYTECODE=1
export RECOVERY_CONFORMANCE_TOOL="$TARGET/debug/conformance-js"
export RECOVERY_FAULT_PROVIDER="$TARGET/debug/fault-provider"
# From outside python/ so `import recovery_llm` is the installed wheel.
cd python/tests
"$OLDPWD/$PY" -c 'import recovery_llm, sys; assert "site-packages" in recovery_llm.__file__, recovery_llm.__file__'
"$OLDPWD/$PY" -m pytest -q -p no:cacheprovider .
