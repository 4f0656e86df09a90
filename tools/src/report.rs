//! What `nuvec bench` reports when it ran anchors too: per op and rank count, nuvec's
//! median latency and bus bandwidth beside MLX's ring, Open MPI over TCP and the raw TCP
//! limits, with ratios, and one JSON document with everything.
//!
//! Ratios: for latency, anchor / nuvec (above 1, nuvec is faster) — for the TCP limit that
//! is the share of the floor reached (1 is at the floor); for bandwidth, nuvec's bus
//! bandwidth / the bidirectional stream's per-direction bandwidth (1 is at the limit).
//! The latency limit is the raw ping-pong: one way (half the round trip) beside sendrecv,
//! which is measured the same way, and the round trip beside the collectives, whose
//! smallest case (a 2-rank all_sum) needs at least one exchange. It bounds small messages
//! only: a ping-pong sends a whole large message each way in turn, which a collective
//! does not have to do.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::anchors::{AnchorRun, Limits};
use crate::bench::{Measurement, Op, human, micros};

/// nuvec's sweep for one number of ranks.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NuvecRun {
    /// Ranks.
    pub ranks: usize,
    /// What rank 0 reported.
    pub measurements: Vec<Measurement>,
}

/// One (op, ranks, size) compared.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// The collective.
    pub op: Op,
    /// Ranks.
    pub ranks: usize,
    /// Bytes per rank.
    pub bytes: usize,
    /// nuvec's median, µs.
    pub nuvec_median_us: f64,
    /// nuvec's bus bandwidth, GB/s.
    pub nuvec_busbw_gbs: f64,
    /// MLX ring's median, µs.
    pub mlx_median_us: Option<f64>,
    /// MLX / nuvec latency.
    pub mlx_over_nuvec: Option<f64>,
    /// MLX ring's bus bandwidth, GB/s.
    pub mlx_busbw_gbs: Option<f64>,
    /// Open MPI's median, µs.
    pub mpi_median_us: Option<f64>,
    /// MPI / nuvec latency.
    pub mpi_over_nuvec: Option<f64>,
    /// Open MPI's bus bandwidth, GB/s.
    pub mpi_busbw_gbs: Option<f64>,
    /// The raw TCP latency for this row (one way for sendrecv, else the round trip), µs.
    pub tcp_latency_us: Option<f64>,
    /// TCP limit / nuvec latency.
    pub tcp_over_nuvec: Option<f64>,
    /// The bidirectional stream, GB/s per direction.
    pub stream_limit_gbs: Option<f64>,
    /// nuvec's bus bandwidth / the stream limit.
    pub nuvec_over_limit: Option<f64>,
}

/// Everything one `nuvec bench` run measured.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Report {
    /// nuvec, per rank count.
    pub nuvec: Vec<NuvecRun>,
    /// MLX's ring, per rank count.
    pub mlx: Vec<AnchorRun>,
    /// Open MPI over TCP, per rank count.
    pub mpi: Vec<AnchorRun>,
    /// The raw TCP limits.
    pub limits: Option<Limits>,
    /// The comparison, row by row.
    pub comparison: Vec<Row>,
}

impl Report {
    /// Fills [`Report::comparison`] from the measurements.
    pub fn compare(&mut self) {
        self.comparison = compare(&self.nuvec, &self.mlx, &self.mpi, self.limits.as_ref());
    }

    /// Whether anything besides nuvec was measured.
    pub fn has_anchors(&self) -> bool {
        !self.mlx.is_empty() || !self.mpi.is_empty() || self.limits.is_some()
    }
}

/// One row per nuvec measurement, with what the anchors measured at the same op, ranks and
/// size.
pub fn compare(
    nuvec: &[NuvecRun],
    mlx: &[AnchorRun],
    mpi: &[AnchorRun],
    limits: Option<&Limits>,
) -> Vec<Row> {
    let ratio = |a: Option<f64>, b: f64| a.filter(|_| b > 0.0).map(|a| a / b);
    let mut rows = Vec::new();
    for run in nuvec {
        let find = |runs: &[AnchorRun], m: &Measurement| {
            runs.iter()
                .find(|r| r.ranks == run.ranks)
                .and_then(|r| r.point(m.op, m.bytes))
                .cloned()
        };
        for m in &run.measurements {
            let mlx = find(mlx, m);
            let mpi = find(mpi, m);
            let tcp = limits.and_then(|l| l.pingpong(m.bytes)).map(|p| {
                if m.op == Op::SendRecv {
                    p.rtt_median_us / 2.0
                } else {
                    p.rtt_median_us
                }
            });
            let stream = limits
                .and_then(|l| l.stream.as_ref())
                .map(|s| s.gbps_per_direction);
            rows.push(Row {
                op: m.op,
                ranks: run.ranks,
                bytes: m.bytes,
                nuvec_median_us: m.median_us,
                nuvec_busbw_gbs: m.busbw_gbs,
                mlx_median_us: mlx.as_ref().map(|p| p.median_us),
                mlx_over_nuvec: ratio(mlx.as_ref().map(|p| p.median_us), m.median_us),
                mlx_busbw_gbs: mlx.as_ref().map(|p| p.busbw_gbs),
                mpi_median_us: mpi.as_ref().map(|p| p.median_us),
                mpi_over_nuvec: ratio(mpi.as_ref().map(|p| p.median_us), m.median_us),
                mpi_busbw_gbs: mpi.as_ref().map(|p| p.busbw_gbs),
                tcp_latency_us: tcp,
                tcp_over_nuvec: ratio(tcp, m.median_us),
                stream_limit_gbs: stream,
                nuvec_over_limit: stream.filter(|&s| s > 0.0).map(|s| m.busbw_gbs / s),
            });
        }
    }
    rows
}

