//! The work of issue 30's "real program", shared by both binaries (the
//! allocator is the only difference between them): log records made as
//! JSON text, parsed back in parallel (rayon), their fields matched with
//! regexes, per-route summaries merged and written out as JSON again.
//! Allocation-heavy the way ordinary programs are: many short strings,
//! maps and vectors of mixed sizes, made and freed on several threads.

use std::collections::BTreeMap;

use rayon::prelude::*;
use regex::Regex;
use serde_json::{Value, json};

/// A small xorshift, so every run does the same work.
fn mix(mut x: u64) -> u64 {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    x
}

const USERS: [&str; 6] = ["alice", "bob", "carol", "dave", "erin", "frank"];
const KINDS: [&str; 5] = ["users", "orders", "items", "carts", "search"];
const AGENTS: [&str; 4] = [
    "Mozilla/5.0 (X11; Linux x86_64) Firefox/128.0",
    "Mozilla/5.0 (Macintosh) AppleWebKit/605.1.15 Safari/17",
    "Mozilla/5.0 (Windows NT 10.0) Chrome/126.0.0.0",
    "curl/8.5.0",
];

/// Record `i` as one line of JSON text.
fn record(i: u64) -> String {
    let r = mix(i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let tags: Vec<String> = (0..(r % 5)).map(|t| format!("tag-{}", (r >> (8 * t)) % 40)).collect();
    let status = [200, 200, 200, 201, 304, 404, 500][((r >> 20) % 7) as usize];
    let v = json!({
        "id": i,
        "user": USERS[(r % 6) as usize],
        "path": format!("/api/v{}/{}/{}", 1 + (r >> 3) % 3, KINDS[((r >> 5) % 5) as usize], (r >> 9) % 10_000),
        "status": status,
        "agent": AGENTS[((r >> 24) % 4) as usize],
        "latency_ms": ((r >> 30) % 5000) as f64 / 10.0,
        "tags": tags,
        "body": "x".repeat(((r >> 40) % 300) as usize),
    });
    v.to_string()
}

/// One route's counts.
#[derive(Default)]
struct Route {
    hits: u64,
    errors: u64,
    /// Tenths of a millisecond (integers: the sum does not depend on
    /// the order rayon merges in).
    latency: u64,
    users: BTreeMap<String, u64>,
    browsers: BTreeMap<String, u64>,
}

impl Route {
    fn merge(&mut self, o: Route) {
        self.hits += o.hits;
        self.errors += o.errors;
        self.latency += o.latency;
        for (k, v) in o.users {
            *self.users.entry(k).or_default() += v;
        }
        for (k, v) in o.browsers {
            *self.browsers.entry(k).or_default() += v;
        }
    }
}

fn merge(mut a: BTreeMap<String, Route>, b: BTreeMap<String, Route>) -> BTreeMap<String, Route> {
    for (k, v) in b {
        a.entry(k).or_default().merge(v);
    }
    a
}

/// Makes `n` records, parses and summarises them; returns the summary's
/// JSON text (its length is printed, so the work cannot be skipped).
pub fn run(n: u64) -> String {
    let lines: Vec<String> = (0..n).into_par_iter().map(record).collect();
    let path = Regex::new(r"^/api/v(\d+)/([a-z]+)/(\d+)$").unwrap();
    let agent = Regex::new(r"(Firefox|Chrome|Safari|curl)/(\d+)").unwrap();
    let summary = lines
        .par_iter()
        .fold(BTreeMap::new, |mut m: BTreeMap<String, Route>, line| {
            let v: Value = serde_json::from_str(line).unwrap();
            let p = v["path"].as_str().unwrap_or("");
            let Some(c) = path.captures(p) else { return m };
            let key = format!("v{}/{}", &c[1], &c[2]);
            let r = m.entry(key).or_default();
            r.hits += 1;
            r.errors += u64::from(v["status"].as_u64().unwrap_or(0) >= 400);
            r.latency += (v["latency_ms"].as_f64().unwrap_or(0.0) * 10.0).round() as u64;
            *r.users.entry(v["user"].as_str().unwrap_or("?").to_owned()).or_default() += 1;
            let browser = agent
                .captures(v["agent"].as_str().unwrap_or(""))
                .map_or_else(|| "other".to_owned(), |c| format!("{} {}", &c[1], &c[2]));
            *r.browsers.entry(browser).or_default() += 1;
            m
        })
        .reduce(BTreeMap::new, merge);
    let out: Value = summary
        .into_iter()
        .map(|(k, r)| {
            let mean = if r.hits > 0 { r.latency as f64 / 10.0 / r.hits as f64 } else { 0.0 };
            (k, json!({ "hits": r.hits, "errors": r.errors, "mean_ms": mean, "users": r.users, "browsers": r.browsers }))
        })
        .collect::<serde_json::Map<_, _>>()
        .into();
    serde_json::to_string_pretty(&out).unwrap()
}

/// Runs the work with the record count of the first argument (default
/// 200,000) and prints `seconds <wall time of the work> bytes <output
/// length>` on one line.
pub fn main_with(label: &str) {
    let n = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(200_000);
    let t = std::time::Instant::now();
    let out = run(n);
    let s = t.elapsed().as_secs_f64();
    println!("{label} seconds {s:.4} bytes {}", out.len());
}
