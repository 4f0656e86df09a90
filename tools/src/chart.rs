//! Charts of a `nuvec bench` run, drawn with plotters' SVG backend: per op, median latency
//! against size and bus bandwidth against size (both log-log), one line per system, rank
//! count (and dtype or reduction when several ran), the raw TCP limits dashed.
//!
//! Each system has its own colour and marker (nuvec blue circles, MLX vermilion triangles,
//! MPI green squares; the Okabe–Ito palette, which stays distinct for colour-blind
//! readers); further lines of a system take the palette's other colours. Ticks sit on
//! powers of two (sizes, "4 B", "1 KiB") and of ten (times and rates, "1 µs", "1 ms",
//! "100 MB/s").

use std::path::Path;

use nuvec_distributed_engine::DType;
use plotters::coord::Shift;
use plotters::coord::combinators::BindKeyPoints;
use plotters::element::DashedPathElement;
use plotters::prelude::*;

use crate::bench::{Op, RedOp};
use crate::report::Report;

/// How a series marks its points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Marker {
    /// nuvec.
    Circle,
    /// MLX's ring.
    Triangle,
    /// Open MPI.
    Square,
}

/// One line of a chart.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    /// The legend's text, e.g. `nuvec n=2`.
    pub label: String,
    /// Who measured it: `nuvec`, `mlx`, `mpi` or `tcp`.
    pub system: &'static str,
    /// (bytes per rank, value), in size order; only positive values.
    pub points: Vec<(f64, f64)>,
    /// A limit (drawn dashed, without markers) rather than a measurement.
    pub limit: bool,
    /// Its colour, set by [`panels`].
    pub color: (u8, u8, u8),
    /// Its marker (none for limits).
    pub marker: Option<Marker>,
}

/// What a panel's y axis shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quantity {
    /// Median latency, µs.
    Latency,
    /// Bus bandwidth, GB/s.
    Bandwidth,
}

/// One chart: a title, what its y axis shows, and its lines.
#[derive(Clone, Debug)]
pub struct Panel {
    /// The caption.
    pub title: String,
    /// What the y axis shows (its ticks' units follow).
    pub quantity: Quantity,
    /// The lines.
    pub series: Vec<Series>,
    /// Where the legend goes: where the lines are not (they rise with size).
    pub legend: SeriesLabelPosition,
}

/// The first line of each system.
fn base_color(system: &str) -> Option<(u8, u8, u8)> {
    match system {
        "nuvec" => Some((0, 114, 178)),
        "mlx" => Some((213, 94, 0)),
        "mpi" => Some((0, 158, 115)),
        "tcp" => Some((96, 96, 96)),
        _ => None,
    }
}

/// Colours for further lines, none near another system's.
const SPARE: [(u8, u8, u8); 5] = [
    (204, 121, 167),
    (230, 159, 0),
    (0, 0, 0),
    (140, 81, 10),
    (86, 180, 233),
];

fn marker(system: &str) -> Option<Marker> {
    match system {
        "nuvec" => Some(Marker::Circle),
        "mlx" => Some(Marker::Triangle),
        "mpi" => Some(Marker::Square),
        _ => None,
    }
}

/// Gives each series its colour: a system's first line its own, every further line (of
/// any system) the next spare one, so no two lines of a panel share a colour until the
/// spares run out.
fn assign_colors(series: &mut [Series]) {
    let mut seen: Vec<&str> = Vec::new();
    let mut spare = SPARE.iter().cycle();
    for s in series.iter_mut() {
        let base = base_color(s.system).filter(|_| s.limit || !seen.contains(&s.system));
        s.color = match base {
            Some(c) => c,
            None => *spare.next().unwrap_or(&(0, 0, 0)),
        };
        seen.push(s.system);
    }
}

fn positive(points: impl IntoIterator<Item = (usize, f64)>) -> Vec<(f64, f64)> {
    let mut out: Vec<(f64, f64)> = points
        .into_iter()
        .filter(|&(b, v)| b > 0 && v.is_finite() && v > 0.0)
        .map(|(b, v)| (b as f64, v))
        .collect();
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    out
}

fn series(label: String, system: &'static str, points: Vec<(f64, f64)>) -> Series {
    Series {
        label,
        system,
        points,
        limit: false,
        color: (0, 0, 0),
        marker: marker(system),
    }
}

