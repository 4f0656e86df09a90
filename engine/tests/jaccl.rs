//! JACCL from the outside, on a machine without RDMA hardware: how `init_backend` and
//! `is_available` behave with and without MLX's JACCL environment, across real processes.
//!
//! (The algorithms themselves are tested on the emulated fabric, in `src/jaccl/tests/`; the
//! real thing in `tests/jaccl_hardware.rs`, which needs Thunderbolt 5 Macs.)

#![cfg(feature = "jaccl")]

use std::path::Path;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use nuvec_distributed_engine::{
    Backend, Error, init_backend, is_available, jaccl, unavailable_reason,
};
use nuvec_tools::testing;

fn spawn(test: &str, env: &[(&str, String)]) -> std::process::Child {
    let mut cmd = testing::this_test(test);
    cmd.env("NUVEC_DISTRIBUTED_TIMEOUT", "5")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for var in testing::JACCL_LAUNCH_VARS {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap()
}

fn finished(o: &Output) -> bool {
    o.status.success() && String::from_utf8_lossy(&o.stdout).contains("JACCL-CHILD-DONE")
}

fn show(o: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn is_child(test: &str) -> bool {
    testing::is_rank(test)
}

#[test]
fn availability_comes_with_a_reason() {
    match unavailable_reason(Backend::Jaccl) {
        Some(reason) => {
            assert!(!is_available(Backend::Jaccl));
            assert!(
                reason.contains("RDMA") || reason.contains("load"),
                "an unhelpful reason: {reason}"
            );
            // Without devices, the device list is empty or the library is missing.
            match jaccl::devices() {
                Ok(devices) => assert!(devices.is_empty(), "{devices:?}"),
                Err(e) => assert!(matches!(e, Error::Unavailable { .. }), "{e}"),
            }
        }
        None => {
            assert!(is_available(Backend::Jaccl));
            assert!(!jaccl::devices().unwrap().is_empty());
        }
    }
    assert!(is_available(Backend::Ring));
    assert!(is_available(Backend::Any));
}

/// Without JACCL's variables, non-strict init is the group of one and strict init says
/// which variables are missing; `Any` falls through the ring and JACCL to the group of one.
#[test]
fn without_the_environment_jaccl_is_a_group_of_one_unless_strict() {
    const NAME: &str = "without_the_environment_jaccl_is_a_group_of_one_unless_strict";
    if is_child(NAME) {
        let e = init_backend(true, Backend::Jaccl).unwrap_err().to_string();
        assert!(
            e.contains("MLX_IBV_DEVICES") && e.contains("MLX_JACCL_COORDINATOR"),
            "{e}"
        );
        let g = init_backend(false, Backend::Jaccl).unwrap();
        assert_eq!((g.rank(), g.size(), g.backend()), (0, 1, "single"));
        let e = init_backend(true, Backend::Any).unwrap_err().to_string();
        assert!(e.contains("ring:") && e.contains("jaccl:"), "{e}");
        let g = init_backend(false, Backend::Any).unwrap();
        assert_eq!(g.size(), 1);
        println!("JACCL-CHILD-DONE");
        return;
    }
    let out = spawn(NAME, &[]).wait_with_output().unwrap();
    assert!(finished(&out), "{}", show(&out));
}

/// A device file that is neither a mesh nor a ring fails init with an error naming the file
/// and the cells, strict or not, as a bad hostfile does for the ring.
#[test]
fn a_bad_device_file_is_an_error_naming_the_file_and_cells() {
    const NAME: &str = "a_bad_device_file_is_an_error_naming_the_file_and_cells";
    if is_child(NAME) {
        let e = init_backend(false, Backend::Jaccl).unwrap_err();
        let text = e.to_string();
        let file = std::env::var("MLX_IBV_DEVICES").unwrap();
        assert!(matches!(e, Error::Config { .. }), "{text}");
        assert!(text.contains(&file), "{text}");
        assert!(
            text.contains("neither a mesh") && text.contains("cell ["),
            "{text}"
        );
        println!("JACCL-CHILD-DONE");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let devices = dir.path().join("devices.json");
    std::fs::write(
        &devices,
        r#"[[null, "a", null], ["b", null, ["c", "d"]], [null, "e", null]]"#,
    )
    .unwrap();
    let out = spawn(
        NAME,
        &[
            ("MLX_RANK", "0".into()),
            ("MLX_IBV_DEVICES", devices.display().to_string()),
            ("MLX_JACCL_COORDINATOR", "127.0.0.1:1".into()),
        ],
    )
    .wait_with_output()
    .unwrap();
    assert!(finished(&out), "{}", show(&out));
}

/// Two ranks launched as `mlx.launch --backend jaccl` would launch them, on a machine whose
/// verbs library has no devices: both join the side channel (MLX's order: before the
/// devices are opened), then fail to open their device with an error that names the device
/// and the peer, promptly, strict or not. Where no verbs library loads at all, they fail with
/// `Unavailable` and the loader's reason instead.
#[test]
fn mlx_launch_environment_without_devices_fails_naming_device_and_peer() {
    const NAME: &str = "mlx_launch_environment_without_devices_fails_naming_device_and_peer";
    if is_child(NAME) {
        let rank: usize = std::env::var("MLX_RANK").unwrap().parse().unwrap();
        let e = init_backend(false, Backend::Jaccl).unwrap_err();
        let text = e.to_string();
        match &e {
            // Only if this machine has no verbs library: then the reason is the loader's.
            Error::Unavailable { reason, .. } => match ffi::verbs::Verbs::load() {
                Ok(verbs) => panic!(
                    "Unavailable although {} loads here: {text}",
                    verbs.library()
                ),
                Err(load) => assert_eq!(reason, &load.to_string(), "{text}"),
            },
            // The library is there but has no such device.
            _ => {
                assert_eq!(e.peer(), Some(1 - rank), "{text}");
                assert!(text.contains(&format!("rdma_en{}", 2 + rank)), "{text}");
            }
        }
        println!("JACCL-CHILD-DONE {text}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let devices = dir.path().join("devices.json");
    std::fs::write(&devices, r#"[[null, "rdma_en2"], ["rdma_en3", null]]"#).unwrap();
    let port = testing::free_port_block(1).unwrap();
    let start = Instant::now();
    let children: Vec<_> = (0..2)
        .map(|rank| {
            spawn(
                NAME,
                &[
                    ("MLX_RANK", rank.to_string()),
                    ("MLX_IBV_DEVICES", devices.display().to_string()),
                    ("MLX_JACCL_COORDINATOR", format!("127.0.0.1:{port}")),
                ],
            )
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(finished(&out), "{}", show(&out));
    }
    assert!(start.elapsed() < Duration::from_secs(20));
    assert!(Path::new(&devices).exists());
}
