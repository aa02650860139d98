//! The built example binaries, and the shared helpers that run them.

use std::path::{Path, PathBuf};

pub use recovery_tests::process::*;

/// The example binary `name`, built by `cargo test` next to the test binary:
/// `<target>/<profile>/deps/<test>` → `<target>/<profile>/examples/<name>`.
/// When only this test target was built (`cargo test --test ...`), the
/// examples are built first with the same cargo and profile.
pub fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/<test>");
    let path = profile_dir
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    if !path.exists() {
        build_examples(profile_dir);
    }
    assert!(
        path.exists(),
        "{} is missing: examples are built by `cargo test -p recovery-examples` \
         (or `cargo build -p recovery-examples --examples`)",
        path.display()
    );
    path
}

fn build_examples(profile_dir: &Path) {
    static BUILD: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _once = BUILD
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = std::process::Command::new(cargo);
    cmd.args(["build", "-p", "recovery-examples", "--examples"])
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    if let Some(target) = profile_dir.parent() {
        cmd.env("CARGO_TARGET_DIR", target);
    }
    if profile_dir.file_name().is_some_and(|p| p == "release") {
        cmd.arg("--release");
    }
    let status = cmd.status().expect("run cargo build --examples");
    assert!(status.success(), "cargo build --examples failed");
}
