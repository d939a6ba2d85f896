//! Where the benches and `examples/soft_limits.rs` leave their numbers for
//! `plots/` (`cargo run --release -p kmemcg-plots`): small CSV files under
//! `<target dir>/kmemcg-results/`. Owned by the examples, included with
//! `#[path]` by the benches and the plots.
//! Writing one never fails the run: a problem is reported on stderr, and
//! stdout keeps only the tables.

use std::path::PathBuf;

/// The cargo target directory: `CARGO_TARGET_DIR` if set, else `target/`
/// in the workspace root: the nearest directory holding `Cargo.lock` from
/// the package's manifest directory up (cargo sets `CARGO_MANIFEST_DIR`
/// when it runs a target; the compile-time value covers a binary started
/// by hand), so the benches and the `plots` member agree.
pub fn target_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(dir);
    }
    let manifest =
        PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into()));
    let root = manifest.ancestors().find(|d| d.join("Cargo.lock").exists()).unwrap_or(&manifest);
    root.join("target")
}

/// `<target dir>/kmemcg-results/`.
pub fn dir() -> PathBuf {
    target_dir().join("kmemcg-results")
}

/// Writes `kmemcg-results/<name>`: the header line, then one line per row.
pub fn write_csv(name: &str, header: &str, rows: &[String]) {
    let path = dir().join(name);
    let mut text = String::with_capacity(64 * (rows.len() + 1));
    text.push_str(header);
    text.push('\n');
    for row in rows {
        text.push_str(row);
        text.push('\n');
    }
    match std::fs::create_dir_all(dir()).and_then(|()| std::fs::write(&path, text)) {
        Ok(()) => eprintln!("wrote {}", path.display()),
        Err(e) => eprintln!("could not write {}: {e}", path.display()),
    }
}
