//! PNG plots of the benchmark results, for BENCHMARKS.md.
//!
//! Run with: `cargo run -p kmemcg-plots`, after the runs whose results it
//! reads (the line under each plot's title names its run):
//!
//! | plot | input | produced by |
//! |---|---|---|
//! | `docs/plots/alloc.png` | `target/criterion/*/*/[*/]new/estimates.json` | `cargo bench --bench alloc` |
//! | `docs/plots/accounting.png` | `target/kmemcg-results/accounting_*.csv` | `cargo bench --bench accounting` |
//! | `docs/plots/dead.png` | `target/kmemcg-results/dead.csv` | `cargo bench --bench dead` |
//! | `docs/plots/soft_limits.png` | `target/kmemcg-results/soft_limits.csv` | `cargo run --release --example soft_limits` |
//! | `docs/plots/decay.png` | `target/kmemcg-results/decay.csv` | `cargo run --release --example decay` |
//!
//! (`target/` is `CARGO_TARGET_DIR` when set.) The alloc plot's numbers (ns
//! per operation, per object for `batch-*`) also go to
//! `target/kmemcg-results/alloc.csv`. A plot whose input is
//! missing or unreadable is skipped with a message; the others are still
//! drawn. Text is rendered with the bundled DejaVu Sans (`plots/fonts/`,
//! with its license) through plotters' `ab_glyph` feature, so no system
//! font libraries are needed.

use std::collections::BTreeMap;
use std::error::Error;
use std::path::{Path, PathBuf};

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::register_font;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// The benches' results module (where their CSVs are), shared by path
/// with the benches that write them.
#[path = "../../examples/support/results.rs"]
mod results;

const FONT: &[u8] = include_bytes!("../fonts/DejaVuSans.ttf");
const SANS: &str = "sans-serif";
const SIZE: (u32, u32) = (900, 500);

type Area<'a> = DrawingArea<BitMapBackend<'a>, Shift>;
type Res<T = ()> = Result<T, Box<dyn Error>>;
/// Draws one PNG at the path; says which inputs it read, or why it skipped.
type Plot = fn(&Path) -> Result<String, String>;

const KMEMCG: RGBColor = RGBColor(214, 39, 40);
const BLUE: RGBColor = RGBColor(31, 119, 180);
const GREEN: RGBColor = RGBColor(44, 160, 44);
const ORANGE: RGBColor = RGBColor(255, 127, 14);
const PURPLE: RGBColor = RGBColor(148, 103, 189);
const GRAY: RGBColor = RGBColor(127, 127, 127);

fn main() {
    if register_font(SANS, FontStyle::Normal, FONT).is_err() {
        eprintln!("plots: the bundled font plots/fonts/DejaVuSans.ttf could not be parsed; no plots drawn");
        return;
    }
    // The workspace root is this crate's parent.
    let out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/plots");
    if let Err(e) = std::fs::create_dir_all(&out) {
        eprintln!("plots: cannot create {}: {e}", out.display());
        return;
    }
    let plots: [(&str, Plot); 5] = [
        ("alloc.png", alloc),
        ("accounting.png", accounting),
        ("dead.png", dead),
        ("soft_limits.png", soft_limits),
        ("decay.png", decay),
    ];
    let (mut drawn, mut skipped) = (0, 0);
    for (name, plot) in plots {
        match plot(&out.join(name)) {
            Ok(from) => {
                drawn += 1;
                println!("wrote docs/plots/{name} from {from}");
            }
            Err(why) => {
                skipped += 1;
                println!("skipped docs/plots/{name}: {why}");
            }
        }
    }
    println!("{drawn} plots written, {skipped} skipped");
}

// ---- inputs ----

/// Reads `kmemcg-results/<name>`: its rows (after the header), split on commas.
fn read_csv(name: &str, columns: usize, produced_by: &str) -> Result<(PathBuf, Vec<Vec<String>>), String> {
    let path = results::dir().join(name);
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("missing input {} ({e}); run `{produced_by}` first", path.display()))?;
    let rows: Vec<Vec<String>> = text
        .lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.split(',').map(str::to_owned).collect())
        .collect();
    if rows.is_empty() {
        return Err(format!("{} has no rows; run `{produced_by}` again", path.display()));
    }
    if let Some(bad) = rows.iter().find(|r| r.len() < columns) {
        return Err(format!(
            "{}: a row with {} columns, expected {columns}: {}",
            path.display(),
            bad.len(),
            bad.join(",")
        ));
    }
    Ok((path, rows))
}

