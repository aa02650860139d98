#!/usr/bin/env bash
# Packages recovery-core and tower-recovery as crates.io would get them, then
# runs `cargo test` inside each unpacked .crate, outside the workspace: the
# fixtures and vectors the tests read must travel with the package.
# tower-recovery's recovery-core dependency resolves to the unpacked
# recovery-core (it is not on crates.io from here).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

# recovery-redis too: tower-recovery's optional `redis` feature names it, so
# its lockfile must resolve it (to the unpacked one, as recovery-core).
cargo package -p recovery-core -p tower-recovery -p recovery-redis --allow-dirty --no-verify

# A fixed directory outside the workspace: the test binaries, cached in
# CARGO_TARGET_DIR, keep the path the fixtures were found at.
work="${TMPDIR:-/tmp}/recovery-package-check"
rm -rf "$work"
mkdir -p "$work"
for c in recovery-core tower-recovery recovery-redis; do
  tar -xzf "${CARGO_TARGET_DIR:-target}/package/$c-0.1.0.crate" -C "$work"
done
export CARGO_TARGET_DIR="$root/target/package-check"
# Paths are compiled into the tests (CARGO_MANIFEST_DIR): rebuild the two
# crates themselves, keep their dependencies.
(cd "$work/recovery-core-0.1.0" && cargo clean -p recovery-core -q)

echo "== cargo test inside the unpacked recovery-core"
(cd "$work/recovery-core-0.1.0" && cargo test --all-features)
echo "== cargo test inside the unpacked tower-recovery"
(cd "$work/tower-recovery-0.1.0" && cargo test \
  --config "patch.crates-io.recovery-core.path=\"$work/recovery-core-0.1.0\"" \
  --config "patch.crates-io.recovery-redis.path=\"$work/recovery-redis-0.1.0\"")
