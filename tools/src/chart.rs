//! Charts of a `nuvec bench` run, drawn with plotters' SVG backend: per op, median latency
//! against size and bus bandwidth against size (both log-log), one line per system and rank
//! count, the raw TCP limits dashed.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::bench::Op;
use crate::report::Report;

/// One line of a chart.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    /// The legend's text, e.g. `nuvec n=2`.
    pub label: String,
    /// (bytes per rank, value), in size order; only positive values.
    pub points: Vec<(f64, f64)>,
    /// A limit (drawn dashed, without markers) rather than a measurement.
    pub limit: bool,
    /// Its colour.
    pub color: (u8, u8, u8),
}

/// One chart: a title, what its y axis shows, and its lines.
#[derive(Clone, Debug)]
pub struct Panel {
    /// The caption.
    pub title: String,
    /// The y axis's description.
    pub y_desc: String,
    /// The lines.
    pub series: Vec<Series>,
    /// Where the legend goes: where the lines are not (they rise with size).
    pub legend: SeriesLabelPosition,
}

/// Colours per system, one shade per rank count (by position in the run).
fn color(system: &str, index: usize) -> (u8, u8, u8) {
    let shades: &[(u8, u8, u8)] = match system {
        "nuvec" => &[
            (31, 119, 180),
            (8, 48, 107),
            (107, 174, 214),
            (66, 146, 198),
        ],
        "mlx" => &[(255, 127, 14), (166, 54, 3), (253, 174, 107), (230, 85, 13)],
        "mpi" => &[(44, 160, 44), (0, 68, 27), (116, 196, 118), (35, 139, 69)],
        _ => &[(90, 90, 90), (150, 150, 150)],
    };
    shades[index % shades.len()]
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
        for (i, run) in report.nuvec.iter().enumerate() {
            let ms = run.measurements.iter().filter(|m| m.op == op);
            let label = format!("nuvec n={}", run.ranks);
            latency.push(Series {
                label: label.clone(),
                points: positive(ms.clone().map(|m| (m.bytes, m.median_us))),
                limit: false,
                color: color("nuvec", i),
            });
            bandwidth.push(Series {
                label,
                points: positive(ms.map(|m| (m.bytes, m.busbw_gbs))),
                limit: false,
                color: color("nuvec", i),
            });
        }
        for (system, runs) in [("mlx", &report.mlx), ("mpi", &report.mpi)] {
            for (i, run) in runs.iter().enumerate() {
                let ps = run.points.iter().filter(|p| p.op == op);
                if ps.clone().next().is_none() {
                    continue;
                }
                let label = format!("{system} n={}", run.ranks);
                latency.push(Series {
                    label: label.clone(),
                    points: positive(ps.clone().map(|p| (p.bytes, p.median_us))),
                    limit: false,
                    color: color(system, i),
                });
                bandwidth.push(Series {
                    label,
                    points: positive(ps.map(|p| (p.bytes, p.busbw_gbs))),
                    limit: false,
                    color: color(system, i),
                });
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
                latency.push(Series {
                    label: if one_way {
                        "raw TCP one way".into()
                    } else {
                        "raw TCP round trip".into()
                    },
                    points,
                    limit: true,
                    color: color("tcp", 0),
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
                bandwidth.push(Series {
                    label: "raw TCP both ways, per direction".into(),
                    points: vec![
                        (lo, stream.gbps_per_direction),
                        (hi, stream.gbps_per_direction),
                    ],
                    limit: true,
                    color: color("tcp", 1),
                });
            }
        }
        latency.retain(|s| !s.points.is_empty());
        bandwidth.retain(|s| !s.points.is_empty());
        out.push(Panel {
            title: format!("{op}: median latency"),
            y_desc: "µs".into(),
            series: latency,
            legend: SeriesLabelPosition::UpperLeft,
        });
        out.push(Panel {
            title: format!("{op}: bus bandwidth"),
            y_desc: "GB/s".into(),
            series: bandwidth,
            legend: SeriesLabelPosition::LowerRight,
        });
    }
    out
}

/// A size on the x axis: bytes, KiB or MiB.
fn axis_bytes(x: f64) -> String {
    let (v, unit) = if x >= (1 << 20) as f64 {
        (x / (1 << 20) as f64, "MiB")
    } else if x >= 1024.0 {
        (x / 1024.0, "KiB")
    } else {
        (x, "B")
    };
    let text = format!("{v:.1}");
    format!("{} {unit}", text.trim_end_matches(".0"))
}

/// A value on a log axis with as many decimals as its size needs.
fn axis_value(y: f64) -> String {
    if y <= 0.0 || !y.is_finite() {
        return format!("{y}");
    }
    let decimals = (-y.log10().floor()).max(0.0) as usize;
    format!("{y:.decimals$}")
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
    let y_lo = all().map(|p| p.1).reduce(f64::min).unwrap_or(1.0);
    let y_hi = all().map(|p| p.1).reduce(f64::max).unwrap_or(1.0);
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(
            // Sizes are powers of two: so are the ticks.
            (x_lo / 1.5..x_hi * 1.5).log_scale().base(2.0),
            (y_lo / 2.0..y_hi * 2.0).log_scale(),
        )
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("bytes per rank")
        .y_desc(&panel.y_desc)
        .x_label_formatter(&|x| axis_bytes(*x))
        .y_label_formatter(&|y| axis_value(*y))
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
        drawn
            .label(s.label.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        if !s.limit {
            chart
                .draw_series(s.points.iter().map(|&p| Circle::new(p, 3, color.filled())))
                .map_err(|e| err(&e))?;
        }
    }
    chart
        .configure_series_labels()
        .position(panel.legend.clone())
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
    use crate::anchors::{AnchorPoint, AnchorRun, Limits, PingPong, Stream};
    use crate::bench::Measurement;
    use crate::report::NuvecRun;

    fn report() -> Report {
        let sizes = [4usize, 1024, 1 << 20, 64 << 20];
        let nuvec = |ranks: usize, scale: f64| NuvecRun {
            ranks,
            measurements: sizes
                .iter()
                .map(|&bytes| Measurement {
                    op: Op::AllSum,
                    ranks,
                    bytes,
                    iters: 10,
                    min_us: 5.0,
                    median_us: scale * (10.0 + bytes as f64 / 1000.0),
                    p99_us: 50.0,
                    max_us: 60.0,
                    algbw_gbs: bytes as f64 / 1e4,
                    busbw_gbs: bytes as f64 / 1e4 / scale,
                    correct: true,
                })
                .collect(),
        };
        Report {
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
            limits: Some(Limits {
                pingpong: vec![PingPong {
                    bytes: 4,
                    iters: 100,
                    rtt_median_us: 8.0,
                    rtt_p10_us: 7.0,
                    rtt_p90_us: 9.0,
                    rtt_min_us: 6.0,
                }],
                stream: Some(Stream {
                    bytes: 64 << 20,
                    reps: 5,
                    bidir: true,
                    time_ms_median: 60.0,
                    gbps_per_direction: 1.1,
                    gbps_best: 1.4,
                }),
            }),
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
        // nuvec's colour and MLX's both appear.
        assert!(
            svg.contains("#1F77B4") && svg.contains("#FF7F0E"),
            "colours missing"
        );
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
    fn axis_labels() {
        assert_eq!(axis_bytes(4.0), "4 B");
        assert_eq!(axis_bytes(1024.0), "1 KiB");
        assert_eq!(axis_bytes(1536.0), "1.5 KiB");
        assert_eq!(axis_bytes((64 << 20) as f64), "64 MiB");
        assert_eq!(axis_value(100.0), "100");
        assert_eq!(axis_value(0.05), "0.05");
        assert_eq!(axis_value(0.0001), "0.0001");
    }
}
