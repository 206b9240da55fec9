//! The curves as pictures: `docs/bench/scale-leases.svg`, `scale-waiters.svg` and
//! `scale-list.svg`, one panel per figure, log–log where the figure spans decades.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;
use serde_json::{Map, Value};

use crate::number;

type Drawn = Result<(), Box<dyn std::error::Error>>;

/// One line of a panel: its legend and its points.
struct Line {
    label: String,
    points: Vec<(f64, f64)>,
}

/// One panel: a figure against the size.
struct Panel<'a> {
    title: &'a str,
    x_desc: &'a str,
    y_desc: &'a str,
    /// A log y axis; otherwise linear from 0.
    log_y: bool,
    lines: Vec<Line>,
}

pub fn draw(dir: &Path, results: &Map<String, Value>) -> Drawn {
    let rows = |name: &str| -> Vec<Value> {
        results
            .get(name)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let line = |rows: &[Value], x: &str, y: &str, label: &str, scale: f64| Line {
        label: label.to_owned(),
        points: rows
            .iter()
            .map(|row| (number(row, x), number(row, y) * scale))
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .collect(),
    };
    let leases = rows("leases");
    if !leases.is_empty() {
        let x = "leases held by one client";
        let panels = [
            Panel {
                title: "memory per lease",
                x_desc: x,
                y_desc: "bytes",
                log_y: true,
                lines: vec![
                    line(
                        &leases,
                        "leases",
                        "resident_bytes_per_lease",
                        "resident",
                        1.0,
                    ),
                    line(&leases, "leases", "heap_bytes_per_lease", "heap", 1.0),
                ],
            },
            Panel {
                title: "CPU while holding (% of a core)",
                x_desc: x,
                y_desc: "%",
                log_y: true,
                lines: vec![
                    line(
                        &leases,
                        "leases",
                        "watchdog_cpu_percent",
                        "watchdog thread",
                        1.0,
                    ),
                    line(
                        &leases,
                        "leases",
                        "process_cpu_percent",
                        "whole process",
                        1.0,
                    ),
                ],
            },
            Panel {
                title: "renewals per 2 s tick",
                x_desc: x,
                y_desc: "per tick",
                log_y: true,
                lines: vec![
                    line(
                        &leases,
                        "leases",
                        "round_trips_per_tick",
                        "round trips",
                        1.0,
                    ),
                    line(
                        &leases,
                        "leases",
                        "extend_scripts_per_tick",
                        "extend scripts",
                        1.0,
                    ),
                ],
            },
            Panel {
                title: "renewal lateness past its third",
                x_desc: x,
                y_desc: "ms",
                log_y: false,
                lines: vec![
                    line(
                        &leases,
                        "leases",
                        "renewal_lateness_p99_ms",
                        "p99 lateness (ms)",
                        1.0,
                    ),
                    line(
                        &leases,
                        "leases",
                        "renewal_lateness_p50_ms",
                        "p50 lateness (ms)",
                        1.0,
                    ),
                ],
            },
            Panel {
                title: "time to take all / release all",
                x_desc: x,
                y_desc: "s",
                log_y: true,
                lines: vec![
                    line(&leases, "leases", "take_all_s", "take all", 1.0),
                    line(&leases, "leases", "release_all_s", "release all", 1.0),
                ],
            },
            Panel {
                title: "renewals per lease: done and due",
                x_desc: x,
                y_desc: "renewals",
                log_y: false,
                lines: vec![
                    line(&leases, "leases", "renewals_per_lease", "done", 1.0),
                    line(
                        &leases,
                        "leases",
                        "renewals_due_per_lease",
                        "due (at least)",
                        1.0,
                    ),
                ],
            },
        ];
        draw_panels(
            &dir.join("scale-leases.svg"),
            "Leases held by one client (ttl 30 s, 25 s hold)",
            &panels,
            3,
        )?;
    }
    let waiters = rows("waiters");
    if !waiters.is_empty() {
        let on = |keys: u64| -> Vec<Value> {
            waiters
                .iter()
                .filter(|row| row.get("keys").and_then(Value::as_u64) == Some(keys))
                .cloned()
                .collect()
        };
        let (few, many) = (on(100), on(10_000));
        let x = "callers parked";
        let both = |y: &str, scale: f64| {
            vec![
                line(&few, "waiters", y, "on 100 keys", scale),
                line(&many, "waiters", y, "on 10 000 keys", scale),
            ]
        };
        let mut handoff = both("handoff_p50_us", 1e-3);
        for line in &mut handoff {
            line.label += ", p50";
        }
        let mut p99 = both("handoff_p99_us", 1e-3);
        for line in &mut p99 {
            line.label += ", p99";
        }
        handoff.extend(p99);
        let panels = [
            Panel {
                title: "resident memory per waiter",
                x_desc: x,
                y_desc: "bytes",
                log_y: true,
                lines: both("resident_bytes_per_waiter", 1.0),
            },
            Panel {
                title: "release -> next holder running",
                x_desc: x,
                y_desc: "ms",
                log_y: true,
                lines: handoff,
            },
            Panel {
                title: "requests per second while idle",
                x_desc: x,
                y_desc: "/s",
                log_y: false,
                lines: both("idle_requests_per_s", 1.0),
            },
            Panel {
                title: "subscribed channels",
                x_desc: x,
                y_desc: "channels",
                log_y: false,
                lines: both("subscribed_channels", 1.0),
            },
        ];
        draw_panels(
            &dir.join("scale-waiters.svg"),
            "Callers parked on held keys",
            &panels,
            2,
        )?;
    }
    let list = rows("list");
    if !list.is_empty() {
        let x = "keys under the prefix";
        let panels = [
            Panel {
                title: "time to list them all",
                x_desc: x,
                y_desc: "s",
                log_y: true,
                lines: vec![line(&list, "keys", "list_s", "LockClient::list", 1.0)],
            },
            Panel {
                title: "peak memory above before",
                x_desc: x,
                y_desc: "MiB",
                log_y: true,
                lines: vec![
                    line(
                        &list,
                        "keys",
                        "peak_resident_bytes",
                        "resident",
                        1.0 / 1048576.0,
                    ),
                    line(&list, "keys", "peak_heap_bytes", "heap", 1.0 / 1048576.0),
                ],
            },
        ];
        draw_panels(
            &dir.join("scale-list.svg"),
            "LockClient::list over one prefix",
            &panels,
            2,
        )?;
    }
    Ok(())
}

fn draw_panels(path: &Path, caption: &str, panels: &[Panel<'_>], columns: usize) -> Drawn {
    let rows = panels.len().div_ceil(columns);
    let root =
        SVGBackend::new(path, (420 * columns as u32, 40 + 320 * rows as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(caption, ("sans-serif", 22))?;
    for (panel, area) in panels.iter().zip(root.split_evenly((rows, columns))) {
        draw_panel(panel, &area)?;
    }
    root.present()?;
    Ok(())
}

fn draw_panel(panel: &Panel<'_>, area: &DrawingArea<SVGBackend<'_>, Shift>) -> Drawn {
    let points = panel.lines.iter().flat_map(|l| l.points.iter().copied());
    let (mut x_lo, mut x_hi, mut y_lo, mut y_hi) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for (x, y) in points {
        (x_lo, x_hi, y_lo, y_hi) = (x_lo.min(x), x_hi.max(x), y_lo.min(y), y_hi.max(y));
    }
    if x_lo > x_hi {
        return Ok(());
    }
    let x_range = (x_lo / 1.5)..(x_hi * 1.5);
    let colours = [BLUE, RED, GREEN, MAGENTA];
    let mut chart = ChartBuilder::on(area);
    chart
        .caption(panel.title, ("sans-serif", 15))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(55);
    macro_rules! plot {
        ($chart:expr) => {{
            let mut chart = $chart;
            chart
                .configure_mesh()
                .x_desc(panel.x_desc)
                .y_desc(panel.y_desc)
                .x_label_formatter(&|x| format!("{x:.0e}"))
                .draw()?;
            for (line, colour) in panel.lines.iter().zip(colours) {
                chart
                    .draw_series(LineSeries::new(line.points.clone(), colour.stroke_width(2)))?
                    .label(line.label.clone())
                    .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], colour));
                chart.draw_series(
                    line.points
                        .iter()
                        .map(|&(x, y)| Circle::new((x, y), 3, colour.filled())),
                )?;
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .label_font(("sans-serif", 12))
                .draw()?;
        }};
    }
    if panel.log_y {
        let y_lo = y_lo.max(1e-3);
        let y_range = (y_lo / 2.0)..(y_hi.max(y_lo) * 2.0);
        plot!(chart.build_cartesian_2d(x_range.log_scale(), y_range.log_scale())?);
    } else {
        let y_range = 0.0..(y_hi.max(1.0) * 1.3);
        plot!(chart.build_cartesian_2d(x_range.log_scale(), y_range)?);
    }
    Ok(())
}
