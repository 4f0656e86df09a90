//! `nuvec doctor` end to end with the stand-in ssh (which runs the remote command here):
//! loopback "hosts" that pass, and the problems it must catch (an address that is not the
//! host's, a port in use, an unreachable host); and, as root, two network namespaces
//! joined by a veth pair, where it reports the link's round trip and a mismatched MTU.

use std::ffi::{OsStr, OsString};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use nuvec_tools::testing::{VethPair, free_port_block, install_fake_ssh, ip, write_executable};
use serde_json::Value;

const NUVEC: &str = env!("CARGO_BIN_EXE_nuvec");

/// `nuvec doctor ARGS` with `path` as PATH, the stand-in ssh logging to `log` when given;
/// the remote side is this build.
fn doctor_command(path: &str, log: Option<&Path>, args: &[impl AsRef<OsStr>]) -> Command {
    let mut c = Command::new(NUVEC);
    c.arg("doctor")
        .args(args)
        .args(["--remote-nuvec", NUVEC])
        .env("PATH", path);
    if let Some(log) = log {
        c.env("FAKE_SSH_LOG", log);
    }
    c
}

/// Runs [`doctor_command`] with `--json`; returns its output and findings.
fn doctor(path: &str, log: Option<&Path>, args: &[impl AsRef<OsStr>]) -> (Output, Vec<Value>) {
    let out = doctor_command(path, log, args)
        .arg("--json")
        .output()
        .expect("running nuvec doctor");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let findings = v["findings"].as_array().cloned().unwrap_or_default();
    assert_eq!(v["ok"], out.status.success(), "ok matches the exit status");
    (out, findings)
}

/// The arguments that check the hosts of `hostfile`, the ring from `port` on, and write
/// the ring's address file to `written`.
fn hostfile_args(hostfile: &Path, port: u16, written: &Path) -> [OsString; 6] {
    [
        "--hostfile".into(),
        hostfile.into(),
        "-p".into(),
        port.to_string().into(),
        "--write-hostfile".into(),
        written.into(),
    ]
}

/// A temporary directory with the stand-in ssh in it: the directory, the PATH that finds
/// that ssh first, and the file it logs the hosts it is asked for to.
fn with_fake_ssh() -> (tempfile::TempDir, String, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = install_fake_ssh(dir.path());
    let log = dir.path().join("ssh.log");
    (dir, path, log)
}

/// The findings of `check` on `subject`.
fn rows<'a>(findings: &'a [Value], subject: &str, check: &str) -> Vec<&'a Value> {
    findings
        .iter()
        .filter(|f| f["subject"] == subject && f["check"] == check)
        .collect()
}

/// The detail of the first finding of `check` on `subject`, which must have `verdict`.
fn detail<'a>(findings: &'a [Value], subject: &str, check: &str, verdict: &str) -> &'a str {
    let found = rows(findings, subject, check);
    let first = found
        .first()
        .unwrap_or_else(|| panic!("no {check} finding on {subject}: {findings:?}"));
    assert_eq!(first["verdict"], verdict, "{subject} {check}: {first}");
    first["detail"].as_str().unwrap_or("")
}

/// A free block of `n` ports, its last one bound here (until the listener is dropped).
/// Another test may take a port of a block between its check and this bind: it tries
/// again.
fn block_with_last_busy(n: u16) -> (u16, TcpListener) {
    (0..20)
        .find_map(|_| {
            let port = free_port_block(usize::from(n)).ok()?;
            let busy = TcpListener::bind(("127.0.0.1", port + n - 1)).ok()?;
            Some((port, busy))
        })
        .unwrap_or_else(|| panic!("a free block of {n} ports, its last one bound here"))
}

