//! The launcher's writer against the library's reader (what `nuvec launch` writes is what
//! `init` reads), and each reader's errors.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::Path;
use std::time::Duration;

use nuvec_tools::launch::{self, Backend, HostList, LaunchSpec, Plan};

use super::env::{self, JacclLaunch};
use super::{devices, hostfile};
use crate::error::Error;

/// A rank's environment as the launcher's runner gives it: the plan's variables (a later
/// entry wins), each generated file written to `dir` with its path in its variable, and
/// `MLX_RANK`.
fn rank_env(plan: &Plan, rank: usize, dir: &Path) -> HashMap<String, OsString> {
    let mut vars: HashMap<String, OsString> = plan
        .env
        .iter()
        .map(|(k, v)| (k.clone(), OsString::from(v)))
        .collect();
    for (var, content) in &plan.files {
        let path = dir.join(var);
        std::fs::write(&path, Plan::file_text(content)).unwrap();
        vars.insert(var.clone(), path.into_os_string());
    }
    vars.insert(env::RANK_VAR.into(), rank.to_string().into());
    vars
}

fn lookup(vars: &HashMap<String, OsString>) -> impl Fn(&str) -> Option<OsString> + '_ {
    move |name| vars.get(name).cloned()
}

fn from_pairs(pairs: &[(&str, &str)]) -> HashMap<String, OsString> {
    pairs
        .iter()
        .map(|&(k, v)| (k.to_string(), OsString::from(v)))
        .collect()
}

/// `p` hosts on loopback, each with `ips` addresses, in either of `mlx.launch`'s hostfile
/// formats, parsed by the launcher.
fn loopback_hosts(p: usize, ips: usize, object_form: bool, rdma: Option<usize>) -> HostList {
    let hosts: Vec<String> = (0..p)
        .map(|i| {
            let ips: Vec<String> = (0..ips)
                .map(|k| format!("\"127.0.{k}.{}\"", i + 1))
                .collect();
            let rdma = rdma.map(|cables| {
                let cells: Vec<String> = (0..p)
                    .map(|j| match (i == j, cables) {
                        (true, _) => "null".to_string(),
                        // One cable as a plain name, several as a list: both of MLX's forms.
                        (false, 1) => format!("\"rdma_en{i}{j}\""),
                        (false, n) => {
                            let names: Vec<String> =
                                (0..n).map(|c| format!("\"rdma_en{i}{j}_{c}\"")).collect();
                            format!("[{}]", names.join(", "))
                        }
                    })
                    .collect();
                format!(", \"rdma\": [{}]", cells.join(", "))
            });
            format!(
                "{{\"ssh\": \"127.0.0.1\", \"ips\": [{}]{}}}",
                ips.join(", "),
                rdma.unwrap_or_default()
            )
        })
        .collect();
    let list = format!("[{}]", hosts.join(", "));
    let text = if object_form {
        format!("{{\"envs\": [\"FROM_HOSTFILE=1\"], \"hosts\": {list}}}")
    } else {
        list
    };
    HostList::parse_hostfile(&text).unwrap()
}

