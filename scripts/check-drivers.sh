#!/usr/bin/env bash
# Drivers only do I/O (ARCHITECTURE.md, "What a driver may do"): no driver
# module reaches core's decision internals. A driver talks to core through
# the request's machine (`exchange`), the observer an ObserveLayer feeds
# (`observer`), the evidence types it fills (`failure`), and the
# configuration and report types users pass in and read.
set -euo pipefail
cd "$(dirname "$0")/.."

# Modules and functions that decide; a driver that names them decides on its own.
internals='decision|engine|retry_after|backoff|watchdog|wait'
deciders='resume::(plan|plan_at|may_resume|native_resume)|protocol::(classify_error_body|partial_body_may_be_semantic)|budget::RetryPermit'
pattern="recovery_core::((${internals})\\b|${deciders}\\b)|recovery_core::\\{[^}]*\\b(${internals})\\b"

# The code of a file before its test module.
code() { awk '/^#\[cfg\(test\)\]/ { exit } { print }' "$1"; }

# The check must be able to fail.
for bad in 'use recovery_core::decision::decide;' 'use recovery_core::{engine::Recovery, policy};' \
  'let p = recovery_core::resume::plan(&k, false, b, &c);'; do
  if ! grep -qE "$pattern" <<<"$bad"; then
    echo "check-drivers: the pattern misses: $bad" >&2
    exit 1
  fi
done

status=0
for f in $(find tower-layer/src wasm/src python/src reqwest-recovery/src redis-store/src gateway/src -name '*.rs' | sort); do
  if hits=$(code "$f" | grep -nE "$pattern"); then
    echo "$f: a driver uses core's decision internals:" >&2
    echo "$hits" >&2
    status=1
  fi
done
if [ "$status" -eq 0 ]; then
  echo "drivers reach core only through the machine and the configuration types"
fi
exit "$status"
