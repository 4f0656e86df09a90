//! A ring across a real (virtual) link: two ranks in their own network namespaces, joined
//! by a veth pair; cutting the link mid-run fails both ranks, each naming the other.
//!
//! Needs root and `ip netns` (iproute2), so it is ignored by default; `tools/test.sh` runs it
//! when the machine allows it and says so when it does not. The namespaces, the veth pair and
//! the addresses (10.201.N.0/24) are this test's own and are removed afterwards.

use std::process::Command;
use std::time::{Duration, Instant};

use nuvec_tools::testing::{self, Launch, ip};

const NAME: &str = "cutting_a_link_fails_both_ranks_naming_each_other";

/// The namespaces and link of one run; removed on drop.
struct Net {
    names: [String; 2],
}

impl Net {
    fn new(subnet: u8) -> Net {
        let id = std::process::id();
        let names = [format!("nuvec{id}a"), format!("nuvec{id}b")];
        let veth = [format!("nv{id}a"), format!("nv{id}b")];
        let net = Net {
            names: names.clone(),
        };
        for n in &names {
            ip(&["netns", "add", n]);
        }
        ip(&[
            "link", "add", &veth[0], "type", "veth", "peer", "name", &veth[1],
        ]);
        for side in 0..2 {
            let (ns, dev) = (&names[side], &veth[side]);
            let addr = format!("10.201.{subnet}.{}/24", side + 1);
            ip(&["link", "set", dev, "netns", ns]);
            ip(&["-n", ns, "addr", "add", &addr, "dev", dev]);
            ip(&["-n", ns, "link", "set", dev, "up"]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
        }
        net
    }

    fn cut(&self) {
        let id = std::process::id();
        ip(&[
            "-n",
            &self.names[0],
            "link",
            "set",
            &format!("nv{id}a"),
            "down",
        ]);
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

fn rank_body() {
    let group = nuvec_distributed_engine::init(true).expect("the ring forms across the link");
    group.barrier().unwrap();
    testing::mark("ready");
    let mut last = Instant::now();
    let error = loop {
        match group.all_sum(&mut [1.0f32; 256]) {
            Ok(()) => last = Instant::now(),
            Err(e) => break e,
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    testing::report_failure(&error, last.elapsed());
}

#[test]
#[ignore = "needs root and ip netns; tools/test.sh runs it when the machine allows it"]
fn cutting_a_link_fails_both_ranks_naming_each_other() {
    if testing::as_rank(NAME, rank_body) {
        return;
    }
    let subnet = (std::process::id() % 200) as u8 + 20;
    let net = Net::new(subnet);
    let nodes = vec![
        vec![format!("10.201.{subnet}.1:40001")],
        vec![format!("10.201.{subnet}.2:40002")],
    ];
    let names = net.names.clone();
    let running = Launch::new(2, 1)
        .timeout(3.0)
        .deadline(Duration::from_secs(60))
        .nodes(nodes)
        .command(move |rank| testing::this_test_in(&["ip", "netns", "exec", &names[rank]], NAME))
        .spawn(NAME);
    for rank in 0..2 {
        running.wait_for(rank, "ready", Duration::from_secs(30));
    }
    std::thread::sleep(Duration::from_millis(200));
    net.cut();
    let outputs = running.finish();
    for o in &outputs {
        let (_, peer, message) = o.finished_failure();
        assert_eq!(peer, Some(1 - o.rank), "rank {}: {message}", o.rank);
    }
}