/// The panels of `report`: for each op nuvec measured, latency then bandwidth.
pub fn panels(report: &Report) -> Vec<Panel> {
    let mut ops: Vec<Op> = Vec::new();
    for m in report.nuvec.iter().flat_map(|r| &r.measurements) {
        if !ops.contains(&m.op) {
            ops.push(m.op);
        }
    }
    let mut out = Vec::new();
    for op in ops {
        let mut latency = Vec::new();
        let mut bandwidth = Vec::new();
        // The (dtype, reduction) kinds nuvec measured; a label names them when they vary
        // or are not the anchors' (float32, sum).
        let mut kinds: Vec<(DType, Option<RedOp>)> = Vec::new();
        for m in report.nuvec.iter().flat_map(|r| &r.measurements) {
            if m.op == op && !kinds.contains(&(m.dtype, m.redop)) {
                kinds.push((m.dtype, m.redop));
            }
        }
        let name_dtype = kinds.iter().any(|k| k.0 != DType::F32);
        let name_redop = kinds.iter().any(|k| k.1 != kinds[0].1)
            || kinds
                .iter()
                .any(|k| !matches!(k.1, None | Some(RedOp::Sum)));
        for run in &report.nuvec {
            for &(dtype, redop) in &kinds {
                let ms = run
                    .measurements
                    .iter()
                    .filter(|m| m.op == op && m.dtype == dtype && m.redop == redop);
                if ms.clone().next().is_none() {
                    continue;
                }
                let mut label = format!("nuvec n={}", run.ranks);
                if name_dtype {
                    label.push_str(&format!(" {dtype}"));
                }
                if let Some(redop) = redop.filter(|_| name_redop) {
                    label.push_str(&format!(" {redop}"));
                }
                latency.push(series(
                    label.clone(),
                    "nuvec",
                    positive(ms.clone().map(|m| (m.bytes, m.median_us))),
                ));
                bandwidth.push(series(
                    label,
                    "nuvec",
                    positive(ms.map(|m| (m.bytes, m.busbw_gbs))),
                ));
            }
        }
        for (system, runs) in [("mlx", &report.mlx), ("mpi", &report.mpi)] {
            for run in runs {
                let ps = run.points.iter().filter(|p| p.op == op);
                if ps.clone().next().is_none() {
                    continue;
                }
                let label = if name_dtype {
                    format!("{system} n={} float32", run.ranks)
                } else {
                    format!("{system} n={}", run.ranks)
                };
                latency.push(series(
                    label.clone(),
                    system,
                    positive(ps.clone().map(|p| (p.bytes, p.median_us))),
                ));
                bandwidth.push(series(
                    label,
                    system,
                    positive(ps.map(|p| (p.bytes, p.busbw_gbs))),
                ));
            }
        }
        if let Some(limits) = &report.limits {
            let one_way = op == Op::SendRecv;
            let points = positive(limits.pingpong.iter().map(|p| {
                let v = if one_way {
                    p.rtt_median_us / 2.0
                } else {
                    p.rtt_median_us
                };
                (p.bytes, v)
            }));
            if !points.is_empty() {
                let label = if one_way {
                    "raw TCP one way"
                } else {
                    "raw TCP round trip"
                };
                latency.push(Series {
                    limit: true,
                    ..series(label.into(), "tcp", points)
                });
            }
            // The stream is measured at one size; as a limit it holds across the chart.
            let sizes: Vec<f64> = bandwidth
                .iter()
                .flat_map(|s| s.points.iter().map(|p| p.0))
                .collect();
            if let (Some(stream), Some(lo), Some(hi)) = (
                &limits.stream,
                sizes.iter().copied().reduce(f64::min),
                sizes.iter().copied().reduce(f64::max),
            ) && stream.gbps_per_direction > 0.0
            {
                let level = stream.gbps_per_direction;
                bandwidth.push(Series {
                    limit: true,
                    ..series(
                        "raw TCP both ways, per direction".into(),
                        "tcp",
                        vec![(lo, level), (hi, level)],
                    )
                });
            }
        }
        for (quantity, mut lines) in [
            (Quantity::Latency, latency),
            (Quantity::Bandwidth, bandwidth),
        ] {
            lines.retain(|s| !s.points.is_empty());
            assign_colors(&mut lines);
            let (title, legend) = match quantity {
                Quantity::Latency => ("median latency", SeriesLabelPosition::UpperLeft),
                Quantity::Bandwidth => ("bus bandwidth", SeriesLabelPosition::LowerRight),
            };
            // An all-reduce panel names the calls it shows (all_sum, all_max...).
            let mut calls: Vec<String> = Vec::new();
            for (_, redop) in &kinds {
                let call = match redop {
                    Some(r) if op == Op::AllSum => format!("all_{r}"),
                    _ => op.name().to_string(),
                };
                if !calls.contains(&call) {
                    calls.push(call);
                }
            }
            out.push(Panel {
                title: format!("{}: {title}", calls.join(", ")),
                quantity,
                series: lines,
                legend,
            });
        }
    }
    out
}