/// The comparison as text tables, one per (op, ranks); only the columns of anchors that
/// ran.
pub fn comparison_table(rows: &[Row]) -> String {
    let has = |f: fn(&Row) -> bool| rows.iter().any(f);
    let (mlx, mpi) = (
        has(|r| r.mlx_median_us.is_some()),
        has(|r| r.mpi_median_us.is_some()),
    );
    let (tcp, stream) = (
        has(|r| r.tcp_latency_us.is_some()),
        has(|r| r.stream_limit_gbs.is_some()),
    );
    let mut out = String::new();
    let groups: BTreeSet<(usize, usize)> = rows.iter().map(|r| (op_order(r.op), r.ranks)).collect();
    for (order, ranks) in groups {
        let group: Vec<&Row> = rows
            .iter()
            .filter(|r| op_order(r.op) == order && r.ranks == ranks)
            .collect();
        let op = group[0].op;
        out.push_str(&format!(
            "\n{op}, {ranks} ranks: median latency and bus bandwidth (GB/s) against the anchors\n"
        ));
        let mut head = format!("{:>8} {:>10}", "size", "nuvec");
        if mlx {
            head.push_str(&format!(" {:>10} {:>6}", "mlx", "x"));
        }
        if mpi {
            head.push_str(&format!(" {:>10} {:>6}", "mpi", "x"));
        }
        if tcp {
            let name = if op == Op::SendRecv {
                "tcp 1-way"
            } else {
                "tcp rtt"
            };
            head.push_str(&format!(" {name:>10} {:>6}", "x"));
        }
        head.push_str(&format!(" | {:>8}", "nuvec"));
        if mlx {
            head.push_str(&format!(" {:>8}", "mlx"));
        }
        if mpi {
            head.push_str(&format!(" {:>8}", "mpi"));
        }
        if stream {
            head.push_str(&format!(" {:>8}", "of limit"));
        }
        out.push_str(&head);
        out.push('\n');
        for r in group {
            let lat = |v: Option<f64>| v.map(micros).unwrap_or_else(|| "-".into());
            let x = |v: Option<f64>| v.map(|v| format!("{v:.2}")).unwrap_or_else(|| "-".into());
            let bw = |v: Option<f64>| v.map(|v| format!("{v:.3}")).unwrap_or_else(|| "-".into());
            let mut line = format!("{:>8} {:>10}", human(r.bytes), micros(r.nuvec_median_us));
            if mlx {
                line.push_str(&format!(
                    " {:>10} {:>6}",
                    lat(r.mlx_median_us),
                    x(r.mlx_over_nuvec)
                ));
            }
            if mpi {
                line.push_str(&format!(
                    " {:>10} {:>6}",
                    lat(r.mpi_median_us),
                    x(r.mpi_over_nuvec)
                ));
            }
            if tcp {
                line.push_str(&format!(
                    " {:>10} {:>6}",
                    lat(r.tcp_latency_us),
                    x(r.tcp_over_nuvec)
                ));
            }
            line.push_str(&format!(" | {:>8}", bw(Some(r.nuvec_busbw_gbs))));
            if mlx {
                line.push_str(&format!(" {:>8}", bw(r.mlx_busbw_gbs)));
            }
            if mpi {
                line.push_str(&format!(" {:>8}", bw(r.mpi_busbw_gbs)));
            }
            if stream {
                line.push_str(&format!(" {:>8}", x(r.nuvec_over_limit)));
            }
            out.push_str(&line);
            out.push('\n');
        }
    }
    let mut notes = Vec::new();
    if mlx || mpi {
        notes.push("x after an anchor: its latency / nuvec's (above 1: nuvec is faster)");
    }
    if tcp {
        notes.push(
            "x after tcp: raw TCP ping-pong latency at the same size / nuvec's (1: at that \
             floor; a floor for small messages only, since a ping-pong sends the whole \
             message each way in turn)",
        );
    }
    if stream {
        notes.push("of limit: nuvec's bus bandwidth / raw TCP both ways at once, per direction");
    }
    if let Some(s) = rows.iter().find_map(|r| r.stream_limit_gbs) {
        out.push_str(&format!("\nTCP stream limit: {s:.3} GB/s per direction\n"));
    }
    for note in notes {
        out.push_str(note);
        out.push('\n');
    }
    out
}