#[test]
fn the_launchers_ring_hostfile_and_variables_read_back() {
    let dir = tempfile::tempdir().unwrap();
    for object_form in [false, true] {
        for p in [2, 3, 4, 8] {
            for (ips, per_ip) in [(1, 1), (1, 2), (2, 1), (2, 3)] {
                let hosts = loopback_hosts(p, ips, object_form, None);
                let spec = LaunchSpec {
                    backend: Some(Backend::Ring),
                    starting_port: 40000,
                    connections_per_ip: per_ip,
                    verbose: p % 2 == 0,
                    env: vec![
                        format!("{}=2.5", env::TIMEOUT_VAR),
                        format!("{}=17", env::SPIN_VAR),
                        format!("{}=65536", env::SOCKET_BUFFER_VAR),
                        format!("{}=cubic", env::TCP_CONGESTION_VAR),
                        format!("{}=0123456789abcdef", env::KEY_VAR),
                        format!("{}=3", env::SEAL_THREADS_VAR),
                    ],
                    ..LaunchSpec::new(vec!["prog".into()])
                };
                let plan = launch::plan(&spec, &hosts, (0, 0)).unwrap();
                let expected =
                    launch::ring_addresses(&hosts.hosts, 40000, per_ip).expect("addresses");
                let case = format!("object form {object_form}, P={p}, {ips} ip(s) x {per_ip}");
                for rank in [0, p - 1] {
                    let vars = rank_env(&plan, rank, dir.path());
                    let launch = env::ring_launch(&lookup(&vars)).unwrap().unwrap();
                    assert_eq!(launch.rank, rank, "{case}");
                    let nodes = hostfile::read(&launch.hostfile).unwrap();
                    assert_eq!(nodes, expected, "{case}");
                    let addrs = hostfile::resolve(&nodes, rank, &launch.hostfile).unwrap();
                    assert_eq!(addrs.size, p, "{case}");
                    assert_eq!(addrs.listen.len(), ips * per_ip, "{case}");
                    assert_eq!(addrs.right[0].to_string(), expected[(rank + 1) % p][0]);

                    let options = env::options(&lookup(&vars)).unwrap();
                    assert_eq!(options.timeout, Duration::from_millis(2500), "{case}");
                    assert_eq!(options.spin, Some(Duration::from_micros(17)), "{case}");
                    assert_eq!(options.socket_buffer, Some(65536), "{case}");
                    assert_eq!(options.tcp_congestion.as_deref(), Some("cubic"), "{case}");
                    assert!(options.key.is_some(), "{case}");
                    assert_eq!(options.seal_threads, Some(3), "{case}");
                    assert_eq!(env::verbose(&lookup(&vars)), p % 2 == 0, "{case}");
                    let from_hostfile = vars.get("FROM_HOSTFILE").map(|v| v.to_str().unwrap());
                    assert_eq!(from_hostfile, object_form.then_some("1"), "{case}");
                }
            }
        }
    }
}

