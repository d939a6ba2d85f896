//! One case of a test binary run in a child process: the binary again,
//! running only its `run_case` test with `var` set to the case's name, so
//! a case that crashes or aborts fails its test instead of killing the
//! whole binary. Shared by the integration tests that include it with
//! `#[path = "support/child.rs"] mod child;`.

use std::process::{Command, Output};

/// The child's output for `case`.
pub fn output(var: &str, case: &str) -> Output {
    let exe = std::env::current_exe().unwrap();
    Command::new(exe).args(["--exact", "run_case", "--nocapture", "--test-threads=1"]).env(var, case).output().unwrap()
}

/// Whether the child for `case` succeeded, and its standard error.
#[allow(dead_code)] // tests that need the exit status itself use `output`
pub fn run(var: &str, case: &str) -> (bool, String) {
    let out = output(var, case);
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}
