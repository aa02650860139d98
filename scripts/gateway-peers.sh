#!/usr/bin/env bash
# recovery-gateway beside LiteLLM proxy (BENCHMARKS.md): the same loopback
# upstream (the fault provider) and the same load client (the `peers`
# example of recovery-gateway) against a direct connection, the gateway and
# LiteLLM proxy, in alternating rounds, with ratios to the direct
# connection. Not part of the test command: it installs LiteLLM from PyPI
# into target/peers-venv and takes a few minutes.
#
# Extra arguments go to the example: --streams N --throughput N
# --concurrency N --held N --rounds N --warmup N.
set -euo pipefail
cd "$(dirname "$0")/.."

# Pinned so the figures name what they measured. From 1.108 the `proxy`
# extra needs a separate package (litellm-proxy); 1.106.12 is the last
# release whose `proxy` extra installs the whole proxy from PyPI alone.
LITELLM_PIN="litellm[proxy]==1.106.12"
TARGET="${CARGO_TARGET_DIR:-target}"
VENV="target/peers-venv"
WORK="target/peers"

# Everything started here is killed on the way out, whatever the exit.
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in "${PIDS[@]}"; do
    # Bounded: a process that ignores SIGTERM for 10 s gets SIGKILL.
    for _ in $(seq 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.2
    done
    kill -9 "$pid" 2>/dev/null || true
  done
}
trap cleanup EXIT INT TERM

# Reads `listening http://IP:PORT` from the first line a process prints
# into FILE, within 30 s.
listening_url() {
  local file=$1 pid=$2 url=""
  for _ in $(seq 300); do
    url=$(sed -n '1s#^listening \(http://[0-9.:]*\).*#\1#p' "$file" 2>/dev/null || true)
    [ -n "$url" ] && { echo "$url"; return 0; }
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "gateway-peers: no listening line in $file" >&2
  cat "$file" >&2 || true
  return 1
}

# A free loopback port for LiteLLM, which takes no port 0: the kernel picks
# one, and it is released just before LiteLLM binds it.
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

echo "== build (release)"
nice cargo build --release -p recovery-gateway --bin recovery-gateway --example peers
nice cargo build --release -p recovery-tests --bin fault-provider

echo "== LiteLLM ($LITELLM_PIN) in $VENV"
mkdir -p target "$WORK"
if ! "$VENV/bin/python" -c 'import sys; from importlib.metadata import version; sys.exit(version("litellm") != sys.argv[1])' \
  "${LITELLM_PIN##*==}" 2>/dev/null; then
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  nice "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$LITELLM_PIN"
fi
LITELLM_VERSION=$("$VENV/bin/python" -c 'from importlib.metadata import version; print(version("litellm"))')
PYTHON_VERSION=$("$VENV/bin/python" -c 'import platform; print(platform.python_version())')
echo "litellm $LITELLM_VERSION, Python $PYTHON_VERSION"
echo "recovery-gateway $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . || echo ' (with uncommitted changes)')"

echo "== upstream: fault-provider"
"$TARGET/release/examples/peers" --print-script >"$WORK/script.json"
"$TARGET/release/fault-provider" --port 0 --script "$WORK/script.json" >"$WORK/provider.out" 2>&1 &
PROVIDER_PID=$!
PIDS+=("$PROVIDER_PID")
UPSTREAM=$(listening_url "$WORK/provider.out" "$PROVIDER_PID")
echo "$UPSTREAM"

echo "== recovery-gateway"
# The same store as the load figures (memory), and room for the held streams.
"$TARGET/release/recovery-gateway" --listen 127.0.0.1:0 --upstream "$UPSTREAM" \
  --stream-log memory --max-streams 5000 >"$WORK/gateway.out" 2>"$WORK/gateway.err" &
GATEWAY_PID=$!
PIDS+=("$GATEWAY_PID")
GATEWAY=$(listening_url "$WORK/gateway.out" "$GATEWAY_PID")
echo "$GATEWAY (pid $GATEWAY_PID)"

echo "== LiteLLM proxy"
# Two models, so the client picks the upstream path by model name as it
# picks it by path elsewhere. No retries, fallbacks or cooldowns of its own:
# every stream is one upstream request, as through the gateway.
cat >"$WORK/litellm.yaml" <<EOF
model_list:
  - model_name: fast
    litellm_params:
      model: openai/fast
      api_base: $UPSTREAM/fast/v1
      api_key: sk-loopback
  - model_name: held
    litellm_params:
      model: openai/held
      api_base: $UPSTREAM/held/v1
      api_key: sk-loopback
litellm_settings:
  telemetry: false
  num_retries: 0
  # Longer than the held streams stay open (up to two minutes through it).
  request_timeout: 300
router_settings:
  num_retries: 0
  disable_cooldowns: true
EOF
LITELLM_PORT=$(free_port)
# It refuses to start without a master key; a fresh random one per run.
LITELLM_KEY="sk-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
# No database (no DATABASE_URL), the bundled model price map instead of a
# download, its own telemetry off; one worker process, its default. Its
# upstream pool allows 500 connections per host by default, which would
# queue half of the held streams: raised, as the gateway's --max-streams is.
env -u DATABASE_URL LITELLM_MASTER_KEY="$LITELLM_KEY" LITELLM_LOCAL_MODEL_COST_MAP=True \
  LITELLM_TELEMETRY=False NO_DOCS=True \
  AIOHTTP_CONNECTOR_LIMIT=5000 AIOHTTP_CONNECTOR_LIMIT_PER_HOST=5000 \
  "$VENV/bin/litellm" --config "$WORK/litellm.yaml" --host 127.0.0.1 --port "$LITELLM_PORT" \
  >"$WORK/litellm.out" 2>&1 &
LITELLM_PID=$!
PIDS+=("$LITELLM_PID")
ready=""
for _ in $(seq 240); do
  if curl -sf --max-time 2 "http://127.0.0.1:$LITELLM_PORT/health/liveliness" >/dev/null; then
    ready=yes
    break
  fi
  kill -0 "$LITELLM_PID" 2>/dev/null || break
  sleep 0.5
done
if [ -z "$ready" ]; then
  echo "gateway-peers: LiteLLM did not become ready in 120 s" >&2
  tail -30 "$WORK/litellm.out" >&2
  exit 1
fi
echo "http://127.0.0.1:$LITELLM_PORT (pid $LITELLM_PID)"

echo "== rounds"
"$TARGET/release/examples/peers" --upstream "$UPSTREAM" \
  --target "direct=$UPSTREAM/{route}/v1/chat/completions" \
  --target "gateway=$GATEWAY/{route}/v1/chat/completions" --pid "gateway=$GATEWAY_PID" \
  --target "litellm=http://127.0.0.1:$LITELLM_PORT/v1/chat/completions" --pid "litellm=$LITELLM_PID" \
  --auth "litellm=$LITELLM_KEY" \
  "$@"
