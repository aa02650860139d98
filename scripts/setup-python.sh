#!/usr/bin/env bash
# The Python environment of the gateway's SDK tests: a virtualenv at
# target/python-venv with the official SDKs, pinned (openai, anthropic,
# google-genai, ollama, mistralai, groq). Idempotent: when the venv already
# has those versions it only prints the interpreter. Prints the
# interpreter's path as its last line.
set -euo pipefail
cd "$(dirname "$0")/.."

PINS=(
  "openai==3.57.0"
  "anthropic==2.16.0"
  "google-genai==3.6.1"
  "ollama==0.6.3"
  "mistralai==3.7.0"
  "groq==1.7.0"
)
VENV="target/python-venv"
PY="$VENV/bin/python"

has_pinned() {
  [ -x "$PY" ] && "$PY" - "${PINS[@]}" <<'PYEOF' >/dev/null 2>&1
import sys
from importlib.metadata import version
sys.exit(0 if all(version(p.split("==")[0]) == p.split("==")[1] for p in sys.argv[1:]) else 1)
PYEOF
}

if has_pinned; then
  echo "$PWD/$PY"
  exit 0
fi

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

if ! command -v python3 >/dev/null 2>&1; then
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv
fi

mkdir -p target
if ! python3 -m venv "$VENV" >/dev/null 2>&1; then
  # Debian's python3 ships venv's pip bootstrap separately.
  rm -rf "$VENV"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv
  python3 -m venv "$VENV"
fi
"$PY" -m pip install --quiet --disable-pip-version-check "${PINS[@]}"
has_pinned || { echo "setup-python: ${PINS[*]} did not all install" >&2; exit 1; }
echo "$PWD/$PY"
