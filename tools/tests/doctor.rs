//! `nuvec doctor` end to end with the stand-in ssh (which runs the remote command here):
//! loopback "hosts" that pass, and the problems it must catch (an address that is not the
//! host's, a port in use, an unreachable host); and, as root, two network namespaces
//! joined by a veth pair, where it reports the link's round trip and a mismatched MTU.

use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

use nuvec_tools::testing::{free_port_block, install_fake_ssh, ip};
use serde_json::Value;

const NUVEC: &str = env!("CARGO_BIN_EXE_nuvec");

/// Runs `nuvec doctor ARGS --json` with `path` as PATH; the remote side is this build.
fn doctor(path: &str, args: &[&str]) -> (Output, Vec<Value>) {
    let out = Command::new(NUVEC)
        .arg("doctor")
        .args(args)
        .args(["--json", "--remote-nuvec", NUVEC])
        .env("PATH", path)
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

/// The findings of `check` on `subject`.
fn rows<'a>(findings: &'a [Value], subject: &str, check: &str) -> Vec<&'a Value> {
    findings
        .iter()
        .filter(|f| f["subject"] == subject && f["check"] == check)
        .collect()
}

fn write_executable(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn loopback_hosts_pass_every_check_that_can_run_here() {
    let dir = tempfile::tempdir().unwrap();
    let path = install_fake_ssh(dir.path());
    let log = dir.path().join("ssh.log");
    let hostfile = dir.path().join("hosts.json");
    std::fs::write(
        &hostfile,
        r#"[{"ssh": "h0", "ips": ["127.0.0.1"]}, {"ssh": "h1", "ips": ["127.0.0.1"]},
            {"ssh": "h2", "ips": ["127.0.0.1"]}]"#,
    )
    .unwrap();
    let port = free_port_block(3).unwrap();
    let written = dir.path().join("ring.json");
    let out = Command::new(NUVEC)
        .args(["doctor", "--hostfile"])
        .arg(&hostfile)
        .args([
            "-p",
            &port.to_string(),
            "--remote-nuvec",
            NUVEC,
            "--write-hostfile",
        ])
        .arg(&written)
        .env("PATH", &path)
        .env("FAKE_SSH_LOG", &log)
        .output()
        .unwrap();
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
    let port = free_port_block(3).unwrap();
    let (out, findings) = doctor(
        &path,
        &[
            "--hostfile",
            hostfile.to_str().unwrap(),
            "-p",
            &port.to_string(),
        ],
    );
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
    // Another test may take a port of a block between its check and this bind: try again.
    let (port, busy) = (0..20)
        .find_map(|_| {
            let port = free_port_block(4).ok()?;
            let busy = TcpListener::bind(("127.0.0.1", port + 3)).ok()?;
            Some((port, busy))
        })
        .expect("a free block of four ports, its last one bound here");
    let written = dir.path().join("ring.json");
    let (out, findings) = doctor(
        &path,
        &[
            "--hostfile",
            hostfile.to_str().unwrap(),
            "-p",
            &port.to_string(),
            "--write-hostfile",
            written.to_str().unwrap(),
        ],
    );
    drop(busy);
    assert!(!out.status.success());

    let address = rows(&findings, "1 (h1)", "address");
    assert_eq!(address[0]["verdict"], "fail");
    assert!(
        address[0]["detail"]
            .as_str()
            .unwrap()
            .starts_with("192.0.2.1 is not an address of h1; it has 127.0.0.1 (lo)"),
        "{}",
        address[0]
    );
    // Never contacted: no listener there, so no link into it.
    assert_eq!(rows(&findings, "0 -> 1", "link")[0]["verdict"], "skipped");

    let ssh = rows(&findings, "2 (down)", "ssh");
    assert_eq!(ssh[0]["verdict"], "fail");
    assert!(
        ssh[0]["detail"]
            .as_str()
            .unwrap()
            .contains("ssh down failed (exit 255): ssh: connect to host down port 22"),
        "{}",
        ssh[0]
    );
    assert!(rows(&findings, "2 (down)", "port")[0]["verdict"] == "skipped");

    let p = rows(&findings, "3 (h3)", "port");
    assert_eq!(p[0]["verdict"], "fail");
    assert!(
        p[0]["detail"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{} on 127.0.0.1 is in use on h3", port + 3)),
        "{}",
        p[0]
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
    let dir = tempfile::tempdir().unwrap();
    let path = install_fake_ssh(dir.path());
    let log = dir.path().join("ssh.log");
    let file = dir.path().join("ring.json");
    let (port, busy) = (0..20)
        .find_map(|_| {
            let port = free_port_block(2).ok()?;
            let busy = TcpListener::bind(("127.0.0.1", port + 1)).ok()?;
            Some((port, busy))
        })
        .expect("a free block of two ports, its second bound here");
    std::fs::write(
        &file,
        format!(r#"[["127.0.0.1:{port}"], ["127.0.0.1:{}"]]"#, port + 1),
    )
    .unwrap();
    let run = || {
        let out = Command::new(NUVEC)
            .args([
                "doctor",
                "--json",
                "--remote-nuvec",
                NUVEC,
                "-p",
                "1",
                "--hostfile",
            ])
            .arg(&file)
            .env("PATH", &path)
            .env("FAKE_SSH_LOG", &log)
            .output()
            .unwrap();
        let v: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stderr)));
        (out, v["findings"].as_array().cloned().unwrap_or_default())
    };

    // Rank 1's port is taken: its port check fails naming it; rank 0's passes.
    let (out, findings) = run();
    drop(busy);
    assert!(!out.status.success());
    for rank in 0..2 {
        let who = format!("{rank} (127.0.0.1)");
        let ssh = rows(&findings, &who, "ssh");
        assert_eq!(ssh[0]["verdict"], "ok", "{ssh:?}");
        assert!(
            ssh[0]["detail"].as_str().unwrap().starts_with("runs here"),
            "{ssh:?}"
        );
    }
    let p0 = rows(&findings, "0 (127.0.0.1)", "port");
    assert_eq!(p0[0]["verdict"], "ok", "{p0:?}");
    assert!(
        p0[0]["detail"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{port} is free")),
        "{p0:?}"
    );
    let p1 = rows(&findings, "1 (127.0.0.1)", "port");
    assert_eq!(p1[0]["verdict"], "fail", "{p1:?}");
    assert!(
        p1[0]["detail"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{} on 127.0.0.1 is in use", port + 1)),
        "{p1:?}"
    );

    // Free again: every check that can run here passes, each link to the file's port.
    let (out, findings) = run();
    assert!(out.status.success(), "{findings:?}");
    for (from, to) in [(0, 1), (1, 0)] {
        let link = rows(&findings, &format!("{from} -> {to}"), "link");
        assert_eq!(link[0]["verdict"], "ok", "{link:?}");
        let at = format!("127.0.0.1:{}", port + to);
        assert!(
            link[0]["detail"].as_str().unwrap().contains(&at),
            "{link:?}"
        );
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
struct Net {
    names: [String; 2],
    veth: [String; 2],
    addrs: [String; 2],
}

impl Net {
    fn new() -> Net {
        let id = std::process::id();
        let subnet = 1 + id % 250;
        let net = Net {
            names: [format!("nvdoc{id}a"), format!("nvdoc{id}b")],
            veth: [format!("nvd{id}a"), format!("nvd{id}b")],
            addrs: [format!("10.202.{subnet}.1"), format!("10.202.{subnet}.2")],
        };
        for n in &net.names {
            ip(&["netns", "add", n]);
        }
        ip(&[
            "link",
            "add",
            &net.veth[0],
            "type",
            "veth",
            "peer",
            "name",
            &net.veth[1],
        ]);
        for side in 0..2 {
            let (ns, dev) = (&net.names[side], &net.veth[side]);
            ip(&["link", "set", dev, "netns", ns]);
            ip(&[
                "-n",
                ns,
                "addr",
                "add",
                &format!("{}/24", net.addrs[side]),
                "dev",
                dev,
            ]);
            ip(&["-n", ns, "link", "set", dev, "mtu", "1500"]);
            ip(&["-n", ns, "link", "set", dev, "up"]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
        }
        net
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

#[test]
#[ignore = "needs root and ip netns; tools/test.sh runs it when the machine allows it"]
fn netns_link_reports_round_trip_and_a_mismatched_mtu() {
    let net = Net::new();
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
            na = net.names[0],
            nb = net.names[1]
        ),
    );
    let path = format!(
        "{}:{}",
        dir.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let hosts = format!("{},{}", net.addrs[0], net.addrs[1]);
    let port = free_port_block(2).unwrap().to_string();
    let (out, findings) = doctor(&path, &["--hosts", &hosts, "-p", &port]);
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
        &net.names[0],
        "link",
        "set",
        &net.veth[0],
        "mtu",
        "1400",
    ]);
    let port = free_port_block(2).unwrap().to_string();
    let (out, findings) = doctor(&path, &["--hosts", &hosts, "-p", &port]);
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
    let out = Command::new(NUVEC)
        .args([
            "doctor",
            "--hosts",
            "127.0.0.1",
            "-p",
            &port,
            "--remote-nuvec",
            NUVEC,
        ])
        .arg("--write-jaccl")
        .arg(&jaccl)
        .env("PATH", &path)
        .output()
        .unwrap();
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