#[test]
fn the_launchers_device_file_and_variables_read_back() {
    let dir = tempfile::tempdir().unwrap();
    for object_form in [false, true] {
        for backend in [Backend::Jaccl, Backend::JacclRing] {
            for p in [2, 3, 5] {
                for cables in [1, 2, 4] {
                    let hosts = loopback_hosts(p, 1, object_form, Some(cables));
                    let spec = LaunchSpec {
                        backend: Some(backend),
                        starting_port: 41000,
                        ..LaunchSpec::new(vec!["prog".into()])
                    };
                    let plan = launch::plan(&spec, &hosts, (0, 0)).unwrap();
                    let case = format!("{backend}, object form {object_form}, P={p}, C={cables}");
                    for rank in 0..p {
                        let vars = rank_env(&plan, rank, dir.path());
                        let read = env::jaccl_launch(&lookup(&vars)).unwrap();
                        let devices_file = vars[env::DEVICES_VAR].clone().into();
                        assert_eq!(
                            read,
                            JacclLaunch {
                                rank,
                                devices: Some(devices_file),
                                coordinator: Some("127.0.0.1:41000".into()),
                                prefer_ring: backend == Backend::JacclRing,
                            },
                            "{case}"
                        );
                        let cells = devices::read(read.devices.as_deref().unwrap()).unwrap();
                        assert_eq!(cells.len(), p, "{case}");
                        for (i, row) in cells.iter().enumerate() {
                            for (j, cell) in row.iter().enumerate() {
                                let want: Vec<String> = match (i == j, cables) {
                                    (true, _) => vec![],
                                    (false, 1) => vec![format!("rdma_en{i}{j}")],
                                    (false, n) => {
                                        (0..n).map(|c| format!("rdma_en{i}{j}_{c}")).collect()
                                    }
                                };
                                assert_eq!(cell, &want, "{case}, cell [{i}][{j}]");
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn the_writers_escape_as_pythons_json_dumps() {
    // The expected strings are Python 3's json.dumps of the same lists.
    let odd = "q\"\\\n\t\u{7f}\u{e9}\u{1f600}/\u{8}\u{c}\r\u{1}";
    assert_eq!(
        hostfile::to_json(&[vec!["a:1".into(), odd.into()], vec![]]),
        r#"[["a:1", "q\"\\\n\t\u007f\u00e9\ud83d\ude00/\b\f\r\u0001"], []]"#
    );
    assert_eq!(hostfile::to_json(&[]), "[]");
    let two = ["x".to_string(), "y".to_string()];
    assert_eq!(
        devices::to_json(&[
            vec![devices::DeviceCell::None, devices::DeviceCell::Device("é")],
            vec![
                devices::DeviceCell::Devices(&two),
                devices::DeviceCell::None
            ],
        ]),
        r#"[[null, "\u00e9"], [["x", "y"], null]]"#
    );
    // And the readers take them back, escapes included.
    let nodes = vec![vec!["h\u{e9}:1".to_string()], vec!["b:2".to_string()]];
    assert_eq!(hostfile::parse(&hostfile::to_json(&nodes)).unwrap(), nodes);
}

/// The variable an error names and its message.
fn env_error(e: Error) -> (&'static str, String) {
    let text = e.to_string();
    match e {
        Error::Environment { var, .. } => {
            assert!(text.contains(var), "{text}");
            (var, text)
        }
        other => panic!("not an environment error: {other}"),
    }
}

#[test]
fn ring_launch_needs_both_variables_and_a_numeric_rank() {
    let none = from_pairs(&[]);
    let why = env::ring_launch(&lookup(&none)).unwrap().unwrap_err();
    assert!(
        why.contains("MLX_RANK is unset and MLX_HOSTFILE is unset"),
        "{why}"
    );
    let half = from_pairs(&[("MLX_RANK", "1")]);
    let why = env::ring_launch(&lookup(&half)).unwrap().unwrap_err();
    assert!(
        why.contains("MLX_RANK is \"1\" and MLX_HOSTFILE is unset"),
        "{why}"
    );
    // A hostfile without a rank is a ring launch that cannot be joined: an error, not "no
    // ring here" (which would let non-strict init fall back to a group of one).
    let no_rank = from_pairs(&[("MLX_HOSTFILE", "h.json")]);
    let (var, text) = env_error(env::ring_launch(&lookup(&no_rank)).unwrap_err());
    assert_eq!(var, "MLX_RANK");
    assert!(
        text.contains("is unset, but MLX_HOSTFILE is set (\"h.json\")"),
        "{text}"
    );
    // Empty values name their variable instead of reaching the file system as "".
    for (name, other) in [("MLX_HOSTFILE", "MLX_RANK"), ("MLX_RANK", "MLX_HOSTFILE")] {
        for blank in ["", " "] {
            let vars = from_pairs(&[(name, blank), (other, "1")]);
            let (var, text) = env_error(env::ring_launch(&lookup(&vars)).unwrap_err());
            assert_eq!(var, name);
            assert!(text.contains("is set but empty"), "{text}");
        }
    }
    for bad in ["x", "-1", "1.0"] {
        let vars = from_pairs(&[("MLX_RANK", bad), ("MLX_HOSTFILE", "h.json")]);
        let (var, text) = env_error(env::ring_launch(&lookup(&vars)).unwrap_err());
        assert_eq!(var, "MLX_RANK");
        assert!(text.contains(&format!("{bad:?} is not a rank")), "{text}");
    }
    let ok = from_pairs(&[("MLX_RANK", " 3 "), ("MLX_HOSTFILE", "h.json")]);
    let launch = env::ring_launch(&lookup(&ok)).unwrap().unwrap();
    assert_eq!(
        (launch.rank, launch.hostfile.as_path()),
        (3, Path::new("h.json"))
    );
}

#[test]
fn shm_turns_shared_memory_on_and_off() {
    assert!(
        env::options(&lookup(&from_pairs(&[])))
            .unwrap()
            .shared_memory
    );
    for (value, on) in [("0", false), ("1", true), (" 0 ", false)] {
        let vars = from_pairs(&[(env::SHM_VAR, value)]);
        assert_eq!(
            env::options(&lookup(&vars)).unwrap().shared_memory,
            on,
            "{value:?}"
        );
    }
}

#[test]
fn the_spin_variable_fixes_the_spin_and_unset_learns_it() {
    assert_eq!(env::options(&lookup(&from_pairs(&[]))).unwrap().spin, None);
    for (value, micros) in [("0", 0), (" 250 ", 250), ("18446744073709551615", u64::MAX)] {
        let vars = from_pairs(&[(env::SPIN_VAR, value)]);
        assert_eq!(
            env::options(&lookup(&vars)).unwrap().spin,
            Some(Duration::from_micros(micros)),
            "{value:?}"
        );
    }
    for bad in ["-1", "1e3", "fast", "18446744073709551616"] {
        let vars = from_pairs(&[(env::SPIN_VAR, bad)]);
        let (var, text) = env_error(env::options(&lookup(&vars)).unwrap_err());
        assert_eq!(var, env::SPIN_VAR, "{bad:?}");
        assert!(
            text.contains(bad) && text.contains("0 never spins"),
            "{text}"
        );
    }
}

#[test]
fn option_variables_name_themselves_when_wrong() {
    use env::{
        FLIGHT_DIR_VAR, FLIGHT_RECORDS_VAR, FLIGHT_SIGNAL_VAR, KEY_VAR, SEAL_THREADS_VAR, SHM_VAR,
        SOCKET_BUFFER_VAR, SPIN_VAR, TCP_CONGESTION_VAR, TIMEOUT_VAR,
    };
    let cases = [
        (TIMEOUT_VAR, "soon", "is not a number of seconds"),
        (TIMEOUT_VAR, "0", "must be more than zero"),
        (TIMEOUT_VAR, "", "is set but empty"),
        (SPIN_VAR, "1.5", "not a whole number of microseconds"),
        (SOCKET_BUFFER_VAR, "0", "not a positive number of bytes"),
        (SOCKET_BUFFER_VAR, "big", "not a positive number of bytes"),
        (KEY_VAR, "short", "16"),
        (SHM_VAR, "yes", "neither 1"),
        (FLIGHT_RECORDS_VAR, "many", "not a number of calls"),
        (FLIGHT_RECORDS_VAR, "-1", "not a number of calls"),
        (FLIGHT_RECORDS_VAR, "99999999999", "not a number of calls"),
        (FLIGHT_DIR_VAR, " ", "is set but empty"),
        (FLIGHT_SIGNAL_VAR, "yes", "neither 1"),
        (FLIGHT_SIGNAL_VAR, "", "is set but empty"),
        (SEAL_THREADS_VAR, "0", "from 1"),
        (SEAL_THREADS_VAR, "65", "to 64"),
        (SEAL_THREADS_VAR, "all", "not a number of threads"),
        (SEAL_THREADS_VAR, "", "is set but empty"),
    ];
    for (name, value, why) in cases {
        let vars = from_pairs(&[(name, value)]);
        let (var, text) = env_error(env::options(&lookup(&vars)).unwrap_err());
        assert_eq!(var, name, "{value:?}");
        assert!(text.contains(why), "{name}={value:?}: {text}");
    }
    // Empty is never the same as unset: each is an error naming its variable. An empty
    // key in particular must not turn authentication off.
    for name in [
        TIMEOUT_VAR,
        SPIN_VAR,
        SOCKET_BUFFER_VAR,
        TCP_CONGESTION_VAR,
        KEY_VAR,
    ] {
        for blank in ["", "  "] {
            if name == KEY_VAR && !blank.is_empty() {
                continue; // a key of spaces is a (short) key, checked above
            }
            let vars = from_pairs(&[(name, blank)]);
            let (var, text) = env_error(env::options(&lookup(&vars)).unwrap_err());
            assert_eq!(var, name, "{blank:?}");
            assert!(
                text.contains("is set but empty"),
                "{name}={blank:?}: {text}"
            );
        }
    }
    let (_, text) = env_error(env::options(&lookup(&from_pairs(&[(KEY_VAR, "")]))).unwrap_err());
    assert!(
        text.contains("unset it to run without authentication"),
        "{text}"
    );
    // Unset, all are the defaults.
    let options = env::options(&lookup(&from_pairs(&[]))).unwrap();
    let default = crate::Options::default();
    assert_eq!(options.spin, default.spin);
    assert_eq!(options.timeout, default.timeout);
    assert_eq!(options.socket_buffer, None);
    assert_eq!(options.tcp_congestion, None);
    assert!(options.key.is_none());
    assert!(!options.flight_signal);
    for (value, on) in [("1", true), (" 0 ", false)] {
        let vars = from_pairs(&[(FLIGHT_SIGNAL_VAR, value)]);
        assert_eq!(env::options(&lookup(&vars)).unwrap().flight_signal, on);
        assert_eq!(env::flight_signal(&lookup(&vars)), on);
    }
    // A group that cannot fail takes a value that is neither as off.
    let vars = from_pairs(&[(FLIGHT_SIGNAL_VAR, "on")]);
    assert!(!env::flight_signal(&lookup(&vars)));
}

#[test]
fn launch_variables_say_whether_a_distributed_launch_is_present() {
    assert!(env::launch_vars_set(&lookup(&from_pairs(&[]))).is_empty());
    // Variables that are not a backend's launch variables do not count.
    let unrelated = from_pairs(&[("NUVEC_DISTRIBUTED_TIMEOUT", "3"), ("HOME", "/")]);
    assert!(env::launch_vars_set(&lookup(&unrelated)).is_empty());
    // What `nuvec launch --backend jaccl` sets, and a ring launch missing its rank.
    let jaccl = from_pairs(&[
        ("MLX_RANK", "0"),
        ("MLX_IBV_DEVICES", "d.json"),
        ("MLX_JACCL_COORDINATOR", "127.0.0.1:1"),
    ]);
    assert_eq!(
        env::launch_vars_set(&lookup(&jaccl)),
        ["MLX_RANK", "MLX_IBV_DEVICES", "MLX_JACCL_COORDINATOR"]
    );
    let ring = from_pairs(&[("MLX_HOSTFILE", "h.json")]);
    assert_eq!(env::launch_vars_set(&lookup(&ring)), ["MLX_HOSTFILE"]);
    // Even a presence switch alone is a launch.
    let switch = from_pairs(&[("JACCL_RING", "")]);
    assert_eq!(env::launch_vars_set(&lookup(&switch)), ["JACCL_RING"]);
}

#[test]
fn timeouts_parse_as_seconds() {
    assert_eq!(
        env::parse_timeout("2.5").unwrap(),
        Duration::from_millis(2500)
    );
    assert_eq!(env::parse_timeout(" 30 ").unwrap(), Duration::from_secs(30));
    for bad in ["", "abc", "0", "-1", "NaN", "1e300"] {
        let (var, _) = env_error(env::parse_timeout(bad).unwrap_err());
        assert_eq!(var, env::TIMEOUT_VAR);
    }
}

#[test]
fn verbose_is_on_when_either_variable_is_present_even_empty() {
    assert!(!env::verbose(&lookup(&from_pairs(&[]))));
    assert!(env::verbose(&lookup(&from_pairs(&[(
        "MLX_RING_VERBOSE",
        ""
    )]))));
    assert!(env::verbose(&lookup(&from_pairs(&[(
        "NUVEC_DISTRIBUTED_VERBOSE",
        "0"
    )]))));
}

#[test]
fn a_simd_request_naming_no_level_is_an_environment_error() {
    let vars = from_pairs(&[("NUVEC_DISTRIBUTED_SIMD", "avx1024")]);
    let (var, text) = env_error(env::simd_request(&lookup(&vars)).unwrap_err());
    assert_eq!(var, "NUVEC_DISTRIBUTED_SIMD");
    assert!(text.contains("\"avx1024\""), "{text}");
    for blank in ["", " "] {
        let vars = from_pairs(&[("NUVEC_DISTRIBUTED_SIMD", blank)]);
        let (_, text) = env_error(env::simd_request(&lookup(&vars)).unwrap_err());
        assert!(text.contains("empty"), "{text}");
    }
    for ok in ["scalar", "avx2", "AVX512", " neon "] {
        let vars = from_pairs(&[("NUVEC_DISTRIBUTED_SIMD", ok)]);
        assert!(env::simd_request(&lookup(&vars)).is_ok(), "{ok:?}");
    }
    assert!(env::simd_request(&lookup(&from_pairs(&[]))).is_ok());
}

#[test]
fn jaccl_variables_look_up_jaccl_names_before_mlx_ones() {
    let both = from_pairs(&[
        ("JACCL_RANK", "1"),
        ("MLX_RANK", "x"),
        ("JACCL_IBV_DEVICES", "j.json"),
        ("MLX_IBV_DEVICES", "m.json"),
        ("JACCL_COORDINATOR", "10.0.0.1:1"),
        ("MLX_JACCL_COORDINATOR", "10.0.0.2:2"),
        ("MLX_JACCL_RING", ""),
    ]);
    assert_eq!(
        env::jaccl_launch(&lookup(&both)).unwrap(),
        JacclLaunch {
            rank: 1,
            devices: Some("j.json".into()),
            coordinator: Some("10.0.0.1:1".into()),
            prefer_ring: true,
        }
    );
    // Nothing set: rank 0 and nothing else, not an error (init then reports what is missing).
    assert_eq!(
        env::jaccl_launch(&lookup(&from_pairs(&[]))).unwrap(),
        JacclLaunch {
            rank: 0,
            devices: None,
            coordinator: None,
            prefer_ring: false,
        }
    );
    // An empty value is an error naming its variable, even where another would stand in.
    for name in [
        "JACCL_RANK",
        "MLX_RANK",
        "JACCL_IBV_DEVICES",
        "MLX_IBV_DEVICES",
        "JACCL_COORDINATOR",
        "MLX_JACCL_COORDINATOR",
    ] {
        let empty = from_pairs(&[(name, ""), ("MLX_RANK", "2")]);
        let empty = if name == "MLX_RANK" {
            from_pairs(&[(name, "")])
        } else {
            empty
        };
        let (var, text) = env_error(env::jaccl_launch(&lookup(&empty)).unwrap_err());
        assert_eq!(var, name);
        assert!(text.contains("is set but empty"), "{text}");
    }
    let mlx = from_pairs(&[("MLX_RANK", "two")]);
    let (var, text) = env_error(env::jaccl_launch(&lookup(&mlx)).unwrap_err());
    assert_eq!(var, "MLX_RANK");
    assert!(text.contains("\"two\" is not a rank"), "{text}");
}

#[test]
fn device_file_errors_name_the_file_and_the_cell() {
    let reason = |text: &str| match devices::parse(text, Path::new("devices.json")) {
        Err(Error::Config { path, reason }) => {
            assert_eq!(path, Path::new("devices.json"));
            reason
        }
        other => panic!("expected a device-file error, got {other:?}"),
    };
    assert!(reason("{}").contains("JSON array"));
    assert!(reason("[[null]").contains("not valid JSON"));
    assert!(reason(r#"[[null, "a"], [null]]"#).contains("row 1 (rank 1) has 1 cells"));
    assert!(reason(r#"[[null, "a"], 5]"#).contains("row 1 (rank 1) is the number 5"));
    assert!(
        reason(r#"[[null, 3], ["a", null]]"#)
            .contains("cell [0][1] (how rank 0 reaches rank 1) is the number 3")
    );
    let e = reason(r#"[[null, ["a", 2]], ["a", null]]"#);
    assert!(e.contains("cell [0][1]") && e.contains("entry 1"), "{e}");
    let e = reason(r#"[[null, ""], ["a", null]]"#);
    assert!(
        e.contains("cell [0][1]") && e.contains("empty device"),
        "{e}"
    );
    let missing = devices::read(Path::new("/nonexistent/devices.json")).unwrap_err();
    let text = missing.to_string();
    assert!(
        text.contains("/nonexistent/devices.json") && text.contains("does not exist"),
        "{text}"
    );
}

#[test]
fn an_event_loop_naming_none_is_refused_with_the_other_variables() {
    // Read with the other options, before any hostfile or socket: a typo fails at once,
    // not after the group formed.
    for bad in ["bogus", "kqueue", "", " "] {
        let vars = from_pairs(&[(env::IO_VAR, bad)]);
        let (var, text) = env_error(env::options(&lookup(&vars)).unwrap_err());
        assert_eq!(var, env::IO_VAR, "{bad:?}");
        if !bad.trim().is_empty() {
            for name in ["auto", "epoll", "uring"] {
                assert!(text.contains(name), "{bad:?}: {text}");
            }
        }
    }
    for (text, io) in [
        ("auto", crate::Io::Auto),
        ("epoll", crate::Io::Epoll),
        (" URING ", crate::Io::Uring),
    ] {
        let vars = from_pairs(&[(env::IO_VAR, text)]);
        assert_eq!(env::options(&lookup(&vars)).unwrap().io, io, "{text:?}");
    }
    assert_eq!(
        env::options(&lookup(&from_pairs(&[]))).unwrap().io,
        crate::Io::Auto
    );
}
