//! Where the diagnostics go: to the program's `log` logger when it installs one, and to
//! stderr in MLX's `[ring] rank R: ...` form when it does not and `MLX_RING_VERBOSE` is set.
//! Each case runs two real ranks on loopback, since a logger is global to a process.

use std::sync::Mutex;

use log::{Level, LevelFilter, Log, Metadata, Record};
use nuvec_tools::testing::{self, Launch, RankOutput};

/// Prints every record it takes on stdout, as `LOG <level> <target> <message>`; takes
/// records up to `info`.
struct Printer(Mutex<()>);

impl Log for Printer {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.level() <= Level::Info
    }

    fn log(&self, record: &Record<'_>) {
        if self.enabled(record.metadata()) {
            let _one_at_a_time = self.0.lock();
            println!(
                "LOG {} {} {}",
                record.level(),
                record.target(),
                record.args()
            );
        }
    }

    fn flush(&self) {}
}

static PRINTER: Printer = Printer(Mutex::new(()));

fn sum_once() {
    let g = nuvec_distributed_engine::init(true).expect("the ring forms");
    let mut x = [1.0f32; 8];
    g.all_sum(&mut x).unwrap();
    assert_eq!(x, [2.0; 8]);
}

/// Runs [`sum_once`] on every rank of `launch` with [`PRINTER`] as the logger, taking
/// what is at `level` or above; checks that every rank finished and returns what each
/// printed (nothing in the ranks themselves).
fn sum_with_logger(launch: &Launch, name: &str, level: LevelFilter) -> Vec<RankOutput> {
    let outputs = launch
        .run_raw(name, || {
            log::set_logger(&PRINTER).unwrap();
            log::set_max_level(level);
            sum_once();
        })
        .unwrap_or_default();
    for o in &outputs {
        o.assert_finished();
    }
    outputs
}

/// How many lines [`PRINTER`] took on `o`'s rank at info from module `module` of the engine
/// saying that its `what` formed ("rank R: {what} formed in ...").
fn formed_lines(o: &RankOutput, module: &str, what: &str) -> usize {
    let start = format!("rank {}: {what} formed in ", o.rank);
    o.lines(&format!("LOG INFO nuvec_distributed_engine::{module} "))
        .into_iter()
        .filter(|l| l.starts_with(&start))
        .count()
}

fn stderr_lines<'a>(o: &'a RankOutput, prefix: &str) -> Vec<&'a str> {
    o.stderr.lines().filter(|l| l.starts_with(prefix)).collect()
}

#[test]
fn without_a_logger_mlx_ring_verbose_writes_mlx_s_lines_to_stderr() {
    let name = "without_a_logger_mlx_ring_verbose_writes_mlx_s_lines_to_stderr";
    let launch = Launch::new(2, 1).env("MLX_RING_VERBOSE", "1");
    let Some(outputs) = launch.run_raw(name, sum_once) else {
        return;
    };
    for o in &outputs {
        o.assert_finished();
        let ours = stderr_lines(o, &format!("[ring] rank {}: ", o.rank));
        assert!(
            ours.iter().any(|l| l.contains(": forming a ring of 2 "))
                && ours.iter().any(|l| l.contains(": ring formed in ")),
            "rank {}'s stderr lacks the forming lines:\n{}",
            o.rank,
            o.stderr
        );
        assert!(!o.stdout.contains("LOG "), "{o}");
    }
}

#[test]
fn without_a_logger_or_a_variable_nothing_is_written() {
    let name = "without_a_logger_or_a_variable_nothing_is_written";
    let launch = Launch::new(2, 1).command(move |_| {
        let mut c = testing::this_test(name);
        c.env_remove("MLX_RING_VERBOSE")
            .env_remove("NUVEC_DISTRIBUTED_VERBOSE");
        c
    });
    let Some(outputs) = launch.run_raw(name, sum_once) else {
        return;
    };
    for o in &outputs {
        o.assert_finished();
        assert!(stderr_lines(o, "[ring]").is_empty(), "{o}");
    }
}

