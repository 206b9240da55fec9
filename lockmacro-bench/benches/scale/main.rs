//! The scale bench (issue 32): `cargo bench -p lockmacro-bench --bench scale`.
//!
//! How the cost of the lock grows with the work, one size at a time, each size in a process of
//! its own (this binary run again as a child) against a `redis-server` of its own, so that memory
//! and CPU figures belong to that size alone:
//!
//! | curve | sizes | figures | where |
//! |---|---|---|---|
//! | leases held by one client (ttl 30 s, default 2 s scan, held 25 s after all are taken) | 1 000 → 1 000 000 | memory per lease, watchdog CPU, renewal round trips per tick, renewal lateness p99, lapses, time to take and to release them all | [`leases`] |
//! | callers parked on 100 and on 10 000 keys | 1 000 → 100 000 | memory per waiter, requests per second while idle, subscriptions held, release → next holder running p50/p99 | [`waiters`] |
//! | `LockClient::list` over keys under one prefix | 10 000 → 1 000 000 | time, peak resident memory | [`listing`] |
//!
//! It prints markdown tables and writes `docs/bench/scale.json` and the curves as pictures
//! (`docs/bench/scale-leases.svg`, `scale-waiters.svg`, `scale-list.svg`). `SCALE_QUICK=1` runs
//! smaller sizes with shorter leases (a minute or so) and leaves `docs/bench/` alone; arguments
//! (`leases`, `waiters`, `list`) run only the curves named, and also leave `docs/bench/` alone.
//! Each size runs once: these are curves over decades, not ratios within the noise.

mod leases;
mod listing;
#[allow(dead_code)]
#[path = "../lock_bench/measure.rs"]
mod measure;
mod plot;
#[allow(dead_code)]
#[path = "../lock_bench/relay.rs"]
mod relay;
mod waiters;
mod work;

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use serde_json::{Value, json};

/// The flag that makes this binary measure one size and print its figures.
const CHILD: &str = "--scale-child";
/// The line a child prints its figures on.
const RESULT: &str = "scale-result ";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(at) = args.iter().position(|arg| arg == CHILD) {
        let curve = args.get(at + 1).expect("a curve").clone();
        // `cargo bench` adds `--bench` after ours.
        let sizes: Vec<usize> = args[at + 2..]
            .iter()
            .filter(|arg| !arg.starts_with("--"))
            .map(|size| size.parse().expect("a size"))
            .collect();
        child(&curve, &sizes);
        return;
    }
    let quick = std::env::var_os("SCALE_QUICK").is_some_and(|v| v != "0");
    let wanted: Vec<&str> = args
        .iter()
        .map(String::as_str)
        .filter(|arg| !arg.starts_with("--"))
        .collect();
    let runs = |name: &str| wanted.is_empty() || wanted.contains(&name);
    let began = Instant::now();
    let load_before = load_average();
    let mut results = serde_json::Map::new();
    let mut tables = String::new();
    if runs("leases") {
        let sizes: &[usize] = if quick {
            &[1_000, 10_000, 100_000]
        } else {
            &[1_000, 10_000, 100_000, 1_000_000]
        };
        let rows: Vec<Value> = sizes
            .iter()
            .map(|&n| run_child("leases", &[n], quick))
            .collect();
        tables += &leases::table(&rows);
        results.insert("leases".into(), Value::from(rows));
    }
    if runs("waiters") {
        let sizes: &[usize] = if quick {
            &[1_000, 10_000]
        } else {
            &[1_000, 10_000, 100_000]
        };
        let mut rows = Vec::new();
        for keys in [100, 10_000] {
            for &n in sizes {
                rows.push(run_child("waiters", &[n, keys], quick));
            }
        }
        tables += &waiters::table(&rows);
        results.insert("waiters".into(), Value::from(rows));
    }
    if runs("list") {
        let sizes: &[usize] = if quick {
            &[10_000, 100_000]
        } else {
            &[10_000, 100_000, 1_000_000]
        };
        let rows: Vec<Value> = sizes
            .iter()
            .map(|&n| run_child("list", &[n], quick))
            .collect();
        tables += &listing::table(&rows);
        results.insert("list".into(), Value::from(rows));
    }
    let notes = format!(
        "Machine: {}; load average before {load_before}, after {}; whole run {:.0} s{}.",
        machine(),
        load_average(),
        began.elapsed().as_secs_f64(),
        if quick { " (SCALE_QUICK)" } else { "" }
    );
    println!("{tables}\n{notes}");
    if quick || !wanted.is_empty() {
        return;
    }
    results.insert("notes".into(), Value::from(notes));
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/bench");
    let written = std::fs::create_dir_all(&out)
        .and_then(|()| {
            let pretty = serde_json::to_string_pretty(&Value::Object(results.clone()))
                .map_err(std::io::Error::other)?;
            std::fs::write(out.join("scale.json"), pretty + "\n")
        })
        .map_err(|err| err.to_string())
        .and_then(|()| plot::draw(&out, &results).map_err(|err| err.to_string()));
    match written {
        Ok(()) => eprintln!("wrote {}/scale.json and scale-*.svg", out.display()),
        Err(err) => {
            eprintln!("cannot write the results under {}: {err}", out.display());
            std::process::exit(1);
        }
    }
}

/// Runs this binary again to measure `curve` at `sizes`; returns the figures it printed.
fn run_child(curve: &str, sizes: &[usize], quick: bool) -> Value {
    let started = Instant::now();
    let mut command = Command::new(std::env::current_exe().expect("this binary"));
    command.arg(CHILD).arg(curve);
    command.args(sizes.iter().map(usize::to_string));
    if quick {
        command.env("SCALE_QUICK", "1");
    }
    let output = command.output().expect("the child bench");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let figures = stdout
        .lines()
        .find_map(|line| line.strip_prefix(RESULT))
        .and_then(|line| serde_json::from_str(line).ok());
    match figures {
        Some(figures) if output.status.success() => {
            eprintln!(
                "{curve} {sizes:?} done in {:.1} s",
                started.elapsed().as_secs_f64()
            );
            figures
        }
        _ => {
            eprintln!("{}", String::from_utf8_lossy(&output.stderr));
            panic!("{curve} {sizes:?} failed: {}", output.status);
        }
    }
}

/// Measures one size, in this process, and prints its figures on one line.
fn child(curve: &str, sizes: &[usize]) {
    let quick = std::env::var_os("SCALE_QUICK").is_some_and(|v| v != "0");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let figures = runtime.block_on(async {
        match curve {
            "leases" => leases::measure(sizes[0], quick).await,
            "waiters" => waiters::measure(sizes[0], sizes[1]).await,
            "list" => listing::measure(sizes[0]).await,
            other => panic!("no curve {other}"),
        }
    });
    println!("{RESULT}{}", json!(figures));
}

fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|line| line.strip_prefix("model name")?.split_once(':'))
        .map_or("unknown CPU".to_owned(), |(_, model)| {
            model.trim().to_owned()
        });
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{model}, {cores} cores")
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// A figure of a row, as a number (`NaN` when missing).
fn number(row: &Value, name: &str) -> f64 {
    row.get(name).and_then(Value::as_f64).unwrap_or(f64::NAN)
}

/// A size with thin groups of three: 1 000 000.
fn grouped(n: f64) -> String {
    let whole = format!("{n:.0}");
    let mut out = String::new();
    for (i, c) in whole.chars().enumerate() {
        if i > 0 && (whole.len() - i).is_multiple_of(3) {
            out.push(' ');
        }
        out.push(c);
    }
    out
}
