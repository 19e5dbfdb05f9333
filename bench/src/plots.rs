//! SVG plots (the `plotters` crate): latency CDFs and histograms, throughput bars.

use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::prelude::*;

use super::model::{Measurement, Results, Unit};

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("plotting: {e:?}")
}

fn legend_name(m: &Measurement) -> String {
    format!("{} ({})", m.label, m.who)
}

/// A CDF of several latency distributions on a log time axis.
fn cdf(path: &Path, title: &str, series: &[&Measurement]) -> Result<()> {
    let series: Vec<&&Measurement> = series.iter().filter(|m| !m.samples.is_empty()).collect();
    let all = series.iter().flat_map(|m| m.samples.iter().copied());
    let lo = all.clone().fold(f64::INFINITY, f64::min).max(1e-4) * 0.8;
    let hi = all.fold(0.0f64, f64::max).max(lo * 2.0) * 1.25;
    let root = SVGBackend::new(path, (900, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d((lo..hi).log_scale(), 0f64..1f64)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("latency (ms, log scale)")
        .y_desc("fraction of samples ≤ x")
        .draw()
        .map_err(err)?;
    for (i, m) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let mut sorted = m.samples.clone();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len() as f64;
        let points: Vec<(f64, f64)> = sorted
            .iter()
            .enumerate()
            .map(|(k, &v)| (v.max(lo), (k + 1) as f64 / n))
            .collect();
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(err)?
            .label(legend_name(m))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// A histogram of one latency distribution (up to its p99 × 1.5).
fn histogram(path: &Path, title: &str, m: &Measurement) -> Result<()> {
    let mut sorted = m.samples.clone();
    sorted.sort_by(f64::total_cmp);
    let lo = sorted.first().copied().unwrap_or(0.0);
    let p99 = super::stats::quantile(&sorted, 0.99);
    let hi = (p99 * 1.5).max(lo + 1e-3);
    const BINS: usize = 50;
    let width = (hi - lo) / BINS as f64;
    let mut counts = [0usize; BINS];
    for &v in &sorted {
        if v <= hi {
            let b = (((v - lo) / width) as usize).min(BINS - 1);
            counts[b] += 1;
        }
    }
    let top = counts.iter().copied().max().unwrap_or(1) as f64 * 1.1;
    let root = SVGBackend::new(path, (900, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(lo..hi, 0f64..top)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("latency (ms)")
        .y_desc("samples")
        .draw()
        .map_err(err)?;
    chart
        .draw_series(counts.iter().enumerate().map(|(b, &c)| {
            let x0 = lo + b as f64 * width;
            Rectangle::new(
                [(x0, 0.0), (x0 + width * 0.9, c as f64)],
                COLORS[0].filled(),
            )
        }))
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// Horizontal bars of throughputs (GiB/s), each labelled above its bar.
fn bars(path: &Path, title: &str, series: &[&Measurement]) -> Result<()> {
    let top = series
        .iter()
        .map(|m| m.value)
        .fold(0.0f64, f64::max)
        .max(0.1)
        * 1.25;
    let n = series.len();
    let height = 90 + 60 * n as u32;
    let root = SVGBackend::new(path, (900, height)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(35)
        .y_label_area_size(10)
        .build_cartesian_2d(0f64..top, 0f64..n as f64)
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .disable_y_axis()
        .x_desc("GiB/s")
        .draw()
        .map_err(err)?;
    for (i, m) in series.iter().enumerate() {
        // The first series at the top.
        let y = (n - 1 - i) as f64;
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(0.0, y + 0.1), (m.value, y + 0.5)],
                color.filled(),
            )))
            .map_err(err)?;
        chart
            .draw_series(std::iter::once(Text::new(
                format!("{} ({}): {:.3} GiB/s", m.label, m.who, m.value),
                (top * 0.005, y + 0.9),
                ("sans-serif", 14),
            )))
            .map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

/// Writes every plot into `dir`; returns (title, file name) of each, for the markdown.
pub(crate) fn write_all(results: &Results, dir: &Path) -> Result<Vec<(String, String)>> {
    let pick = |keys: &[&str]| -> Vec<&Measurement> {
        keys.iter().filter_map(|k| results.get(k)).collect()
    };
    let mut out = Vec::new();
    let mut add = |title: &str, file: &str, f: &dyn Fn(&Path) -> Result<()>| -> Result<()> {
        f(&dir.join(file))?;
        out.push((title.to_string(), file.to_string()));
        Ok(())
    };
    let exec = pick(&[
        "exec_rtt_api",
        "exec_rtt_agent",
        "floor_fork_exec",
        "floor_posix_spawn",
        "peer_nsenter_exec",
    ]);
    if !exec.is_empty() {
        add("Exec round trip of `true`: CDF", "exec-cdf.svg", &|p| {
            cdf(p, "exec round trip of `true` (CDF)", &exec)
        })?;
    }
    if let Some(api) = results.get("exec_rtt_api") {
        add(
            "Exec round trip through the API: histogram",
            "exec-histogram.svg",
            &|p| histogram(p, "exec round trip of `true`, HTTP API (histogram)", api),
        )?;
    }
    let create = pick(&[
        "create_ready",
        "create_ready_pool",
        "tti",
        "peer_unshare_pivot_root",
        "peer_bwrap",
    ]);
    if !create.is_empty() {
        add("Create → ready: CDF", "create-cdf.svg", &|p| {
            cdf(p, "create → ready / one-shot run (CDF)", &create)
        })?;
    }
    let echo = pick(&["echo_rtt", "floor_unix_pingpong"]);
    if !echo.is_empty() {
        add("Interactive echo round trip: CDF", "echo-cdf.svg", &|p| {
            cdf(p, "interactive echo round trip (CDF)", &echo)
        })?;
    }
    let concurrent = pick(&[
        "create_concurrent_10",
        "create_concurrent_50",
        "exec_concurrent",
    ]);
    if !concurrent.is_empty() {
        add(
            "Concurrency: per-operation latency CDF",
            "concurrency-cdf.svg",
            &|p| {
                cdf(
                    p,
                    "per-operation latency under concurrency (CDF)",
                    &concurrent,
                )
            },
        )?;
    }
    let tput: Vec<&Measurement> = pick(&[
        "stdout_throughput",
        "floor_host_head",
        "stdout_throughput_dd",
        "stdout_throughput_agent",
        "floor_host_dd",
        "upload_tar",
        "download",
        "floor_unix_stream",
    ])
    .into_iter()
    .filter(|m| m.unit == Unit::GibPerS)
    .collect();
    if !tput.is_empty() {
        add("Throughput", "throughput.svg", &|p| {
            bars(p, "throughput (GiB/s)", &tput)
        })?;
    }
    let egress = pick(&[
        "egress_http",
        "floor_direct_http",
        "egress_connect",
        "floor_direct_tcp",
    ]);
    if !egress.is_empty() {
        add(
            "Egress proxy: downloads next to a direct host connection",
            "egress-throughput.svg",
            &|p| bars(p, "egress proxy and direct downloads (GiB/s)", &egress),
        )?;
    }
    Ok(out)
}