fn num(s: &str, what: &Path) -> Result<f64, String> {
    s.trim()
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite())
        .ok_or_else(|| format!("{}: `{s}` is not a number", what.display()))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The value of `"key":"..."` in a small JSON object (criterion's
/// `benchmark.json`), or `None` when absent or `null`.
fn json_str<'a>(json: &'a str, key: &str) -> Option<&'a str> {
    let at = json.find(&format!("\"{key}\":\""))? + key.len() + 4;
    json[at..].split('"').next()
}

/// The median's point estimate in criterion's `estimates.json` (ns).
fn json_median(json: &str) -> Option<f64> {
    let median = &json[json.find("\"median\":")?..];
    let at = median.find("\"point_estimate\":")? + "\"point_estimate\":".len();
    median[at..].split([',', '}']).next()?.trim().parse().ok()
}

/// Every criterion result under `dir`: (group[/parameter], function) -> median ns.
fn criterion_medians(dir: &Path) -> BTreeMap<(String, String), f64> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                stack.push(e.path());
            }
        }
        if d.file_name().is_some_and(|n| n == "new") {
            let (Ok(b), Ok(est)) =
                (std::fs::read_to_string(d.join("benchmark.json")), std::fs::read_to_string(d.join("estimates.json")))
            else {
                continue;
            };
            let (Some(group), Some(func), Some(med)) =
                (json_str(&b, "group_id"), json_str(&b, "function_id"), json_median(&est))
            else {
                continue;
            };
            let key = match json_str(&b, "value_str") {
                Some(v) => format!("{group}/{v}"),
                None => group.to_owned(),
            };
            out.insert((key, func.to_owned()), med);
        }
    }
    out
}

// ---- drawing helpers ----

/// A white canvas with a title and a smaller subtitle line; returns the area below them.
fn canvas<'a>(path: &'a Path, size: (u32, u32), title: &str, subtitle: &str) -> Res<(Area<'a>, Area<'a>)> {
    let root = BitMapBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE)?;
    let body = root.titled(title, (SANS, 19))?;
    let style =
        TextStyle::from((SANS, 13).into_font()).color(&RGBColor(70, 70, 70)).pos(Pos::new(HPos::Center, VPos::Top));
    body.draw_text(subtitle, &style, (size.0 as i32 / 2, 0))?;
    let body = body.margin(20, 0, 0, 0);
    Ok((root, body))
}

/// The legend of `chart` at `pos`, in the house style.
fn legend<'a>(
    chart: &mut ChartContext<'a, BitMapBackend<'a>, impl CoordTranslate>,
    pos: SeriesLabelPosition,
    shade: f64,
) -> Res {
    chart
        .configure_series_labels()
        .position(pos)
        .label_font((SANS, 13))
        .background_style(WHITE.mix(shade))
        .border_style(BLACK.mix(0.4))
        .draw()?;
    Ok(())
}

/// `points` as a line with a dot on each, named `name` in the legend.
fn line_with_dots<'a>(
    chart: &mut ChartContext<
        'a,
        BitMapBackend<'a>,
        Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
    >,
    name: &str,
    color: RGBColor,
    points: Vec<(f64, f64)>,
) -> Res {
    chart.draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?;
    chart.draw_series(points.iter().map(|&p| Circle::new(p, 4, color.filled())))?.label(name).legend(move |(x, y)| {
        EmptyElement::at((x, y))
            + PathElement::new(vec![(0, 0), (18, 0)], color.stroke_width(2))
            + Circle::new((9, 0), 4, color.filled())
    });
    Ok(())
}

/// Label for the tick at `x` when it sits on a category index.
fn category(names: &[String], x: f64) -> String {
    let i = x.round();
    if (x - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < names.len() {
        names[i as usize].clone()
    } else {
        String::new()
    }
}

/// Powers of ten around `[min, max]`, for a log axis.
fn decades(min: f64, max: f64) -> (f64, f64) {
    let lo = 10f64.powf(min.max(1e-9).log10().floor());
    let mut hi = 10f64.powf(max.max(1e-9).log10().ceil());
    if hi <= lo * 1.5 {
        hi = lo * 10.0;
    }
    (lo, hi)
}

/// Compact tick labels: 1, 20, 500, 1k, 10k.
fn compact(v: f64) -> String {
    if v >= 1000.0 { format!("{}k", v / 1000.0) } else { format!("{v}") }
}

/// One series of grouped bars: name, color, a value per group (`None`: no
/// bar) and optionally a (min, max) whisker per group.
struct Bars<'a> {
    name: &'a str,
    color: RGBColor,
    values: Vec<Option<f64>>,
    spread: Vec<(f64, f64)>,
}

