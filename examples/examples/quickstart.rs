//! Quickstart: a streamed completion recovered through `RecoveryLayer` over the
//! embedded loopback fault provider.

fn main() {
    eprintln!(
        "quickstart: not built yet (it arrives with the tower driver); \
         run `bash scripts/test.sh` to exercise the engine"
    );
}
