//! Embeds the shared conformance vectors (`tests/conformance/engine/*.json`)
//! for the wasm-bindgen tests, which have no file system at run time: writes
//! `$OUT_DIR/engine_vectors.rs`, a sorted `(file name, contents)` table of
//! `include_str!`s, so a vector added to the folder is run without editing
//! the tests.

use std::fmt::Write as _;
use std::path::PathBuf;

fn main() {
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("manifest dir"))
        .join("../tests/conformance/engine");
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    let mut out = String::from(
        "/// The engine conformance vectors: `(file name, JSON text)`, sorted.\n\
         pub const ENGINE_VECTORS: &[(&str, &str)] = &[\n",
    );
    for path in &files {
        let canonical = path.canonicalize().expect("vector path");
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .expect("UTF-8 name");
        let _ = writeln!(
            out,
            "    ({name:?}, include_str!({:?})),",
            canonical.display().to_string()
        );
    }
    out.push_str("];\n");
    let target =
        PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR")).join("engine_vectors.rs");
    std::fs::write(target, out).expect("write the vector table");
}
