#!/usr/bin/env bash
# The gateway under the official SDKs: Python (openai, anthropic,
# google-genai, ollama, mistralai, groq; the venv of scripts/setup-python.sh)
# and JS (openai, @anthropic-ai/sdk, @google/genai; gateway/tests/js, pinned
# by its package-lock). Builds recovery-gateway and the fault provider,
# starts both on 127.0.0.1 (port 0), runs gateway/tests/python and
# gateway/tests/js against them, stops both.
# Exits non-zero when a test fails or the gateway does not stop cleanly.
set -euo pipefail
cd "$(dirname "$0")/.."

PY="target/python-venv/bin/python"
[ -x "$PY" ] || { echo "run scripts/setup-python.sh first" >&2; exit 2; }
JS="gateway/tests/js"
if [ ! -d "$JS/node_modules" ] || [ "$JS/package-lock.json" -nt "$JS/node_modules/.package-lock.json" ]; then
  npm ci --prefix "$JS" --no-audit --no-fund --loglevel=error
fi

cargo build -p recovery-gateway -p recovery-tests --bin recovery-gateway --bin fault-provider
BIN="${CARGO_TARGET_DIR:-target}/debug"

work="$(mktemp -d)"
provider_pid=""
gateway_pid=""
rescue_pid=""
hedge_pid=""
cleanup() {
  for pid in "$gateway_pid" "$rescue_pid" "$hedge_pid" "$provider_pid"; do
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
    fi
  done
  rm -rf "$work"
}
trap cleanup EXIT

# The URL of a server's first stdout line `listening URL`, within 20 s.
first_url() {
  local out="$1" pid="$2" line
  for _ in $(seq 200); do
    line="$(head -n 1 "$out" 2>/dev/null || true)"
    if [[ "$line" == listening\ * ]]; then
      echo "${line#listening }"
      return 0
    fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  return 1
}

"$BIN/fault-provider" --port 0 >"$work/provider.out" 2>"$work/provider.err" &
provider_pid=$!
provider_url="$(first_url "$work/provider.out" "$provider_pid")" || {
  echo "fault-provider did not start:" >&2; cat "$work/provider.err" >&2; exit 1; }

# Every SDK case that recovers spends a retry: the suite runs them back to
# back, so the shared retry budget gets a larger reserve than the default.
# The body cap is 8 MiB, so that a file of 9 MiB shows an upload streams.
cat >"$work/gateway.toml" <<'TOML'
max_body_bytes = 8388608
[retry_budget]
min_retries_per_sec = 100
TOML

"$BIN/recovery-gateway" --listen 127.0.0.1:0 --upstream "$provider_url" --config "$work/gateway.toml" \
  >"$work/gateway.out" 2>"$work/gateway.err" &
gateway_pid=$!
gateway_url="$(first_url "$work/gateway.out" "$gateway_pid")" || {
  echo "recovery-gateway did not start:" >&2; cat "$work/gateway.err" >&2; exit 1; }

# A second gateway for the rescues after the first token: its alternate
# continues a prefill, under the baseline policy (three sends, 30 s head
# timeout, 10 s idle timeout).
rescue_alt="/rescue-alt/v1/chat/completions"
cat >"$work/rescue.toml" <<TOML
[retry_budget]
min_retries_per_sec = 100

[policy]
max_attempts = 3
head_timeout_ms = 30000
idle_timeout_ms = 10000

[[alternates]]
label = "prefill"
protocol = "openai-chat"
url = "$provider_url$rescue_alt"
continuation = "prefill"
TOML
"$BIN/recovery-gateway" --listen 127.0.0.1:0 --upstream "$provider_url" --config "$work/rescue.toml" \
  >"$work/rescue.out" 2>"$work/rescue.err" &
rescue_pid=$!
rescue_url="$(first_url "$work/rescue.out" "$rescue_pid")" || {
  echo "recovery-gateway (rescue) did not start:" >&2; cat "$work/rescue.err" >&2; exit 1; }

# A third gateway hedging the first token: at 1 s without a token, a
# second send races the first, to its alternate.
hedge_alt="/hedge-alt/v1/chat/completions"
cat >"$work/hedge.toml" <<TOML
[retry_budget]
min_retries_per_sec = 100

[policy]
max_attempts = 3
hedge_after_ms = 1000

[[alternates]]
label = "alt"
protocol = "openai-chat"
url = "$provider_url$hedge_alt"
TOML
"$BIN/recovery-gateway" --listen 127.0.0.1:0 --upstream "$provider_url" --config "$work/hedge.toml" \
  >"$work/hedge.out" 2>"$work/hedge.err" &
hedge_pid=$!
hedge_url="$(first_url "$work/hedge.out" "$hedge_pid")" || {
  echo "recovery-gateway (hedge) did not start:" >&2; cat "$work/hedge.err" >&2; exit 1; }

echo "fault provider: $provider_url"
echo "gateway:        $gateway_url"
echo "rescue gateway: $rescue_url"

status=0
export PYTHONDONTWRITEBYTECODE=1
RECOVERY_GATEWAY_URL="$gateway_url" FAULT_PROVIDER_URL="$provider_url" \
  RECOVERY_RESCUE_GATEWAY_URL="$rescue_url" RECOVERY_RESCUE_ALT_PATH="$rescue_alt" \
  RECOVERY_HEDGE_GATEWAY_URL="$hedge_url" RECOVERY_HEDGE_ALT_PATH="$hedge_alt" \
  "$PY" -m unittest discover -s gateway/tests/python -v || status=$?
(cd "$JS" && RECOVERY_GATEWAY_URL="$gateway_url" FAULT_PROVIDER_URL="$provider_url" \
  node --test) || status=$?

if [ "$status" -ne 0 ]; then
  echo "--- gateway log (last 60 lines)" >&2
  tail -n 60 "$work/gateway.err" >&2 || true
fi

# SIGTERM: the gateway exits 0.
kill -TERM "$gateway_pid"
gateway_status=0
wait "$gateway_pid" || gateway_status=$?
gateway_pid=""
if [ "$gateway_status" -ne 0 ]; then
  echo "recovery-gateway exited $gateway_status after SIGTERM (expected 0)" >&2
  [ "$status" -ne 0 ] || status=1
fi
exit "$status"