/// A size on the x axis, in binary units: `4 B`, `1 KiB`, `1.5 KiB`, `64 MiB`.
fn axis_bytes(x: f64) -> String {
    let (v, unit) = if x >= (1 << 30) as f64 {
        (x / (1 << 30) as f64, "GiB")
    } else if x >= (1 << 20) as f64 {
        (x / (1 << 20) as f64, "MiB")
    } else if x >= 1024.0 {
        (x / 1024.0, "KiB")
    } else {
        (x, "B")
    };
    format!("{} {unit}", short(v))
}

/// A number with at most three decimals and no trailing zeros.
fn short(v: f64) -> String {
    let text = format!("{v:.3}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    text.to_string()
}

/// A latency tick (the axis is in µs): `1 µs`, `10 µs`, `1 ms`, `2 s`.
fn axis_latency(us: f64) -> String {
    if us >= 1e6 {
        format!("{} s", short(us / 1e6))
    } else if us >= 1e3 {
        format!("{} ms", short(us / 1e3))
    } else {
        format!("{} µs", short(us))
    }
}

/// A bandwidth tick (the axis is in GB/s): `1 GB/s`, `100 MB/s`, `10 kB/s`.
fn axis_bandwidth(gbs: f64) -> String {
    if gbs >= 1.0 {
        format!("{} GB/s", short(gbs))
    } else if gbs >= 1e-3 {
        format!("{} MB/s", short(gbs * 1e3))
    } else if gbs >= 1e-6 {
        format!("{} kB/s", short(gbs * 1e6))
    } else {
        format!("{} B/s", short(gbs * 1e9))
    }
}

/// Ticks on powers of two between `lo` and `hi`: every `step`-th exponent, the smallest
/// step of 1, 2, 5, 10 that gives at most `most` ticks (steps that divide 10 keep 1 KiB and
/// 1 MiB among them).
fn size_ticks(lo: f64, hi: f64, most: usize) -> Vec<f64> {
    let (first, last) = (lo.log2().ceil() as i32, hi.log2().floor() as i32);
    for step in [1, 2, 5, 10, 20] {
        let ticks: Vec<f64> = (first..=last)
            .filter(|e| e.rem_euclid(step) == 0)
            .map(|e| 2f64.powi(e))
            .collect();
        if ticks.len() <= most {
            return ticks;
        }
    }
    vec![lo, hi]
}

/// A decade-aligned range holding `lo..hi` with room around the points.
fn decade_range(lo: f64, hi: f64) -> (f64, f64) {
    let lo = 10f64.powi((lo / 1.3).log10().floor() as i32);
    let hi = 10f64.powi((hi * 1.3).log10().ceil() as i32);
    (lo, if hi > lo { hi } else { lo * 10.0 })
}

/// Ticks on powers of ten within `lo..=hi`; with fewer than three decades, 2 and 5 of each
/// too.
fn decade_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let (first, last) = (lo.log10().round() as i32, hi.log10().round() as i32);
    let fine = last - first < 3;
    let mut ticks = Vec::new();
    for e in first..=last {
        let base = 10f64.powi(e);
        ticks.push(base);
        if fine && e < last {
            ticks.extend([2.0 * base, 5.0 * base]);
        }
    }
    ticks
}