#[test]
fn loopback_hosts_pass_every_check_that_can_run_here() {
    let (dir, path, log) = with_fake_ssh();
    let hostfile = dir.path().join("hosts.json");
    std::fs::write(
        &hostfile,
        r#"[{"ssh": "h0", "ips": ["127.0.0.1"]}, {"ssh": "h1", "ips": ["127.0.0.1"]},
            {"ssh": "h2", "ips": ["127.0.0.1"]}]"#,
    )
    .unwrap();
    let port = free_port_block(3).unwrap();
    let written = dir.path().join("ring.json");
    let args = hostfile_args(&hostfile, port, &written);
    let out = doctor_command(&path, Some(&log), &args).output().unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{table}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The table: a header, a row per check, what cannot run here said as such.
    assert!(table.starts_with("HOST/LINK"), "{table}");
    assert!(
        table.lines().any(|l| l.starts_with("0 (h0)")
            && l.contains("thunderbolt")
            && l.contains("skipped  not macOS (Linux)")),
        "{table}"
    );
    for rank in 0..3 {
        let row = table
            .lines()
            .find(|l| l.starts_with(&format!("{rank} -> {}", (rank + 1) % 3)) && l.contains("link"))
            .unwrap_or_else(|| panic!("no link row from {rank}: {table}"));
        assert!(row.contains(" ok ") && row.contains("round trip"), "{row}");
        let p = port + (rank as u16 + 1) % 3;
        assert!(row.contains(&format!("127.0.0.1:{p}")), "{row}");
    }
    // Every host was reached through ssh (the stand-in logs each one it is asked for).
    let asked = std::fs::read_to_string(&log).unwrap();
    for h in ["h0", "h1", "h2"] {
        assert!(asked.lines().any(|l| l == h), "{asked}");
    }
    // The written hostfile is one nuvec launch (and mlx.launch) reads.
    let text = std::fs::read_to_string(&written).unwrap();
    let hosts = nuvec_tools::launch::HostList::parse_hostfile(&text).unwrap();
    assert_eq!(hosts.hosts.len(), 3);
    assert!(hosts.hosts.iter().all(|h| h.ips == ["127.0.0.1"]));

    // The same as JSON: no failure and no warning; only what needs macOS or RDMA skipped.
    let port = free_port_block(3).unwrap().to_string();
    let hostfile = hostfile.to_str().unwrap();
    let (out, findings) = doctor(&path, None, &["--hostfile", hostfile, "-p", &port]);
    assert!(out.status.success());
    for f in &findings {
        match f["verdict"].as_str() {
            Some("ok") => {}
            Some("skipped") => assert!(
                ["thunderbolt", "bridge", "rdma"].contains(&f["check"].as_str().unwrap()),
                "{f}"
            ),
            _ => panic!("{f}"),
        }
    }
    for check in ["ssh", "address", "mtu", "port"] {
        assert_eq!(rows(&findings, "1 (h1)", check)[0]["verdict"], "ok");
    }
    assert_eq!(rows(&findings, "2 -> 0", "link")[0]["verdict"], "ok");
}

#[test]
fn a_foreign_address_a_busy_port_and_an_unreachable_host_fail_with_a_fix() {
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("fake");
    std::fs::create_dir(&fake).unwrap();
    let path = install_fake_ssh(&fake);
    // An ssh that cannot reach "down" (ssh's own failures exit 255), else the stand-in.
    let wrapper = dir.path().join("wrapper");
    std::fs::create_dir(&wrapper).unwrap();
    write_executable(
        &wrapper.join("ssh"),
        &format!(
            "#!/bin/sh\nfor a; do if [ \"$a\" = down ]; then \
             echo 'ssh: connect to host down port 22: Connection refused' >&2; exit 255; fi; done\n\
             exec {} \"$@\"\n",
            fake.join("ssh").display()
        ),
    );
    let path = format!("{}:{path}", wrapper.display());
    // 192.0.2.1 (TEST-NET-1) is nobody's here; the check compares it with h1's interfaces
    // and never contacts it.
    let hostfile = dir.path().join("hosts.json");
    std::fs::write(
        &hostfile,
        r#"[{"ssh": "h0", "ips": ["127.0.0.1"]}, {"ssh": "h1", "ips": ["192.0.2.1"]},
            {"ssh": "down", "ips": ["127.0.0.1"]}, {"ssh": "h3", "ips": ["127.0.0.1"]}]"#,
    )
    .unwrap();
    let (port, busy) = block_with_last_busy(4);
    let written = dir.path().join("ring.json");
    let (out, findings) = doctor(&path, None, &hostfile_args(&hostfile, port, &written));
    drop(busy);
    assert!(!out.status.success());

    let address = detail(&findings, "1 (h1)", "address", "fail");
    assert!(
        address.starts_with("192.0.2.1 is not an address of h1; it has 127.0.0.1 (lo)"),
        "{address}"
    );
    // Never contacted: no listener there, so no link into it.
    assert_eq!(rows(&findings, "0 -> 1", "link")[0]["verdict"], "skipped");

    let ssh = detail(&findings, "2 (down)", "ssh", "fail");
    assert!(
        ssh.contains("ssh down failed (exit 255): ssh: connect to host down port 22"),
        "{ssh}"
    );
    assert!(rows(&findings, "2 (down)", "port")[0]["verdict"] == "skipped");

    let p = detail(&findings, "3 (h3)", "port", "fail");
    assert!(
        p.starts_with(&format!("{} on 127.0.0.1 is in use on h3", port + 3)),
        "{p}"
    );
    // The healthy pair still works: h3 reaches h0.
    assert_eq!(rows(&findings, "3 -> 0", "link")[0]["verdict"], "ok");

    // Every problem comes with a one-line fix.
    let failed: Vec<&Value> = findings
        .iter()
        .filter(|f| f["verdict"] == "fail" || f["verdict"] == "warn")
        .collect();
    assert_eq!(failed.len(), 3, "{failed:?}");
    for f in failed {
        let fix = f["fix"].as_str().unwrap_or("");
        assert!(!fix.is_empty() && !fix.contains('\n'), "{f}");
    }
    // No hostfile from unverified addresses; the refusal names the host.
    assert!(!written.exists());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("rank 1 (h1) has no verified address"),
        "{stderr}"
    );
}

