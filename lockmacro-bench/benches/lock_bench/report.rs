//! The benchmark's outputs: a markdown table on stdout, `docs/bench/results.json`, and
//! `docs/bench/handoff.svg`, the distribution of W3 handoff latencies.

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

/// Handoff latencies of one system, in round trips, pooled over the repetitions.
pub struct HandoffSeries {
    pub system: &'static str,
    pub in_rtts: Vec<f64>,
}

/// Everything one run of the benchmark produced.
#[derive(Default)]
pub struct Report {
    pub figures: Vec<Figure>,
    pub handoffs: Vec<HandoffSeries>,
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
        let handoffs: serde_json::Map<String, Value> = self
            .handoffs
            .iter()
            .map(|h| (h.system.to_owned(), json!(quantiles(&h.in_rtts))))
            .collect();
        json!({
            "figures": figures,
            "machine": machine,
            "handoff_quantiles_in_rtts": handoffs,
            "notes": self.notes,
        })
    }

    /// Writes `results.json` and `handoff.svg` under `dir`; returns their paths.
    pub fn write(&self, dir: &Path) -> std::io::Result<(PathBuf, PathBuf)> {
        std::fs::create_dir_all(dir)?;
        let json_path = dir.join("results.json");
        let pretty = serde_json::to_string_pretty(&self.json()).map_err(std::io::Error::other)?;
        std::fs::write(&json_path, pretty + "\n")?;
        let svg_path = dir.join("handoff.svg");
        self.draw_handoffs(&svg_path)
            .map_err(|err| std::io::Error::other(err.to_string()))?;
        Ok((json_path, svg_path))
    }

    /// The cumulative distribution of handoff latency per system, in round trips on a log axis,
    /// with the 3-round-trip goal marked.
    fn draw_handoffs(&self, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
        let root = SVGBackend::new(path, (900, 520)).into_drawing_area();
        root.fill(&WHITE)?;
        let all = self.handoffs.iter().flat_map(|h| h.in_rtts.iter().copied());
        let lowest = all.clone().fold(f64::INFINITY, f64::min).clamp(0.1, 1.0);
        let highest = all.fold(1.0f64, f64::max).max(10.0) * 1.2;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                "W3: handoff latency (release -> next holder running), 16 tasks on one key",
                ("sans-serif", 20),
            )
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(55)
            .build_cartesian_2d((lowest..highest).log_scale(), 0.0..1.0)?;
        chart
            .configure_mesh()
            .x_desc("handoff latency, in PING round trips (log scale)")
            .y_desc("fraction of owner changes")
            .draw()?;
        let colours = [BLUE, RED, GREEN, MAGENTA];
        for (series, colour) in self.handoffs.iter().zip(colours) {
            let mut sorted = series.in_rtts.clone();
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
        chart
            .draw_series(LineSeries::new(
                [(3.0, 0.0), (3.0, 1.0)],
                BLACK.mix(0.5).stroke_width(1),
            ))?
            .label("goal: p50 <= 3 round trips")
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