fn draw_panel(area: &DrawingArea<SVGBackend<'_>, Shift>, panel: &Panel) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let all = || panel.series.iter().flat_map(|s| s.points.iter().copied());
    let (Some(x_lo), Some(x_hi)) = (
        all().map(|p| p.0).reduce(f64::min),
        all().map(|p| p.0).reduce(f64::max),
    ) else {
        // Nothing measured for this panel: say so rather than draw empty axes.
        area.titled(
            &format!("{} (nothing measured)", panel.title),
            ("sans-serif", 18),
        )
        .map_err(|e| err(&e))?;
        return Ok(());
    };
    let (y_lo, y_hi) = decade_range(
        all().map(|p| p.1).reduce(f64::min).unwrap_or(1.0),
        all().map(|p| p.1).reduce(f64::max).unwrap_or(1.0),
    );
    let (x_lo, x_hi) = (x_lo / 1.5, x_hi * 1.5);
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d(
            (x_lo..x_hi)
                .log_scale()
                .with_key_points(size_ticks(x_lo, x_hi, 9)),
            (y_lo..y_hi)
                .log_scale()
                .with_key_points(decade_ticks(y_lo, y_hi)),
        )
        .map_err(|e| err(&e))?;
    let (y_desc, y_label): (&str, fn(f64) -> String) = match panel.quantity {
        Quantity::Latency => ("median latency", axis_latency),
        Quantity::Bandwidth => ("bus bandwidth", axis_bandwidth),
    };
    chart
        .configure_mesh()
        .x_desc("bytes per rank")
        .y_desc(y_desc)
        .label_style(("sans-serif", 13))
        .axis_desc_style(("sans-serif", 14))
        .x_label_formatter(&|x| axis_bytes(*x))
        .y_label_formatter(&|y| y_label(*y))
        .draw()
        .map_err(|e| err(&e))?;
    for s in &panel.series {
        let (r, g, b) = s.color;
        let color = RGBColor(r, g, b);
        let style = color.stroke_width(2);
        let drawn = if s.limit {
            chart.draw_series(DashedLineSeries::new(s.points.clone(), 8, 5, style))
        } else {
            chart.draw_series(LineSeries::new(s.points.clone(), style))
        }
        .map_err(|e| err(&e))?;
        // The legend shows the line with its marker, so a series is found by either.
        let line = move |(x, y): (i32, i32)| {
            EmptyElement::at((x, y)) + PathElement::new(vec![(0, 0), (24, 0)], style)
        };
        // A filled marker of the plotters element `$shape` (made from its centre, a size and
        // a style), of `$size`: after the legend's line and on every point. A macro, as the
        // legend places it in pixels and the series in data coordinates.
        macro_rules! filled {
            ($shape:ident, $size:expr) => {{
                drawn
                    .label(s.label.as_str())
                    .legend(move |c| line(c) + $shape::new((12, 0), $size, color.filled()));
                chart
                    .draw_series(
                        s.points
                            .iter()
                            .map(|&p| $shape::new(p, $size, color.filled())),
                    )
                    .map_err(|e| err(&e))?;
            }};
        }
        match s.marker {
            None => {
                drawn.label(s.label.as_str()).legend(move |(x, y)| {
                    DashedPathElement::new(vec![(x, y), (x + 24, y)], 6, 4, style)
                });
                // Crosses on a limit's measured points: a limit of one point still shows.
                if s.points.len() == 1 {
                    chart
                        .draw_series(s.points.iter().map(|&p| Cross::new(p, 5, style)))
                        .map_err(|e| err(&e))?;
                }
            }
            Some(Marker::Circle) => filled!(Circle, 4),
            Some(Marker::Triangle) => filled!(TriangleMarker, 6),
            Some(Marker::Square) => {
                let square =
                    move |d: i32| Rectangle::new([(d - 4, -4), (d + 4, 4)], color.filled());
                drawn
                    .label(s.label.as_str())
                    .legend(move |c| line(c) + square(12));
                chart
                    .draw_series(s.points.iter().map(|&p| EmptyElement::at(p) + square(0)))
                    .map_err(|e| err(&e))?;
            }
        }
    }
    chart
        .configure_series_labels()
        .position(panel.legend.clone())
        .label_font(("sans-serif", 13))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    Ok(())
}

/// Draws `panels` two to a row as one SVG document.
///
/// # Errors
///
/// No panels, or plotters failed.
pub fn render_svg(panels: &[Panel]) -> Result<String, String> {
    if panels.is_empty() {
        return Err("nothing to chart".into());
    }
    let rows = panels.len().div_ceil(2);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1200, 420 * rows as u32)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        for (panel, area) in panels.iter().zip(root.split_evenly((rows, 2)).iter()) {
            draw_panel(area, panel)?;
        }
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}