/// Grouped bars on a log y axis, one group per name in `groups`.
fn grouped_log_bars(
    area: &Area<'_>,
    caption: &str,
    groups: &[String],
    series: &[Bars],
    y_desc: &str,
    legend: bool,
) -> Res {
    let all = series.iter().flat_map(|s| s.values.iter().flatten().copied().chain(s.spread.iter().map(|r| r.1)));
    let (min, max) = all.fold((f64::MAX, 0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    // An empty panel (its results missing) still gets an axis.
    let (lo, hi) = if min <= max { decades(min, max * 1.6) } else { (1.0, 10.0) };
    let n = groups.len();
    let mut chart = ChartBuilder::on(area)
        .caption(caption, (SANS, 15))
        .margin(6)
        .x_label_area_size(26)
        .y_label_area_size(58)
        .build_cartesian_2d(-0.5f64..n as f64 - 0.5, (lo..hi).log_scale())?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n + 1)
        .x_label_formatter(&|x| category(groups, *x))
        .y_desc(y_desc)
        .y_label_formatter(&|v| compact(*v))
        .label_style((SANS, 13))
        .axis_desc_style((SANS, 13))
        .draw()?;
    let w = 0.84 / series.len() as f64;
    for (k, s) in series.iter().enumerate() {
        let color = s.color;
        let bars = s.values.iter().enumerate().filter_map(|(i, v)| {
            let x0 = i as f64 - 0.42 + k as f64 * w;
            v.map(|v| Rectangle::new([(x0, lo), (x0 + w * 0.9, v)], color.filled()))
        });
        let anno = chart.draw_series(bars)?;
        if legend {
            anno.label(s.name).legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], color.filled()));
        }
        for (i, &(mn, mx)) in s.spread.iter().enumerate() {
            let x = i as f64 - 0.42 + k as f64 * w + w * 0.45;
            let cap = w * 0.15;
            let style = BLACK.stroke_width(1);
            chart.draw_series(
                [(x, mn, x, mx), (x - cap, mn, x + cap, mn), (x - cap, mx, x + cap, mx)]
                    .map(|(x0, y0, x1, y1)| PathElement::new(vec![(x0, y0), (x1, y1)], style)),
            )?;
        }
    }
    if legend {
        self::legend(&mut chart, SeriesLabelPosition::UpperLeft, 0.85)?;
    }
    Ok(())
}

// ---- 1. allocator workloads ----

const PEERS: [(&str, RGBColor); 5] =
    [("kmemcg", KMEMCG), ("jemalloc", BLUE), ("mimalloc", GREEN), ("system", GRAY), ("talc", PURPLE)];
const PER_CALL: [&str; 6] = ["pair-64", "threads1-pair", "threads2-pair", "random", "xfree", "realloc-grow"];
const BATCH_SIZES: [&str; 5] = ["64", "128", "256", "512", "1024"];
/// Objects per timed iteration of `batch-alloc/N` and `batch-free/N` (benches/alloc.rs `BATCH`).
const BATCH: f64 = 1_000_000.0;