fn op_order(op: Op) -> usize {
    [Op::AllSum, Op::AllGather, Op::SumScatter, Op::SendRecv]
        .iter()
        .position(|&o| o == op)
        .unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::anchors::{AnchorPoint, PingPong, Stream};

    fn measurement(
        op: Op,
        ranks: usize,
        bytes: usize,
        median_us: f64,
        busbw_gbs: f64,
    ) -> Measurement {
        Measurement {
            op,
            ranks,
            bytes,
            iters: 100,
            min_us: median_us,
            median_us,
            p99_us: median_us,
            max_us: median_us,
            algbw_gbs: busbw_gbs,
            busbw_gbs,
            correct: true,
        }
    }

    fn point(op: Op, bytes: usize, median_us: f64, busbw_gbs: f64) -> AnchorPoint {
        AnchorPoint {
            op,
            bytes,
            iters: 100,
            median_us,
            algbw_gbs: busbw_gbs,
            busbw_gbs,
            correct: true,
        }
    }

    fn sample() -> Report {
        let mut report = Report {
            nuvec: vec![NuvecRun {
                ranks: 2,
                measurements: vec![
                    measurement(Op::AllSum, 2, 4, 10.0, 0.0004),
                    measurement(Op::AllSum, 2, 64 << 20, 80_000.0, 0.8),
                    measurement(Op::SendRecv, 2, 4, 5.0, 0.0008),
                ],
            }],
            mlx: vec![AnchorRun {
                system: "mlx-ring".into(),
                ranks: 2,
                version: Some("0.32.4".into()),
                eval_overhead_us: Some(20.0),
                points: vec![point(Op::AllSum, 4, 60.0, 0.00007)],
            }],
            mpi: vec![],
            limits: Some(Limits {
                pingpong: vec![PingPong {
                    bytes: 4,
                    iters: 1000,
                    rtt_median_us: 8.0,
                    rtt_p10_us: 7.0,
                    rtt_p90_us: 9.0,
                    rtt_min_us: 6.0,
                }],
                stream: Some(Stream {
                    bytes: 64 << 20,
                    reps: 20,
                    bidir: true,
                    time_ms_median: 64.0,
                    gbps_per_direction: 1.0,
                    gbps_best: 1.4,
                }),
            }),
            comparison: vec![],
        };
        report.compare();
        report
    }

    #[test]
    fn rows_pair_each_measurement_with_the_anchors() {
        let report = sample();
        let rows = &report.comparison;
        assert_eq!(rows.len(), 3);
        let small = &rows[0];
        assert_eq!((small.op, small.ranks, small.bytes), (Op::AllSum, 2, 4));
        assert_eq!(small.mlx_median_us, Some(60.0));
        assert_eq!(small.mlx_over_nuvec, Some(6.0));
        assert_eq!(small.mpi_median_us, None);
        // Beside a collective, the TCP floor is the round trip.
        assert_eq!(small.tcp_latency_us, Some(8.0));
        assert_eq!(small.tcp_over_nuvec, Some(0.8));
        let big = &rows[1];
        assert_eq!((big.mlx_median_us, big.tcp_latency_us), (None, None));
        assert_eq!(big.stream_limit_gbs, Some(1.0));
        assert!((big.nuvec_over_limit.unwrap() - 0.8).abs() < 1e-12);
        // Beside sendrecv, one way.
        assert_eq!(rows[2].tcp_latency_us, Some(4.0));
        assert_eq!(rows[2].tcp_over_nuvec, Some(0.8));
    }

    #[test]
    fn the_table_shows_the_anchors_that_ran() {
        let text = comparison_table(&sample().comparison);
        assert!(text.contains("all_sum, 2 ranks"), "{text}");
        assert!(text.contains("sendrecv, 2 ranks"), "{text}");
        assert!(text.contains("mlx") && text.contains("tcp rtt") && text.contains("tcp 1-way"));
        assert!(
            !text.contains(" mpi "),
            "no MPI column without MPI runs:\n{text}"
        );
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with("4 B"))
            .unwrap();
        assert!(line.contains("6.00") && line.contains("0.80"), "{line}");
        assert!(text.contains("TCP stream limit: 1.000 GB/s"));
    }

    #[test]
    fn the_report_round_trips_through_json() {
        let report = sample();
        let text = serde_json::to_string(&report).unwrap();
        let back: Report = serde_json::from_str(&text).unwrap();
        assert_eq!(back.comparison, report.comparison);
        assert_eq!(back.mlx, report.mlx);
        assert!(text.contains("\"op\":\"sendrecv\""), "{text}");
    }
}