/// Writes the chart of `report` to `path`, which must end in `.svg`.
///
/// # Errors
///
/// Another extension, nothing to chart, or the file cannot be written.
pub fn write_chart(path: &Path, report: &Report) -> Result<(), String> {
    if path.extension().and_then(|e| e.to_str()) != Some("svg") {
        return Err(format!(
            "{}: charts are SVG (PNG would need system fonts to draw text); name it .svg",
            path.display()
        ));
    }
    let svg = render_svg(&panels(report))?;
    std::fs::write(path, svg).map_err(|e| format!("writing {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::anchors::{AnchorPoint, AnchorRun};
    use crate::bench::Measurement;
    use crate::report::NuvecRun;

    fn report() -> Report {
        let sizes = [4usize, 1024, 1 << 20, 64 << 20];
        let nuvec = |ranks: usize, scale: f64| NuvecRun {
            ranks,
            transport: String::new(),
            measurements: sizes
                .iter()
                .map(|&bytes| Measurement {
                    op: Op::AllSum,
                    redop: Some(RedOp::Sum),
                    dtype: DType::F32,
                    ranks,
                    bytes,
                    count: bytes / 4,
                    iters: 10,
                    min_us: 5.0,
                    median_us: scale * (10.0 + bytes as f64 / 1000.0),
                    p99_us: 50.0,
                    max_us: 60.0,
                    algbw_gbs: bytes as f64 / 1e4,
                    busbw_gbs: bytes as f64 / 1e4 / scale,
                    wrong: 0,
                })
                .collect(),
        };
        Report {
            header: None,
            nuvec: vec![nuvec(2, 1.0), nuvec(3, 1.5)],
            mlx: vec![AnchorRun {
                system: "mlx-ring".into(),
                ranks: 2,
                version: None,
                eval_overhead_us: None,
                points: sizes
                    .iter()
                    .map(|&bytes| AnchorPoint {
                        op: Op::AllSum,
                        bytes,
                        iters: 10,
                        median_us: 60.0 + bytes as f64 / 300.0,
                        algbw_gbs: 0.1,
                        busbw_gbs: 0.1,
                        correct: true,
                    })
                    .collect(),
            }],
            mpi: vec![],
            limits: Some(crate::report::tests::limits(60.0, 1.1)),
            comparison: vec![],
        }
    }

    #[test]
    fn panels_hold_every_system_and_the_limits() {
        let panels = panels(&report());
        assert_eq!(panels.len(), 2);
        let labels: Vec<&str> = panels[0].series.iter().map(|s| s.label.as_str()).collect();
        assert_eq!(
            labels,
            ["nuvec n=2", "nuvec n=3", "mlx n=2", "raw TCP round trip"]
        );
        let bw = &panels[1];
        let limit = bw.series.last().unwrap();
        assert!(limit.limit);
        assert_eq!(limit.points, vec![(4.0, 1.1), ((64 << 20) as f64, 1.1)]);
        // Points are in size order, with the values given.
        assert_eq!(panels[0].series[0].points[0], (4.0, 10.004));
        assert_eq!(panels[0].series[0].points.len(), 4);
    }

    #[test]
    fn the_svg_draws_both_series() {
        let svg = render_svg(&panels(&report())).unwrap();
        if let Some(path) = std::env::var_os("NUVEC_CHART_SAMPLE") {
            std::fs::write(path, &svg).unwrap();
        }
        assert!(svg.starts_with("<svg"), "{}", &svg[..100.min(svg.len())]);
        assert!(svg.len() > 5000);
        for text in [
            "all_sum: median latency",
            "all_sum: bus bandwidth",
            "nuvec n=2",
            "nuvec n=3",
            "mlx n=2",
            "raw TCP round trip",
            "raw TCP both ways, per direction",
            "bytes per rank",
        ] {
            assert!(svg.contains(text), "no {text:?} in the SVG");
        }
        // One line per series and panel: 4 latency lines and 4 bandwidth lines (one dashed
        // limit is drawn as many short segments).
        assert!(svg.matches("<polyline").count() >= 8);
        // nuvec's colour and MLX's both appear, and so does the colour given to nuvec's
        // second rank count.
        for colour in ["#0072B2", "#D55E00", "#CC79A7"] {
            assert!(svg.contains(colour), "no {colour} in the SVG");
        }
        // Ticks carry their units.
        for tick in ["1 KiB", "1 MiB", "10 µs", "1 ms", "100 MB/s", "1 GB/s"] {
            assert!(
                svg.contains(&format!("\n{tick}\n")),
                "no tick {tick:?} in the SVG"
            );
        }
        assert!(!svg.contains("\n100000\n"));
    }

    #[test]
    fn charts_are_svg_files() {
        let dir = tempfile::tempdir().unwrap();
        let png = dir.path().join("chart.png");
        assert!(write_chart(&png, &report()).unwrap_err().contains("SVG"));
        let svg = dir.path().join("chart.svg");
        write_chart(&svg, &report()).unwrap();
        assert!(std::fs::read_to_string(&svg).unwrap().contains("nuvec n=2"));
        assert!(render_svg(&[]).is_err());
    }

    #[test]
    fn each_system_has_its_colour_and_marker() {
        let panels = panels(&report());
        let lat = &panels[0].series;
        let colours: Vec<(u8, u8, u8)> = lat.iter().map(|s| s.color).collect();
        assert_eq!(
            colours,
            [(0, 114, 178), (204, 121, 167), (213, 94, 0), (96, 96, 96)]
        );
        let markers: Vec<Option<Marker>> = lat.iter().map(|s| s.marker).collect();
        assert_eq!(
            markers,
            [
                Some(Marker::Circle),
                Some(Marker::Circle),
                Some(Marker::Triangle),
                None
            ]
        );
        // Two runs of one system never share a colour (nor that of another system).
        let mut distinct = colours.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), colours.len());
    }

    #[test]
    fn labels_name_dtype_and_reduction_when_they_vary() {
        let mut report = report();
        let mut max = report.nuvec[0].measurements.clone();
        for m in &mut max {
            m.redop = Some(RedOp::Max);
            m.dtype = DType::BF16;
        }
        report.nuvec[0].measurements.extend(max);
        let labels: Vec<String> = panels(&report)[0]
            .series
            .iter()
            .map(|s| s.label.clone())
            .collect();
        assert_eq!(panels(&report)[1].title, "all_sum, all_max: bus bandwidth");
        assert_eq!(
            labels[..4],
            [
                "nuvec n=2 float32 sum",
                "nuvec n=2 bfloat16 max",
                "nuvec n=3 float32 sum",
                "mlx n=2 float32"
            ]
        );
    }

    #[test]
    fn tick_labels() {
        assert_eq!(axis_bytes(4.0), "4 B");
        assert_eq!(axis_bytes(1024.0), "1 KiB");
        assert_eq!(axis_bytes(1536.0), "1.5 KiB");
        assert_eq!(axis_bytes((64 << 20) as f64), "64 MiB");
        assert_eq!(axis_latency(1.0), "1 µs");
        assert_eq!(axis_latency(10.0), "10 µs");
        assert_eq!(axis_latency(1000.0), "1 ms");
        assert_eq!(axis_latency(2e5), "200 ms");
        assert_eq!(axis_latency(1e7), "10 s");
        assert_eq!(axis_latency(0.5), "0.5 µs");
        assert_eq!(axis_bandwidth(1.0), "1 GB/s");
        assert_eq!(axis_bandwidth(0.1), "100 MB/s");
        assert_eq!(axis_bandwidth(0.00001), "10 kB/s");
        assert_eq!(axis_bandwidth(20.0), "20 GB/s");
    }

    #[test]
    fn ticks_fall_on_powers() {
        // 4 B to 64 MiB: every fifth power of two, which holds 1 KiB and 1 MiB.
        let ticks = size_ticks(4.0 / 1.5, (64 << 20) as f64 * 1.5, 9);
        let labels: Vec<String> = ticks.iter().map(|&t| axis_bytes(t)).collect();
        assert_eq!(labels, ["32 B", "1 KiB", "32 KiB", "1 MiB", "32 MiB"]);
        // 4 B to 8 KiB: every second one.
        let ticks = size_ticks(4.0 / 1.5, 8192.0 * 1.5, 9);
        let labels: Vec<String> = ticks.iter().map(|&t| axis_bytes(t)).collect();
        assert_eq!(labels, ["4 B", "16 B", "64 B", "256 B", "1 KiB", "4 KiB"]);
        // A narrow range ticks every power.
        assert_eq!(size_ticks(3.0, 40.0, 9), [4.0, 8.0, 16.0, 32.0]);
        // Decades, with 2 and 5 between when there are few.
        assert_eq!(decade_range(12.0, 50_000.0), (1.0, 1e5));
        assert_eq!(decade_ticks(10.0, 1e5), [10.0, 100.0, 1e3, 1e4, 1e5]);
        assert_eq!(
            decade_ticks(0.1, 10.0),
            [0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0]
        );
        assert_eq!(decade_range(0.5, 0.5), (0.1, 1.0));
    }
}