/// The quick start's file, `[["127.0.0.1:P"], ["127.0.0.1:P+1"]]` (what MLX_HOSTFILE names),
/// is a ring address file: both ranks run here (no ssh), and the ports checked are the
/// file's, whatever -p says.
#[test]
fn a_ring_address_file_is_checked_with_its_own_hosts_and_ports() {
    let (dir, path, log) = with_fake_ssh();
    let file = dir.path().join("ring.json");
    let (port, busy) = block_with_last_busy(2);
    std::fs::write(
        &file,
        format!(r#"[["127.0.0.1:{port}"], ["127.0.0.1:{}"]]"#, port + 1),
    )
    .unwrap();
    let run = || {
        let file = file.to_str().unwrap();
        doctor(&path, Some(&log), &["-p", "1", "--hostfile", file])
    };

    // Rank 1's port is taken: its port check fails naming it; rank 0's passes.
    let (out, findings) = run();
    drop(busy);
    assert!(!out.status.success());
    for rank in 0..2 {
        let who = format!("{rank} (127.0.0.1)");
        let ssh = detail(&findings, &who, "ssh", "ok");
        assert!(ssh.starts_with("runs here"), "{ssh}");
    }
    let p0 = detail(&findings, "0 (127.0.0.1)", "port", "ok");
    assert!(p0.starts_with(&format!("{port} is free")), "{p0}");
    let p1 = detail(&findings, "1 (127.0.0.1)", "port", "fail");
    let in_use = format!("{} on 127.0.0.1 is in use", port + 1);
    assert!(p1.starts_with(&in_use), "{p1}");

    // Free again: every check that can run here passes, each link to the file's port.
    let (out, findings) = run();
    assert!(out.status.success(), "{findings:?}");
    for (from, to) in [(0, 1), (1, 0)] {
        let link = detail(&findings, &format!("{from} -> {to}"), "link", "ok");
        let at = format!("127.0.0.1:{}", port + to);
        assert!(link.contains(&at), "{link}");
    }
    // Nothing went through ssh: no "host:port" was taken for a host name.
    assert!(!log.exists() || std::fs::read_to_string(&log).unwrap().is_empty());
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let hostfile = dir.path().join("bad.json");
    for (text, expected) in [
        ("not json", "not valid JSON"),
        ("[]", "no hosts"),
        ("[{\"ssh\": \"a\", \"ips\": [\"not-an-ip\"]}]", ""),
    ] {
        std::fs::write(&hostfile, text).unwrap();
        let out = Command::new(NUVEC)
            .args(["doctor", "--hostfile"])
            .arg(&hostfile)
            .env("PATH", install_fake_ssh(dir.path()))
            .output()
            .unwrap();
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.status.code(), Some(1), "{text}: {all}");
        assert!(
            all.contains(expected) && !all.contains("panicked"),
            "{text}: {all}"
        );
        if expected.is_empty() {
            assert!(all.contains("\"not-an-ip\" is not an IP address"), "{all}");
        }
    }
    let out = Command::new(NUVEC).arg("doctor").output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--hostfile PATH or --hosts"));
}