#[test]
fn a_logger_gets_the_lines_it_takes_and_stderr_the_others() {
    let name = "a_logger_gets_the_lines_it_takes_and_stderr_the_others";
    let launch = Launch::new(2, 1).env("NUVEC_DISTRIBUTED_VERBOSE", "");
    for o in &sum_with_logger(&launch, name, LevelFilter::Trace) {
        let r = o.rank;
        // "ring formed" is at info: the logger takes it, with the backend's target and the
        // rank in the message, and it is not written to stderr as well.
        assert_eq!(formed_lines(o, "ring", "ring"), 1, "rank {r}:\n{o}");
        assert!(
            !o.stderr.contains("ring formed"),
            "rank {r} wrote a line its logger took to stderr too:\n{o}"
        );
        // "forming a ring" is at debug, which the logger refuses: under the variable it
        // goes to stderr as MLX's line.
        assert!(
            stderr_lines(o, &format!("[ring] rank {r}: forming a ring of 2 ")).len() == 1,
            "rank {r}:\n{o}"
        );
        assert!(!o.stdout.contains("forming a ring"), "rank {r}:\n{o}");
    }
}

#[test]
fn on_the_native_wire_a_logger_at_info_gets_the_formed_line() {
    let name = "on_the_native_wire_a_logger_at_info_gets_the_formed_line";
    let launch = Launch::new(2, 1).env("NUVEC_DISTRIBUTED_WIRE", "native");
    for o in &sum_with_logger(&launch, name, LevelFilter::Info) {
        assert_eq!(
            formed_lines(o, "native", "native mesh"),
            1,
            "rank {}:\n{o}",
            o.rank
        );
    }
}

/// What rank 0 of a ring of two says while rank 1 never comes, and the error it ends with:
/// on each wire, with rank 1's port free (nothing listens) and taken by another program
/// (a port clash: rank 0's connection lands there, and rank 1 never connects back).
#[test]
fn a_forming_rank_says_whom_it_waits_for_and_names_the_missing_peer_by_its_address() {
    let name = "a_forming_rank_says_whom_it_waits_for_and_names_the_missing_peer_by_its_address";
    if testing::as_rank(name, || {
        let e = nuvec_distributed_engine::init(true).unwrap_err();
        println!("ERROR {e}");
        println!("DEBUG {e:?}");
    }) {
        return;
    }
    let mut cases = Vec::new();
    for wire in ["mlx", "native"] {
        for clash in [false, true] {
            let mut nodes = testing::loopback_nodes(&testing::free_ports(2, 1));
            // The other program holds a port the kernel chose, so that nothing else can be
            // listening there already.
            let squatter = clash.then(|| std::net::TcpListener::bind("127.0.0.1:0").unwrap());
            if let Some(s) = &squatter {
                nodes[1][0] = s.local_addr().unwrap().to_string();
            }
            let (mine, theirs) = (nodes[0][0].clone(), nodes[1][0].clone());
            let ranks = Launch::new(2, 1)
                .nodes(nodes)
                .skip(1)
                .timeout(3.0)
                .env("NUVEC_DISTRIBUTED_WIRE", wire)
                .env("NUVEC_DISTRIBUTED_VERBOSE", "1")
                .spawn(name);
            cases.push((wire, clash, mine, theirs, squatter, ranks));
        }
    }
    for (wire, clash, mine, theirs, _squatter, ranks) in cases {
        let outputs = ranks.finish();
        let o = &outputs[0];
        let case = format!(
            "{wire} wire, rank 1's port {}",
            if clash { "taken" } else { "free" }
        );
        let component = if wire == "mlx" { "ring" } else { "native" };
        let reports: Vec<&str> = o
            .stderr
            .lines()
            .filter(|l| l.starts_with(&format!("[{component}] rank 0: still forming the ")))
            .collect();
        assert!(!reports.is_empty(), "{case}: no report while forming:\n{o}");
        // Every report names rank 1 by its own address as the one that has not connected
        // to this rank's.
        for report in &reports {
            assert!(
                report.contains(&format!(
                    "rank 1 ({theirs}) to connect to this rank's {mine}"
                )),
                "{case}: {report}"
            );
        }
        // Rank 1's port is free: rank 0's own connection is refused, and the report says so.
        if !clash {
            assert!(
                reports[0].contains("rank 1 to accept ") && reports[0].contains(&theirs),
                "{case}: {}",
                reports[0]
            );
        }
        let error = o.lines("ERROR ").into_iter().next().unwrap_or_else(|| {
            panic!("{case}: rank 0 printed no error:\n{o}");
        });
        // The error names rank 1 beside its own address, never this rank's.
        assert!(
            error.starts_with(&format!("rank 1 ({theirs})")) && !error.contains(&mine),
            "{case}: {error}"
        );
        if clash && wire == "mlx" {
            assert!(
                error.contains("did not connect to this rank within"),
                "{case}: {error}"
            );
        }
        assert_eq!(
            o.lines("DEBUG "),
            std::slice::from_ref(&error),
            "{case}: Debug is the message"
        );
    }
}