fn alloc(png: &Path) -> Result<String, String> {
    let dir = results::target_dir().join("criterion");
    let medians = criterion_medians(&dir);
    let known = |k: &str| {
        PER_CALL.contains(&k) || k.split_once('/').is_some_and(|(g, _)| g == "batch-alloc" || g == "batch-free")
    };
    if !medians.keys().any(|(k, _)| known(k)) {
        return Err(format!(
            "missing input: no results of the alloc bench under {} (run `cargo bench --bench alloc` first)",
            dir.display()
        ));
    }
    // Workloads with no result at all, then single missing (workload, allocator) results.
    let workloads: Vec<String> = PER_CALL
        .iter()
        .map(|g| g.to_string())
        .chain(["batch-alloc", "batch-free"].iter().flat_map(|g| BATCH_SIZES.iter().map(move |s| format!("{g}/{s}"))))
        .collect();
    let mut missing = Vec::new();
    for w in &workloads {
        let absent: Vec<&str> =
            PEERS.iter().map(|p| p.0).filter(|a| !medians.contains_key(&(w.clone(), a.to_string()))).collect();
        if absent.len() == PEERS.len() {
            missing.push(w.clone());
        } else {
            missing.extend(absent.iter().map(|a| format!("{w}/{a}")));
        }
    }
    if !missing.is_empty() {
        println!("alloc.png: no criterion result for {} (drawn without those bars)", missing.join(", "));
    }
    // The plotted numbers, as the other plots' inputs are kept.
    let csv: Vec<String> = medians
        .iter()
        .filter(|((k, _), _)| known(k))
        .map(|((k, a), ns)| format!("{k},{a},{:.4}", if k.starts_with("batch-") { ns / BATCH } else { *ns }))
        .collect();
    results::write_csv("alloc.csv", "workload,allocator,ns_per_op", &csv);
    let bars = |keys: &[String], scale: f64| -> Vec<Bars> {
        PEERS
            .iter()
            .map(|&(name, color)| Bars {
                name,
                color,
                values: keys.iter().map(|k| medians.get(&(k.clone(), name.to_owned())).map(|v| v / scale)).collect(),
                spread: Vec::new(),
            })
            .collect()
    };
    let draw = || -> Res {
        let (root, body) = canvas(
            png,
            (SIZE.0, 620),
            "Allocator workloads, kmemcg and peers (median of criterion samples)",
            "data: cargo bench --bench alloc    plot: cargo run --release -p kmemcg-plots    (2-core shared VM; lower is better)",
        )?;
        let (top, bottom) = body.split_vertically(300);
        let per_call: Vec<String> = PER_CALL.iter().map(|s| s.to_string()).collect();
        grouped_log_bars(
            &top,
            "per call (pair: alloc+free; threads2: per pair per thread; realloc-grow: 8 B to 1 MiB by doubling)",
            &per_call,
            &bars(&per_call, 1.0),
            "ns per op (log)",
            true,
        )?;
        let (left, right) = bottom.split_horizontally(SIZE.0 / 2);
        let sizes: Vec<String> = BATCH_SIZES.iter().map(|s| format!("{s} B")).collect();
        for (area, group) in [(&left, "batch-alloc"), (&right, "batch-free")] {
            let keys: Vec<String> = BATCH_SIZES.iter().map(|s| format!("{group}/{s}")).collect();
            let caption = format!("{group}: 1M objects, time per object");
            grouped_log_bars(area, &caption, &sizes, &bars(&keys, BATCH), "ns per object (log)", false)?;
        }
        root.present()?;
        Ok(())
    };
    draw().map_err(|e| format!("drawing failed: {e}"))?;
    Ok(dir.display().to_string())
}

// ---- 2. accounting overhead (seed 000) ----

/// Seed 000's `find /` system time in seconds per mode (base kernel, root
/// group, then the hard limits), from the seed's own table.
const SEED000_SYS: [(&str, f64); 8] = [
    ("unaccounted", 6.649),
    ("root", 6.417),
    ("16M", 6.947),
    ("8M", 7.047),
    ("4M", 7.022),
    ("2M", 7.118),
    ("1M", 7.067),
    ("512K", 7.179),
];

