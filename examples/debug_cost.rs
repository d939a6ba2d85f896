//! Run with: `cargo run --release --example debug_cost [ROUNDS]`
//!
//! What kmemcg costs a test binary (issue 16, "Measure"): the threaded std
//! workload of `support/testbin_workload.rs`, built as `testbin_system`
//! (`std::alloc::System`, glibc malloc) and `testbin_kmemcg` (kmemcg as the
//! global allocator), in four builds:
//!
//! * `dev`: opt-level 0, what `cargo build` and `cargo run` use (and
//!   `cargo test` in a crate that does not raise `[profile.test]`);
//! * `dev+o1`: a user's `dev` build that adds
//!   `[profile.dev.package.kmemcg] opt-level = 1` (the README's advice):
//!   the two binaries as a separate crate that depends on kmemcg, generated
//!   under `debug-cost/downstream/` in the target directory, so only
//!   kmemcg is built at opt-level 1 and the workload stays at 0;
//! * `test`: this workspace's `[profile.test]`, opt-level 1, what
//!   `cargo test` builds the test binaries *and* the kmemcg library with;
//! * `release`.
//!
//! The targets are kmemcg at most 1.5x System in a debug build and
//! at most 1.0x in release; they are measured here, never asserted.
//!
//! The driver builds both binaries in each build with `cargo build`
//! (honouring `CARGO_TARGET_DIR`), copies them out of the target directory
//! (`dev` and `test` both write `target/debug/examples/`) into
//! `debug-cost/<build>/` under it, runs each once untimed, then runs them
//! `ROUNDS` times (default 7), interleaved: every round runs System then
//! kmemcg in every profile. Each binary prints the milliseconds its
//! workload took (thread spawn to join and drop); the driver also times the
//! whole process. It prints each sample to stderr and two markdown tables
//! to stdout: the ratio of the medians, and the median of the rounds' own
//! ratios (System and kmemcg run back to back, so on a shared machine a
//! round's ratio sees much the same load on both).

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// A build to measure.
struct Profile {
    /// The build's name in the tables and under `debug-cost/`.
    name: &'static str,
    /// The cargo profile, as `cargo build --profile` takes it.
    profile: &'static str,
    /// The directory under the target directory that cargo writes it to.
    dir: &'static str,
    /// The opt-levels of the workload and of kmemcg, for the table.
    opt_level: &'static str,
    /// `Some(level)`: build the binaries as a downstream crate whose
    /// `Cargo.toml` sets kmemcg's opt-level to `level`.
    downstream: Option<&'static str>,
}

/// The builds, in the order they are run in each round.
const PROFILES: [Profile; 4] = [
    Profile { name: "dev", profile: "dev", dir: "debug", opt_level: "0", downstream: None },
    Profile { name: "dev+o1", profile: "dev", dir: "debug", opt_level: "0, kmemcg 1", downstream: Some("1") },
    Profile { name: "test", profile: "test", dir: "debug", opt_level: "1", downstream: None },
    Profile { name: "release", profile: "release", dir: "release", opt_level: "3", downstream: None },
];

/// The two binaries: System first, as each round runs them.
const BINARIES: [&str; 2] = ["testbin_system", "testbin_kmemcg"];

/// Rounds unless the first argument says otherwise.
const ROUNDS: usize = 7;

/// One timed run: the workload's own milliseconds and the process's.
#[derive(Clone, Copy)]
struct Sample {
    /// What the binary printed: spawning its threads to joining them.
    workload_ms: f64,
    /// Spawning the process to its exit, as the driver saw it.
    process_ms: f64,
}

/// The target directory cargo builds into: `CARGO_TARGET_DIR` (relative to
/// the current directory, as cargo takes it) or the workspace's `target/`.
fn target_dir() -> PathBuf {
    match env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => env::current_dir().expect("the current directory").join(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("target"),
    }
}

/// Writes a crate under `dir` that depends on this one by path and builds
/// the two example binaries' sources as its own binaries, with kmemcg's
/// opt-level set to `level` in its `dev` profile (the workspace's lock
/// file is copied, so it resolves the same dependency versions).
fn downstream_crate(dir: &Path, level: &str) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let bins: String = BINARIES
        .iter()
        .map(|b| format!("[[bin]]\nname = \"{b}\"\npath = {:?}\n\n", root.join("examples").join(format!("{b}.rs"))))
        .collect();
    let manifest = format!(
        "[package]\nname = \"debug-cost-downstream\"\nversion = \"0.0.0\"\nedition = \"2024\"\npublish = false\n\n\
         [workspace]\n\n[dependencies]\nkmemcg = {{ path = {:?} }}\n\n{bins}\
         [profile.dev.package.kmemcg]\nopt-level = {level}\n",
        root
    );
    std::fs::create_dir_all(dir).expect("the downstream directory can be created");
    std::fs::write(dir.join("Cargo.toml"), manifest).expect("the downstream manifest can be written");
    std::fs::copy(root.join("Cargo.lock"), dir.join("Cargo.lock")).expect("the lock file can be copied");
}

