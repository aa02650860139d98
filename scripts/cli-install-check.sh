#!/usr/bin/env bash
# `recover` as a user gets it: `cargo install --path cli`, then
# `recover --version` and one recovered stream against the standalone
# loopback fault provider (503 with Retry-After, a reset before the head,
# then the stream).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
export CARGO_TARGET_DIR="$root/target"
prefix="$root/target/cli-install"

cargo install --quiet --locked --path cli --root "$prefix" --force
recover="$prefix/bin/recover"

version=$("$recover" --version)
[ "$version" = "recover $(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)" ] || {
  echo "recover --version printed: $version" >&2
  exit 1
}
echo "$version"

cargo build --quiet -p recovery-tests --bin fault-provider
work=$(mktemp -d)
cleanup() {
  [ -n "${provider_pid:-}" ] && kill "$provider_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
cat >"$work/script.json" <<'JSON'
[
  {"status": 503, "headers": {"retry-after-ms": "50", "content-type": "application/json"}, "body": ["{\"error\":{\"type\":\"overloaded\"}}"]},
  {"ending": "reset_before_head"},
  {"headers": {"content-type": "text/event-stream"}, "body": [{"fixture": "openai-chat/happy-usage.sse"}]}
]
JSON
"$root/target/debug/fault-provider" --port 0 --script "$work/script.json" >"$work/provider.out" 2>"$work/provider.err" &
provider_pid=$!
for _ in $(seq 1 100); do
  grep -q '^listening ' "$work/provider.out" 2>/dev/null && break
  sleep 0.1
done
url=$(sed -n 's/^listening //p' "$work/provider.out")
[ -n "$url" ] || { cat "$work/provider.err" >&2; exit 1; }

echo '{"model":"m","stream":true,"messages":[{"role":"user","content":"Hi"}]}' |
  "$recover" --protocol openai-chat --events "$work/events.jsonl" --report "$work/report.json" \
    "$url/v1/chat/completions" >"$work/out.sse"
cmp "$work/out.sse" tests/fixtures/openai-chat/happy-usage.sse
grep -q '"event":"completed"' "$work/events.jsonl"
[ "$(grep -c '"event":"attempt_started"' "$work/events.jsonl")" = 3 ]
echo "installed recover: a stream recovered after a 503 and a reset, byte for byte"
