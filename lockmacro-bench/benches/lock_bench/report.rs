//! The benchmark's outputs: a markdown table on stdout, `docs/bench/results.json`, and two
//! pictures of W3: `docs/bench/handoff.svg` (handoff latencies) and `docs/bench/wait.svg`
//! (acquire waits).

use std::path::{Path, PathBuf};

use plotters::prelude::*;
use serde_json::{Value, json};

/// One reported figure: the median over the repetitions of one measure of one system.
pub struct Figure {
    pub workload: &'static str,
    pub system: &'static str,
    pub metric: &'static str,
    pub value: f64,
    /// The lowest and highest value over the repetitions, where the figure has one per run.
    pub spread: Option<(f64, f64)>,
    pub unit: &'static str,
    pub target: Option<Target>,
}

/// A goal from issue 6 and whether this run reached it.
pub struct Target {
    pub goal: String,
    pub met: bool,
}

impl Target {
    /// A goal, as shown in the table, and whether it was reached.
    pub fn new(goal: impl Into<String>, met: bool) -> Option<Self> {
        Some(Self {
            goal: goal.into(),
            met,
        })
    }
}

/// A goal as shown in the table, and the test a median must pass to meet it.
pub type Goal = (&'static str, fn(f64) -> bool);

/// One system's W3 samples, pooled over the repetitions: handoffs in round trips, or waits in
/// FIFO ideals.
pub struct Series {
    pub system: &'static str,
    pub values: Vec<f64>,
}

/// Everything one run of the benchmark produced.
#[derive(Default)]
pub struct Report {
    pub figures: Vec<Figure>,
    pub handoffs: Vec<Series>,
    pub waits: Vec<Series>,
    pub machine: Vec<(&'static str, String)>,
    pub notes: Vec<String>,
}

impl Report {
    pub fn add(
        &mut self,
        workload: &'static str,
        system: &'static str,
        metric: &'static str,
        value: f64,
        unit: &'static str,
        target: Option<Target>,
    ) {
        self.figures.push(Figure {
            workload,
            system,
            metric,
            value,
            spread: None,
            unit,
            target,
        });
    }

    /// A figure measured once per repetition: its median, shown with its spread, and whether
    /// the median meets `target`.
    pub fn add_runs(
        &mut self,
        workload: &'static str,
        system: &'static str,
        metric: &'static str,
        runs: &[f64],
        unit: &'static str,
        target: Option<Goal>,
    ) {
        let value = crate::measure::median(runs.iter().copied());
        let lowest = runs.iter().copied().fold(f64::INFINITY, f64::min);
        let highest = runs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        self.figures.push(Figure {
            workload,
            system,
            metric,
            value,
            spread: Some((lowest, highest)),
            unit,
            target: target.and_then(|(goal, met)| Target::new(goal, met(value))),
        });
    }

    pub fn note(&mut self, note: impl Into<String>) {
        self.notes.push(note.into());
    }

    /// The markdown table, then the machine and the notes.
    pub fn markdown(&self) -> String {
        let mut out = String::from(
            "| workload | system | figure | median | range over runs | target | met |\n|---|---|---|---:|---:|---|---|\n",
        );
        for f in &self.figures {
            let (goal, met) = match &f.target {
                Some(t) => (t.goal.as_str(), if t.met { "yes" } else { "**no**" }),
                None => ("", ""),
            };
            let spread = f.spread.map_or(String::new(), |(lowest, highest)| {
                format!(
                    "{}–{}",
                    format_value(lowest, ""),
                    format_value(highest, f.unit)
                )
            });
            out += &format!(
                "| {} | {} | {} | {} | {spread} | {goal} | {met} |\n",
                f.workload,
                f.system,
                f.metric,
                format_value(f.value, f.unit)
            );
        }
        out += "\nMachine: ";
        let machine: Vec<String> = self
            .machine
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        out += &machine.join("; ");
        out += "\n";
        for note in &self.notes {
            out += &format!("\n- {note}");
        }
        out + "\n"
    }

    pub fn json(&self) -> Value {
        let figures: Vec<Value> = self
            .figures
            .iter()
            .map(|f| {
                json!({
                    "workload": f.workload,
                    "system": f.system,
                    "figure": f.metric,
                    "median": finite(f.value),
                    "range": f.spread.map(|(lowest, highest)| [finite(lowest), finite(highest)]),
                    "unit": f.unit,
                    "target": f.target.as_ref().map(|t| t.goal.clone()),
                    "met": f.target.as_ref().map(|t| t.met),
                })
            })
            .collect();
        let machine: serde_json::Map<String, Value> = self
            .machine
            .iter()
            .map(|(k, v)| ((*k).to_owned(), Value::from(v.clone())))
            .collect();
        let quantiles_of = |series: &[Series]| -> serde_json::Map<String, Value> {
            series
                .iter()
                .map(|s| (s.system.to_owned(), quantiles(&s.values)))
                .collect()
        };
        json!({
            "figures": figures,
            "machine": machine,
            "handoff_quantiles_in_rtts": quantiles_of(&self.handoffs),
            "wait_quantiles_in_fifo_ideals": quantiles_of(&self.waits),
            "notes": self.notes,
        })
    }

    /// Writes `results.json`, `handoff.svg` and `wait.svg` under `dir`; returns their paths.
    pub fn write(&self, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
        std::fs::create_dir_all(dir)?;
        let json_path = dir.join("results.json");
        let pretty = serde_json::to_string_pretty(&self.json()).map_err(std::io::Error::other)?;
        std::fs::write(&json_path, pretty + "\n")?;
        let handoffs = Chart {
            caption: "W3: handoff latency (release -> next holder running), 16 tasks on one key",
            x_desc: "handoff latency, in PING round trips (log scale)",
            y_desc: "fraction of owner changes",
            goal: (3.0, "goal: p50 <= 3 round trips"),
        };
        let waits = Chart {
            caption: "W3: acquire wait (asked -> holding), 16 tasks on one key",
            x_desc: "wait, in FIFO ideals (16 / acquisitions per second of its run; log scale)",
            y_desc: "fraction of acquisitions",
            goal: (3.0, "goal: p99 <= 3 FIFO ideals"),
        };
        let mut paths = vec![json_path];
        for (name, chart, series) in [
            ("handoff.svg", handoffs, &self.handoffs),
            ("wait.svg", waits, &self.waits),
        ] {
            let path = dir.join(name);
            chart
                .draw(series, &path)
                .map_err(|err| std::io::Error::other(err.to_string()))?;
            paths.push(path);
        }
        Ok(paths)
    }
}

/// A picture of cumulative distributions, one line per system, on a log axis, with a goal
/// marked.
struct Chart {
    caption: &'static str,
    x_desc: &'static str,
    y_desc: &'static str,
    goal: (f64, &'static str),
}

impl Chart {
    fn draw(&self, series: &[Series], path: &Path) -> Result<(), Box<dyn std::error::Error>> {
        let root = SVGBackend::new(path, (900, 520)).into_drawing_area();
        root.fill(&WHITE)?;
        let all = series.iter().flat_map(|s| s.values.iter().copied());
        let lowest = all.clone().fold(f64::INFINITY, f64::min).clamp(0.01, 1.0);
        let highest = all.fold(1.0f64, f64::max).max(10.0) * 1.2;
        let mut chart = ChartBuilder::on(&root)
            .caption(self.caption, ("sans-serif", 20))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(55)
            .build_cartesian_2d((lowest..highest).log_scale(), 0.0..1.0)?;
        chart
            .configure_mesh()
            .x_desc(self.x_desc)
            .y_desc(self.y_desc)
            .draw()?;
        let colours = [BLUE, RED, GREEN, MAGENTA];
        for (series, colour) in series.iter().zip(colours) {
            let mut sorted = series.values.clone();
            sorted.sort_by(f64::total_cmp);
            let n = sorted.len().max(1) as f64;
            let step = (sorted.len() / 600).max(1);
            let points = sorted
                .iter()
                .enumerate()
                .step_by(step)
                .map(|(i, &x)| (x.max(lowest), (i + 1) as f64 / n));
            chart
                .draw_series(LineSeries::new(points, colour.stroke_width(2)))?
                .label(format!("{} (n = {})", series.system, sorted.len()))
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], colour));
        }
        let (at, label) = self.goal;
        chart
            .draw_series(LineSeries::new(
                [(at, 0.0), (at, 1.0)],
                BLACK.mix(0.5).stroke_width(1),
            ))?
            .label(label)
            .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLACK.mix(0.5)));
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
        root.present()?;
        Ok(())
    }
}

fn finite(value: f64) -> Value {
    if value.is_finite() {
        json!(value)
    } else {
        Value::Null
    }
}

fn quantiles(values: &[f64]) -> Value {
    let q = |q| finite(crate::measure::percentile(values, q));
    json!({ "n": values.len(), "p10": q(0.1), "p50": q(0.5), "p90": q(0.9), "p99": q(0.99) })
}

fn format_value(value: f64, unit: &str) -> String {
    if value == f64::INFINITY {
        return "∞".into();
    }
    if !value.is_finite() {
        return "n/a".into();
    }
    let number = if value.abs() >= 1000.0 {
        let whole = format!("{:.0}", value);
        // Thin groups of three for readability: 41 000.
        let digits: Vec<char> = whole.chars().collect();
        let mut grouped = String::new();
        for (i, c) in digits.iter().enumerate() {
            if i > 0 && (digits.len() - i).is_multiple_of(3) && *c != '-' {
                grouped.push(' ');
            }
            grouped.push(*c);
        }
        grouped
    } else if value.abs() >= 100.0 {
        format!("{value:.0}")
    } else if value.abs() >= 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.2}")
    };
    if unit.is_empty() {
        number
    } else {
        format!("{number} {unit}")
    }
}
