#!/usr/bin/env bash
# Idempotent machine setup for the wasm package and its tests: the wasm32
# target, wasm-bindgen-cli at exactly the version in Cargo.lock (only when
# missing or different: building it takes ~7 minutes), Debian's chromium
# (only when missing; Playwright drives it), and the npm dev tools from the
# lockfile.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

if ! rustup target list --installed | grep -qx wasm32-unknown-unknown; then
  rustup target add wasm32-unknown-unknown
fi

WBG=$(awk '/^name = "wasm-bindgen"$/ {getline; gsub(/"/, "", $3); print $3}' Cargo.lock)
if [ -z "$WBG" ]; then
  echo "setup-wasm: no wasm-bindgen in Cargo.lock" >&2
  exit 1
fi
if [ "$(wasm-bindgen --version 2>/dev/null || true)" != "wasm-bindgen $WBG" ]; then
  # Exact version; not --locked (the CLI's lockfile pins a crate version the
  # registry here does not serve).
  cargo install wasm-bindgen-cli --version "$WBG"
fi

if ! command -v chromium >/dev/null; then
  $SUDO apt-get update
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y chromium
fi

if [ ! -d wasm/node_modules ] || [ wasm/package-lock.json -nt wasm/node_modules/.package-lock.json ]; then
  npm ci --prefix wasm --no-audit --no-fund
fi