/// Builds both binaries in `profile` and copies them to `out`.
fn build(cargo: &str, target: &Path, profile: &Profile, out: &Path) {
    eprintln!("building {} ({} build)", BINARIES.join(" and "), profile.name);
    let mut cmd = Command::new(cargo);
    cmd.env("CARGO_TARGET_DIR", target).args(["build", "--profile", profile.profile]);
    let built_dir = match profile.downstream {
        Some(level) => {
            let dir = target.join("debug-cost").join("downstream");
            downstream_crate(&dir, level);
            cmd.current_dir(&dir).args(BINARIES.iter().flat_map(|b| ["--bin", b]));
            target.join(profile.dir)
        }
        None => {
            cmd.current_dir(env!("CARGO_MANIFEST_DIR")).args(BINARIES.iter().flat_map(|b| ["--example", b]));
            target.join(profile.dir).join("examples")
        }
    };
    let status = cmd.status().expect("cargo runs");
    assert!(status.success(), "cargo build for {} failed", profile.name);
    std::fs::create_dir_all(out).expect("the output directory can be created");
    for bin in BINARIES {
        let built = built_dir.join(bin);
        std::fs::copy(&built, out.join(bin)).unwrap_or_else(|e| panic!("copying {}: {e}", built.display()));
    }
}

/// Runs `bin` once with `args`.
fn run(bin: &Path, args: &[String]) -> Sample {
    let start = Instant::now();
    let output = Command::new(bin).args(args).output().unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
    let process_ms = start.elapsed().as_secs_f64() * 1e3;
    assert!(output.status.success(), "{} failed: {}", bin.display(), String::from_utf8_lossy(&output.stderr));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let workload_ms = stdout.trim().parse().unwrap_or_else(|_| panic!("{} printed {stdout:?}", bin.display()));
    Sample { workload_ms, process_ms }
}

/// The median of `xs` (the mean of the middle two for an even count).
fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    if n % 2 == 1 { xs[n / 2] } else { (xs[n / 2 - 1] + xs[n / 2]) / 2.0 }
}

/// The target for kmemcg/System in build `profile`.
fn target_ratio(profile: &Profile) -> &'static str {
    if profile.name == "release" { "<= 1.0x" } else { "<= 1.5x" }
}

fn main() {
    let mut args = env::args().skip(1);
    let rounds = match args.next() {
        Some(a) => a.parse().expect("the first argument is the number of rounds"),
        None => ROUNDS,
    };
    // Anything after the rounds goes to the binaries (their rounds per thread).
    let bin_args: Vec<String> = args.collect();
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let target = target_dir();
    let out = target.join("debug-cost");
    for p in &PROFILES {
        build(&cargo, &target, p, &out.join(p.name));
    }
    let bin = |p: &Profile, b: &str| out.join(p.name).join(b);

    for p in &PROFILES {
        for b in BINARIES {
            run(&bin(p, b), &bin_args);
        }
    }
    // samples[profile][binary][round]
    let mut samples = vec![vec![Vec::with_capacity(rounds); BINARIES.len()]; PROFILES.len()];
    for r in 0..rounds {
        for (i, p) in PROFILES.iter().enumerate() {
            for (j, b) in BINARIES.iter().enumerate() {
                let s = run(&bin(p, b), &bin_args);
                eprintln!(
                    "round {}/{rounds} {:7} {b}: {:.1} ms (process {:.1} ms)",
                    r + 1,
                    p.name,
                    s.workload_ms,
                    s.process_ms
                );
                samples[i][j].push(s);
            }
        }
    }

    let medians = |i: usize, j: usize, f: fn(&Sample) -> f64| median(samples[i][j].iter().map(f).collect());
    let round_ratio = |i: usize, f: fn(&Sample) -> f64| {
        median(samples[i][0].iter().zip(&samples[i][1]).map(|(sys, kmem)| f(kmem) / f(sys)).collect())
    };
    println!("Workload time, medians of {rounds} interleaved rounds:\n");
    println!(
        "| build | opt-level | System median ms | kmemcg median ms | ratio | median round ratio | issue's target |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (i, p) in PROFILES.iter().enumerate() {
        let (sys, kmem) = (medians(i, 0, |s| s.workload_ms), medians(i, 1, |s| s.workload_ms));
        let paired = round_ratio(i, |s| s.workload_ms);
        println!(
            "| {} | {} | {sys:.1} | {kmem:.1} | {:.2}x | {paired:.2}x | {} |",
            p.name,
            p.opt_level,
            kmem / sys,
            target_ratio(p)
        );
    }
    println!("\nWhole process (start to exit), medians of the same runs:\n");
    println!("| build | System median ms | kmemcg median ms | ratio | median round ratio |");
    println!("|---|---|---|---|---|");
    for (i, p) in PROFILES.iter().enumerate() {
        let (sys, kmem) = (medians(i, 0, |s| s.process_ms), medians(i, 1, |s| s.process_ms));
        println!(
            "| {} | {sys:.1} | {kmem:.1} | {:.2}x | {:.2}x |",
            p.name,
            kmem / sys,
            round_ratio(i, |s| s.process_ms)
        );
    }
}