fn accounting(png: &Path) -> Result<String, String> {
    const BY: &str = "cargo bench --bench accounting";
    let (seed_path, seed_rows) = read_csv("accounting_seed000.csv", 5, BY)?;
    let (pair_path, pair_rows) = read_csv("accounting_pair64.csv", 4, BY)?;
    // Modes in first-seen order; ratios per part.
    let mut modes: Vec<String> = Vec::new();
    let mut ratio: BTreeMap<(String, String), f64> = BTreeMap::new();
    for r in &seed_rows {
        if !modes.contains(&r[1]) {
            modes.push(r[1].clone());
        }
        ratio.insert((r[0].clone(), r[1].clone()), num(&r[3], &seed_path)?);
    }
    let mut pairs = Vec::new();
    for r in &pair_rows {
        pairs.push((format!("{}, {}", r[0], r[1]), num(&r[2], &pair_path)?, num(&r[3], &pair_path)?));
    }
    let seed_base = SEED000_SYS[0].1;
    let seed: Vec<Option<f64>> =
        modes.iter().map(|m| SEED000_SYS.iter().find(|(n, _)| n == m).map(|(_, s)| s / seed_base)).collect();
    let draw = || -> Res {
        let (root, body) = canvas(
            png,
            SIZE,
            "Seed 000: what accounting costs (kmemcg typed cache, LRU of 20,000 dentries)",
            "data: cargo bench --bench accounting    plot: cargo run --release -p kmemcg-plots    (2-core shared VM)",
        )?;
        let (left, right) = body.split_horizontally(520);
        // Left: time relative to the unaccounted cache, per mode.
        let series: [(&str, RGBColor, Vec<Option<f64>>); 3] = [
            (
                "walk + allocate (find)",
                KMEMCG,
                modes.iter().map(|m| ratio.get(&("walk".into(), m.clone())).copied()).collect(),
            ),
            (
                "replay only (allocator)",
                BLUE,
                modes.iter().map(|m| ratio.get(&("replay".into(), m.clone())).copied()).collect(),
            ),
            ("seed 000 kernel sys time", GRAY, seed),
        ];
        let values = series.iter().flat_map(|s| s.2.iter().flatten().copied());
        let (lo, hi) = values.fold((1f64, 1f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
        let (lo, hi) = ((lo - 0.05).max(0.0), hi + 0.1);
        let n = modes.len();
        let mut chart = ChartBuilder::on(&left)
            .caption("median time / unaccounted, by mode (hard limit)", (SANS, 15))
            .margin(6)
            .x_label_area_size(26)
            .y_label_area_size(52)
            .build_cartesian_2d(-0.5f64..n as f64 - 0.5, lo..hi)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(n + 1)
            .x_label_formatter(&|x| category(&modes, *x))
            .y_desc("ratio to unaccounted")
            .y_label_formatter(&|v| format!("{v:.2}"))
            .label_style((SANS, 13))
            .axis_desc_style((SANS, 13))
            .draw()?;
        chart.draw_series(DashedLineSeries::new(
            [(-0.5, 1.0), (n as f64 - 0.5, 1.0)],
            6,
            4,
            BLACK.mix(0.6).stroke_width(1),
        ))?;
        for (name, color, values) in &series {
            let points = values.iter().enumerate().filter_map(|(i, v)| v.map(|v| (i as f64, v))).collect();
            line_with_dots(&mut chart, name, *color, points)?;
        }
        legend(&mut chart, SeriesLabelPosition::UpperLeft, 0.85)?;
        // Right: the accounted fast path, ns per alloc+free.
        let xmax = pairs.iter().map(|p| p.1).fold(0f64, f64::max) * 1.45;
        let m = pairs.len();
        let mut chart = ChartBuilder::on(&right)
            .caption("pair-64: ns per alloc+free", (SANS, 15))
            .margin(6)
            .margin_right(14)
            .x_label_area_size(40)
            .y_label_area_size(0)
            .build_cartesian_2d(0f64..xmax, -0.5f64..m as f64 - 0.2)?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(0)
            .x_labels(5)
            .x_desc("ns per alloc+free")
            .x_label_formatter(&|v| format!("{v:.0}"))
            .label_style((SANS, 13))
            .axis_desc_style((SANS, 13))
            .draw()?;
        for (i, (name, ns, r)) in pairs.iter().enumerate() {
            // Top to bottom in table order; the second of each pair is the accounted one.
            let y = (m - 1 - i) as f64;
            let color = if i % 2 == 0 { GRAY } else { KMEMCG };
            chart.draw_series(std::iter::once(Rectangle::new([(0.0, y - 0.3), (*ns, y + 0.3)], color.filled())))?;
            let label = TextStyle::from((SANS, 13).into_font()).pos(Pos::new(HPos::Left, VPos::Bottom));
            chart.draw_series(std::iter::once(Text::new(name.clone(), (xmax * 0.01, y + 0.48), label)))?;
            let value = TextStyle::from((SANS, 13).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
            chart.draw_series(std::iter::once(Text::new(
                format!("{ns:.2} ({r:.3}x)"),
                (*ns + xmax * 0.02, y),
                value,
            )))?;
        }
        root.present()?;
        Ok(())
    };
    draw().map_err(|e| format!("drawing failed: {e}"))?;
    Ok(format!("{} and {}", seed_path.display(), pair_path.display()))
}

// ---- 3. frees into dead caches (seed 001) ----

/// Seed 001's TEST #1: ms to free 1M objects per CPU, alive and dead caches.
const SEED001: [(u32, f64, f64); 5] =
    [(64, 373.0, 1300.0), (128, 387.0, 1337.0), (256, 484.0, 1407.0), (512, 686.0, 1561.0), (1024, 1073.0, 1897.0)];

fn dead(png: &Path) -> Result<String, String> {
    let (path, rows) = read_csv("dead.csv", 4, "cargo bench --bench dead")?;
    // size -> (alive times, dead times)
    let mut by_size: BTreeMap<u32, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
    for r in &rows {
        let size = num(&r[0], &path)? as u32;
        let ms = num(&r[3], &path)?;
        let e = by_size.entry(size).or_default();
        match r[1].as_str() {
            "alive" => e.0.push(ms),
            "dead" => e.1.push(ms),
            other => return Err(format!("{}: unknown state `{other}`", path.display())),
        }
    }
    by_size.retain(|_, (a, d)| !a.is_empty() && !d.is_empty());
    if by_size.is_empty() {
        return Err(format!("{}: no size with both alive and dead times", path.display()));
    }
    let sizes: Vec<u32> = by_size.keys().copied().collect();
    let labels: Vec<String> = sizes.iter().map(|s| format!("{s} B")).collect();
    let stats = |v: &Vec<f64>| {
        (median(v.clone()), v.iter().copied().fold(f64::MAX, f64::min), v.iter().copied().fold(0f64, f64::max))
    };
    let alive: Vec<(f64, f64, f64)> = by_size.values().map(|(a, _)| stats(a)).collect();
    let dead: Vec<(f64, f64, f64)> = by_size.values().map(|(_, d)| stats(d)).collect();
    let rounds = by_size.values().map(|(a, _)| a.len()).max().unwrap_or(0);
    let draw = || -> Res {
        let (root, body) = canvas(
            png,
            SIZE,
            "Seed 001: freeing 1M objects into a dead cache vs an alive one",
            &format!(
                "data: cargo bench --bench dead    plot: cargo run --release -p kmemcg-plots    (median of {rounds} rounds, whiskers min-max)"
            ),
        )?;
        let (left, right) = body.split_horizontally(520);
        let bars = |name, color, stats: &[(f64, f64, f64)]| Bars {
            name,
            color,
            values: stats.iter().map(|s| Some(s.0)).collect(),
            spread: stats.iter().map(|s| (s.1, s.2)).collect(),
        };
        let series = [bars("alive", BLUE, &alive), bars("dead (group removed)", KMEMCG, &dead)];
        grouped_log_bars(&left, "ms to free 1M objects, by object size", &labels, &series, "ms (log)", true)?;
        let n = sizes.len();
        // Right: dead/alive ratio against the seed's kernel numbers.
        let ours: Vec<(f64, f64)> =
            alive.iter().zip(&dead).enumerate().map(|(i, (a, d))| (i as f64, d.0 / a.0)).collect();
        let theirs: Vec<(f64, f64)> = sizes
            .iter()
            .enumerate()
            .filter_map(|(i, s)| SEED001.iter().find(|r| r.0 == *s).map(|r| (i as f64, r.2 / r.1)))
            .collect();
        let top = ours.iter().chain(&theirs).map(|p| p.1).fold(1f64, f64::max) * 1.25;
        let mut chart = ChartBuilder::on(&right)
            .caption("dead / alive time", (SANS, 15))
            .margin(6)
            .margin_right(14)
            .x_label_area_size(26)
            .y_label_area_size(44)
            .build_cartesian_2d(-0.5f64..n as f64 - 0.5, 0f64..top)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(n + 1)
            .x_label_formatter(&|x| category(&labels, *x))
            .y_label_formatter(&|v| format!("{v:.1}x"))
            .label_style((SANS, 13))
            .draw()?;
        chart.draw_series(DashedLineSeries::new(
            [(-0.5, 1.0), (n as f64 - 0.5, 1.0)],
            6,
            4,
            BLACK.mix(0.6).stroke_width(1),
        ))?;
        for (name, color, points) in [("kmemcg", KMEMCG, &ours), ("seed 001 (Linux slab, 24 CPUs)", GRAY, &theirs)] {
            line_with_dots(&mut chart, name, color, points.clone())?;
        }
        legend(&mut chart, SeriesLabelPosition::UpperRight, 0.85)?;
        root.present()?;
        Ok(())
    };
    draw().map_err(|e| format!("drawing failed: {e}"))?;
    Ok(path.display().to_string())
}

// ---- 4. soft limits (seed 002) ----

fn soft_limits(png: &Path) -> Result<String, String> {
    let (path, rows) = read_csv("soft_limits.csv", 8, "cargo run --release --example soft_limits")?;
    const MIB: f64 = (1 << 20) as f64;
    let mut samples = Vec::with_capacity(rows.len());
    for r in &rows {
        samples.push((num(&r[0], &path)?, num(&r[3], &path)? / MIB, num(&r[4], &path)? / MIB));
    }
    samples.sort_by(|a, b| a.0.total_cmp(&b.0));
    let last = &rows[rows.len() - 1];
    let (soft_a, soft_b, region) =
        (num(&last[5], &path)? / MIB, num(&last[6], &path)? / MIB, num(&last[7], &path)? / MIB);
    let tmax = samples.last().map(|s| s.0).unwrap_or(1.0).max(1.0);
    let draw = || -> Res {
        let (root, body) = canvas(
            png,
            SIZE,
            "Seed 002: two hungry groups against their soft limits",
            &format!(
                "data: cargo run --release --example soft_limits    plot: cargo run --release -p kmemcg-plots    ({region:.0} MiB region)"
            ),
        )?;
        let ymax = (region.max(samples.iter().map(|s| s.1 + s.2).fold(0f64, f64::max)) * 1.08).ceil();
        let mut chart = ChartBuilder::on(&body)
            .margin(10)
            .margin_right(20)
            .x_label_area_size(40)
            .y_label_area_size(52)
            .build_cartesian_2d(0f64..tmax, 0f64..ymax)?;
        chart
            .configure_mesh()
            .x_desc("ms since start (a dot per 1000 allocations of either thread)")
            .y_desc("usage (MiB)")
            .x_label_formatter(&|v| format!("{v:.0}"))
            .y_label_formatter(&|v| format!("{v:.0}"))
            .label_style((SANS, 13))
            .axis_desc_style((SANS, 13))
            .light_line_style(BLACK.mix(0.05))
            .draw()?;
        let line = |name: &str, color: RGBColor, data: Vec<(f64, f64)>| (name.to_owned(), color, data);
        let lines = [
            line("a usage", BLUE, samples.iter().map(|s| (s.0, s.1)).collect()),
            line("b usage", ORANGE, samples.iter().map(|s| (s.0, s.2)).collect()),
            line("a + b", GRAY, samples.iter().map(|s| (s.0, s.1 + s.2)).collect()),
        ];
        for (name, color, data) in lines {
            let width = if color == GRAY { 1 } else { 2 };
            if color != GRAY {
                chart.draw_series(data.iter().map(|&p| Circle::new(p, 2, color.filled())))?;
            }
            chart
                .draw_series(LineSeries::new(data, color.stroke_width(width)))?
                .label(name)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(width)));
        }
        for (name, color, y) in [
            (format!("a soft limit ({soft_a:.0} MiB)"), BLUE, soft_a),
            (format!("b soft limit ({soft_b:.0} MiB)"), ORANGE, soft_b),
            (format!("region ({region:.0} MiB)"), BLACK, region),
        ] {
            let style = color.stroke_width(1);
            chart.draw_series(DashedLineSeries::new([(0.0, y), (tmax, y)], 7, 5, style))?.label(name).legend(
                move |(x, y)| {
                    EmptyElement::at((x, y))
                        + PathElement::new(vec![(0, 0), (6, 0)], style)
                        + PathElement::new(vec![(11, 0), (18, 0)], style)
                },
            );
        }
        legend(&mut chart, SeriesLabelPosition::LowerRight, 0.9)?;
        root.present()?;
        Ok(())
    };
    draw().map_err(|e| format!("drawing failed: {e}"))?;
    Ok(path.display().to_string())
}

// ---- 5. decay ----

/// Colors of the runs of `examples/decay.rs` (others gray).
const DECAY_RUNS: [(&str, RGBColor); 3] = [("on", KMEMCG), ("on-burst-thread", ORANGE), ("off", BLUE)];

/// One sample of a decay run: ms since the burst was freed, MiB in use
/// and held, decay reaps so far.
struct DecaySample {
    ms: f64,
    in_use: f64,
    held: f64,
    reaps: f64,
}

fn decay(png: &Path) -> Result<String, String> {
    let (path, rows) = read_csv("decay.csv", 8, "cargo run --release --example decay")?;
    // Runs in first-seen order.
    let mut runs: Vec<(String, Vec<DecaySample>)> = Vec::new();
    for r in &rows {
        let s = DecaySample {
            ms: num(&r[1], &path)?,
            in_use: num(&r[4], &path)?,
            held: num(&r[5], &path)?,
            reaps: num(&r[7], &path)?,
        };
        match runs.iter_mut().find(|(name, _)| *name == r[0]) {
            Some((_, v)) => v.push(s),
            None => runs.push((r[0].clone(), vec![s])),
        }
    }
    for (_, v) in &mut runs {
        v.sort_by(|a, b| a.ms.total_cmp(&b.ms));
    }
    let color = |name: &str| DECAY_RUNS.iter().find(|r| r.0 == name).map_or(GRAY, |r| r.1);
    let all = || runs.iter().flat_map(|(_, v)| v.iter());
    let (tmin, tmax) = all().fold((0f64, 1f64), |(lo, hi), s| (lo.min(s.ms), hi.max(s.ms)));
    let held_max = all().map(|s| s.in_use.max(s.held)).fold(1f64, f64::max);
    // Room above the highest line for the legend.
    let ymax = (held_max * 1.5 / 50.0).ceil() * 50.0;
    let xmin = tmin.min(0.0) - 0.04 * (tmax - tmin);
    // The first run with decay reaps, and the sample after each of them.
    let (reaped, reaps) = runs
        .iter()
        .map(|(name, v)| {
            (name.as_str(), v.windows(2).filter(|w| w[1].reaps > w[0].reaps).map(|w| w[1].ms).collect::<Vec<f64>>())
        })
        .find(|r| !r.1.is_empty())
        .unwrap_or_default();
    let draw = || -> Res {
        let (root, body) = canvas(
            png,
            SIZE,
            "Decay: memory held after a burst is freed, decay on vs off",
            "data: cargo run --release --example decay    plot: cargo run --release -p kmemcg-plots    (OsPages, Threads; 256 MiB burst, then a 48 B trickle)",
        )?;
        let mut chart = ChartBuilder::on(&body)
            .margin(10)
            .margin_right(20)
            .x_label_area_size(40)
            .y_label_area_size(52)
            .build_cartesian_2d(xmin..tmax, 0f64..ymax)?;
        chart
            .configure_mesh()
            .x_desc("ms since the burst was freed (left of 0: the burst at its peak, before the frees)")
            .y_desc("MiB")
            .x_label_formatter(&|v| format!("{v:.0}"))
            .y_label_formatter(&|v| format!("{v:.0}"))
            .label_style((SANS, 13))
            .axis_desc_style((SANS, 13))
            .light_line_style(BLACK.mix(0.05))
            .draw()?;
        let reap_style = BLACK.mix(0.35).stroke_width(1);
        for (i, &t) in reaps.iter().enumerate() {
            let anno = chart.draw_series(DashedLineSeries::new([(t, 0.0), (t, held_max * 1.05)], 4, 4, reap_style))?;
            if i == 0 {
                anno.label(format!("a decay reap of run {reaped}")).legend(move |(x, y)| {
                    EmptyElement::at((x, y))
                        + PathElement::new(vec![(0, 0), (6, 0)], reap_style)
                        + PathElement::new(vec![(11, 0), (18, 0)], reap_style)
                });
            }
        }
        for (name, v) in &runs {
            let c = color(name);
            let held: Vec<(f64, f64)> = v.iter().map(|s| (s.ms, s.held)).collect();
            chart.draw_series(held.iter().map(|&p| Circle::new(p, 2, c.filled())))?;
            chart
                .draw_series(LineSeries::new(held, c.stroke_width(2)))?
                .label(format!("{name}: held (mapped by the source)"))
                .legend(move |(x, y)| {
                    EmptyElement::at((x, y))
                        + PathElement::new(vec![(0, 0), (18, 0)], c.stroke_width(2))
                        + Circle::new((9, 0), 2, c.filled())
                });
        }
        for (i, (name, v)) in runs.iter().enumerate() {
            let c = color(name);
            let anno =
                chart.draw_series(LineSeries::new(v.iter().map(|s| (s.ms, s.in_use)), c.mix(0.8).stroke_width(1)))?;
            if i == 0 {
                anno.label("in use by the allocator (thin, same colours)")
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.mix(0.8).stroke_width(1)));
            }
        }
        legend(&mut chart, SeriesLabelPosition::UpperRight, 0.9)?;
        root.present()?;
        Ok(())
    };
    draw().map_err(|e| format!("drawing failed: {e}"))?;
    Ok(path.display().to_string())
}