/// Two namespaces joined by a veth pair, this test's own; removed on drop.
fn veth_pair() -> VethPair {
    let id = std::process::id();
    VethPair::new(
        [format!("nvdoc{id}a"), format!("nvdoc{id}b")],
        [format!("nvd{id}a"), format!("nvd{id}b")],
        1 + id % 250,
    )
}

#[test]
#[ignore = "needs root and ip netns; tools/test.sh runs it when the machine allows it"]
fn netns_link_reports_round_trip_and_a_mismatched_mtu() {
    let net = veth_pair();
    let dir = tempfile::tempdir().unwrap();
    // An ssh that runs the command inside the namespace that holds the host's address.
    write_executable(
        &dir.path().join("ssh"),
        &format!(
            "#!/bin/sh\nwhile [ $# -gt 0 ]; do case \"$1\" in --) shift; break ;; -o) shift 2 ;; \
             -*) shift ;; *) break ;; esac; done\n\
             case \"$1\" in {a}) ns={na} ;; {b}) ns={nb} ;; *) exit 255 ;; esac\n\
             shift\nexec ip netns exec \"$ns\" sh -c \"$*\"\n",
            a = net.addrs[0],
            b = net.addrs[1],
            na = net.netns[0],
            nb = net.netns[1]
        ),
    );
    let path = format!(
        "{}:{}",
        dir.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let hosts = format!("{},{}", net.addrs[0], net.addrs[1]);
    let port = free_port_block(2).unwrap().to_string();
    let (out, findings) = doctor(&path, None, &["--hosts", &hosts, "-p", &port]);
    assert!(out.status.success(), "{findings:#?}");
    let a = format!("0 ({})", net.addrs[0]);
    let address = rows(&findings, &a, "address");
    assert_eq!(
        address[0]["detail"],
        format!("{} is on {}", net.addrs[0], net.veth[0])
    );
    assert_eq!(
        rows(&findings, &a, "mtu")[0]["detail"],
        format!("1500 on {}", net.veth[0])
    );
    for link in ["0 -> 1", "1 -> 0"] {
        let l = rows(&findings, link, "link");
        assert_eq!(l[0]["verdict"], "ok", "{}", l[0]);
        assert!(
            l[0]["detail"].as_str().unwrap().contains("round trip"),
            "{}",
            l[0]
        );
    }
    let mtu = rows(&findings, "0 -> 1", "mtu");
    assert_eq!(mtu[0]["verdict"], "ok");
    assert_eq!(
        mtu[0]["detail"],
        format!("1500 on both ends ({}, {})", net.veth[0], net.veth[1])
    );

    // One end at 1400: the link still works, with a warning naming both MTUs.
    ip(&[
        "-n",
        &net.netns[0],
        "link",
        "set",
        &net.veth[0],
        "mtu",
        "1400",
    ]);
    let port = free_port_block(2).unwrap().to_string();
    let (out, findings) = doctor(&path, None, &["--hosts", &hosts, "-p", &port]);
    assert!(
        out.status.success(),
        "a warning is not a failure: {findings:#?}"
    );
    let mtu = rows(&findings, "0 -> 1", "mtu");
    assert_eq!(mtu[0]["verdict"], "warn");
    assert_eq!(
        mtu[0]["detail"],
        format!(
            "mismatched MTU: 1400 on {}'s {}, 1500 on {}'s {}",
            net.addrs[0], net.veth[0], net.addrs[1], net.veth[1]
        )
    );
    assert!(mtu[0]["fix"].as_str().unwrap().contains("mtu 1400"));
    assert_eq!(rows(&findings, "0 -> 1", "link")[0]["verdict"], "ok");
}

#[test]
fn a_jaccl_file_without_rdma_devices_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = install_fake_ssh(dir.path());
    let port = free_port_block(1).unwrap().to_string();
    let jaccl = dir.path().join("jaccl.json");
    let args = [
        "--hosts",
        "127.0.0.1",
        "-p",
        &port,
        "--write-jaccl",
        jaccl.to_str().unwrap(),
    ];
    let out = doctor_command(&path, None, &args).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The checks themselves pass (a single host has no link to check)...
    assert!(
        stdout.contains("link         skipped  a single host has no neighbours"),
        "{stdout}"
    );
    assert!(stdout.contains(" 0 failed"), "{stdout}");
    // ...but there is no device file to write, and that fails the run.
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(
        stderr.contains("not writing") && stderr.contains("rank 0 (127.0.0.1) has no RDMA device"),
        "{stderr}"
    );
    assert!(!jaccl.exists());
}
