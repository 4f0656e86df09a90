//! Pure parsers for what `nuvec doctor` reads from a host: `ip -j addr`, `ifconfig`,
//! `networksetup -listallhardwareports`, `system_profiler SPThunderboltDataType`,
//! `ibv_devinfo` and the default route. They never fail on odd input: what they cannot
//! read is left out, and the checks then report it as missing.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::Serialize;
use serde_json::Value;

/// A network interface and what the checks need of it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Interface {
    /// Its name (`eth0`, `en2`, `bridge0`).
    pub name: String,
    /// Its MTU, when the tool printed one.
    pub mtu: Option<u32>,
    /// Whether it is administratively up.
    pub up: bool,
    /// Its addresses with their prefix lengths.
    pub addrs: Vec<(IpAddr, u8)>,
    /// A bridge's member interfaces (macOS `ifconfig`'s `member:` lines).
    pub members: Vec<String>,
}

impl Interface {
    /// Whether `ip` is one of its addresses.
    pub fn holds(&self, ip: IpAddr) -> bool {
        self.addrs.iter().any(|(a, _)| *a == ip)
    }

    /// Whether `ip` is on one of its subnets.
    pub fn on_subnet(&self, ip: IpAddr) -> bool {
        self.addrs
            .iter()
            .any(|&(a, prefix)| same_subnet(a, ip, prefix))
    }
}

/// Whether `a` and `b` share their first `prefix` bits (false across address families).
pub fn same_subnet(a: IpAddr, b: IpAddr, prefix: u8) -> bool {
    fn masked(bits: u128, width: u32, prefix: u8) -> u128 {
        let keep = u32::from(prefix).min(width);
        if keep == 0 { 0 } else { bits >> (width - keep) }
    }
    match (a, b) {
        (IpAddr::V4(a), IpAddr::V4(b)) => {
            masked(u32::from(a).into(), 32, prefix) == masked(u32::from(b).into(), 32, prefix)
        }
        (IpAddr::V6(a), IpAddr::V6(b)) => {
            masked(u128::from(a), 128, prefix) == masked(u128::from(b), 128, prefix)
        }
        _ => false,
    }
}

/// Parses `ip -j addr` (iproute2's JSON: a list of links, each with `ifname`, `mtu`,
/// `flags` and `addr_info` entries of `local`/`prefixlen`).
///
/// # Errors
///
/// Text that is not a JSON list (the caller names the host and command).
pub fn ip_addr_json(text: &str) -> Result<Vec<Interface>, String> {
    let value: Value = serde_json::from_str(text.trim()).map_err(|e| format!("not JSON ({e})"))?;
    let Value::Array(links) = value else {
        return Err("not a JSON list of interfaces".into());
    };
    let mut out = Vec::new();
    for link in &links {
        let Some(name) = link.get("ifname").and_then(Value::as_str) else {
            continue;
        };
        let mtu = link
            .get("mtu")
            .and_then(Value::as_u64)
            .and_then(|m| u32::try_from(m).ok());
        let up = link
            .get("flags")
            .and_then(Value::as_array)
            .is_some_and(|f| f.iter().any(|f| f.as_str() == Some("UP")));
        let addrs = link
            .get("addr_info")
            .and_then(Value::as_array)
            .map(|infos| {
                infos
                    .iter()
                    .filter_map(|info| {
                        let ip = info.get("local")?.as_str()?.parse::<IpAddr>().ok()?;
                        let prefix = info.get("prefixlen")?.as_u64()?;
                        Some((ip, u8::try_from(prefix).ok()?))
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.push(Interface {
            name: name.to_string(),
            mtu,
            up,
            addrs,
            members: Vec::new(),
        });
    }
    Ok(out)
}

/// Parses `ifconfig -a`: macOS's (and BSD's) layout, where a line starting in column 0 is
/// `NAME: flags=N<...> mtu M`, followed by indented `inet A netmask 0xffffff00`,
/// `inet6 A prefixlen P` and, for a bridge, `member: enX flags=...` lines. Linux net-tools'
/// layout (`inet A  netmask 255.255.255.0`) reads the same way.
pub fn ifconfig(text: &str) -> Vec<Interface> {
    let mut out: Vec<Interface> = Vec::new();
    for line in text.lines() {
        if line.is_empty() {
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        if !line.starts_with([' ', '\t']) {
            let Some(name) = words
                .first()
                .and_then(|w| w.strip_suffix(':'))
                .filter(|n| !n.is_empty())
            else {
                continue;
            };
            let flags = words.get(1).copied().unwrap_or("");
            let mtu = words
                .iter()
                .position(|&w| w == "mtu")
                .and_then(|i| words.get(i + 1))
                .and_then(|m| m.parse().ok());
            out.push(Interface {
                name: name.to_string(),
                mtu,
                up: flags.contains("<UP") || flags.contains(",UP"),
                ..Interface::default()
            });
            continue;
        }
        let Some(current) = out.last_mut() else {
            continue;
        };
        match words.as_slice() {
            ["inet", addr, rest @ ..] => {
                let Ok(ip) = addr.parse::<IpAddr>() else {
                    continue;
                };
                let prefix = after(rest, "netmask")
                    .and_then(netmask_prefix)
                    .unwrap_or(32);
                current.addrs.push((ip, prefix));
            }
            ["inet6", addr, rest @ ..] => {
                // A link-local address carries its scope: fe80::1%en0.
                let addr = addr.split('%').next().unwrap_or(addr);
                let Ok(ip) = addr.parse::<IpAddr>() else {
                    continue;
                };
                let prefix = after(rest, "prefixlen")
                    .and_then(|p| p.parse().ok())
                    .unwrap_or(128);
                current.addrs.push((ip, prefix));
            }
            ["member:", member, ..] => current.members.push((*member).to_string()),
            _ => {}
        }
    }
    out
}

/// The word after `key` in `words`, if `key` is there and has one after it.
fn after<'a>(words: &[&'a str], key: &str) -> Option<&'a str> {
    let i = words.iter().position(|&w| w == key)?;
    words.get(i + 1).copied()
}

/// A netmask as macOS (`0xffffff00`) or net-tools (`255.255.255.0`) prints it, as a
/// prefix length; `None` for a mask that is not contiguous ones.
fn netmask_prefix(mask: &str) -> Option<u8> {
    let bits = match mask.strip_prefix("0x") {
        Some(hex) => u32::from_str_radix(hex, 16).ok()?,
        None => u32::from(mask.parse::<std::net::Ipv4Addr>().ok()?),
    };
    let ones = bits.leading_ones();
    (bits.checked_shl(ones).unwrap_or(0) == 0).then_some(ones as u8)
}

/// One entry of `networksetup -listallhardwareports`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HardwarePort {
    /// `Hardware Port:` (e.g. `Thunderbolt 1`, `Thunderbolt Bridge`, `Ethernet`).
    pub port: String,
    /// `Device:` (e.g. `en2`, `bridge0`).
    pub device: String,
}

impl HardwarePort {
    /// A Thunderbolt port's network interface (not the bridge that groups them).
    pub fn is_thunderbolt(&self) -> bool {
        self.port.starts_with("Thunderbolt") && self.port != "Thunderbolt Bridge"
    }
}

/// Parses `networksetup -listallhardwareports`: blocks of `Hardware Port: X`, `Device: Y`,
/// `Ethernet Address: Z`; a port without a device line is left out.
pub fn hardware_ports(text: &str) -> Vec<HardwarePort> {
    let mut out = Vec::new();
    let mut port: Option<String> = None;
    for line in text.lines() {
        if let Some(p) = line.strip_prefix("Hardware Port:") {
            port = Some(p.trim().to_string());
        } else if let Some(d) = line.strip_prefix("Device:")
            && let Some(p) = port.take()
        {
            out.push(HardwarePort {
                port: p,
                device: d.trim().to_string(),
            });
        }
    }
    out
}

/// The link speeds (Gb/s) `system_profiler SPThunderboltDataType` gives for ports with a
/// device connected: in each `Port:` block, the `Speed: Up to N Gb/s` line counts when the
/// block's `Status:` says a device is connected. 80 Gb/s or more is Thunderbolt 5;
/// 40 Gb/s is Thunderbolt 4 (or 3, or USB4).
pub fn thunderbolt_speeds(text: &str) -> Vec<u32> {
    let mut out = Vec::new();
    let mut connected = false;
    let mut speed: Option<u32> = None;
    let mut flush = |connected: &mut bool, speed: &mut Option<u32>| {
        if *connected && let Some(s) = speed.take() {
            out.push(s);
        }
        *connected = false;
        *speed = None;
    };
    for line in text.lines() {
        let t = line.trim();
        if t == "Port:" || t == "Port (Upstream):" || t.ends_with("Bus:") || t.contains(" Bus ") {
            flush(&mut connected, &mut speed);
        } else if let Some(status) = t.strip_prefix("Status:") {
            connected = status.trim() == "Device connected";
        } else if let Some(s) = t.strip_prefix("Speed:") {
            speed = s
                .split_whitespace()
                .zip(s.split_whitespace().skip(1))
                .find(|(_, unit)| unit.starts_with("Gb/s"))
                .and_then(|(n, _)| n.parse().ok());
        }
    }
    flush(&mut connected, &mut speed);
    out
}

/// One RDMA device of `ibv_devinfo` and its ports' states.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RdmaDevice {
    /// `hca_id:` (e.g. `rdma_en2`, `mlx5_0`).
    pub name: String,
    /// (port number, state such as `PORT_ACTIVE`).
    pub ports: Vec<(u32, String)>,
}

impl RdmaDevice {
    /// Whether any of its ports is `PORT_ACTIVE`.
    pub fn active(&self) -> bool {
        self.jaccl_port().is_some()
    }

    /// The port JACCL binds its queue pairs to: the first `PORT_ACTIVE` one (the active
    /// port of a Thunderbolt device is not always 1; MLX assumes 1).
    pub fn jaccl_port(&self) -> Option<u32> {
        self.ports
            .iter()
            .find(|(_, s)| s == "PORT_ACTIVE")
            .map(|&(n, _)| n)
    }
}

/// Parses `ibv_devinfo` (rdma-core's layout: `hca_id:\tNAME` starts a device, a
/// `port:\tN` line a port, whose `state:\t\tPORT_ACTIVE (4)` follows). "No IB devices
/// found" gives an empty list.
pub fn ibv_devinfo(text: &str) -> Vec<RdmaDevice> {
    let mut out: Vec<RdmaDevice> = Vec::new();
    for line in text.lines() {
        let t = line.trim();
        if let Some(name) = t.strip_prefix("hca_id:") {
            out.push(RdmaDevice {
                name: name.trim().to_string(),
                ports: Vec::new(),
            });
        } else if let Some(port) = t.strip_prefix("port:")
            && let Some(device) = out.last_mut()
            && let Ok(n) = port.trim().parse()
        {
            device.ports.push((n, String::new()));
        } else if let Some(state) = t.strip_prefix("state:")
            && let Some(device) = out.last_mut()
            && let Some(port) = device.ports.last_mut()
        {
            port.1 = state.split_whitespace().next().unwrap_or("").to_string();
        }
    }
    out
}

/// The default route's interface: from `ip -j route show default` (Linux: `dev` of the
/// first entry) or `route -n get default` (macOS: the `interface:` line).
pub fn default_route_interface(text: &str) -> Option<String> {
    if let Ok(Value::Array(routes)) = serde_json::from_str::<Value>(text.trim()) {
        return routes
            .iter()
            .find_map(|r| r.get("dev")?.as_str().map(String::from));
    }
    text.lines()
        .find_map(|l| l.trim().strip_prefix("interface:"))
        .map(|i| i.trim().to_string())
        .filter(|i| !i.is_empty())
}

/// Splits the output of the doctor's probe script into its sections: each starts with a
/// line `@@NAME` and runs to the next.
pub fn sections(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut current: Option<(String, String)> = None;
    for line in text.lines() {
        if let Some(name) = line.strip_prefix("@@") {
            if let Some((n, body)) = current.take() {
                out.insert(n, body);
            }
            current = Some((name.trim().to_string(), String::new()));
        } else if let Some((_, body)) = current.as_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    if let Some((n, body)) = current {
        out.insert(n, body);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fixtures in tools/tests/data/doctor, written from each tool's documented layout (the
    /// formats are named where each is read).
    fn fixture(name: &str) -> String {
        let path = format!("{}/tests/data/doctor/{name}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn ip_addr_json_reads_iproute2() {
        // iproute2 6.x `ip -j addr`: a down interface without addresses, a veth with
        // link_index/link_netnsid, and an entry with an address that does not parse.
        let list = ip_addr_json(&fixture("ip-addr.json")).unwrap();
        let names: Vec<&str> = list.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(names, ["lo", "enp3s0", "wlp2s0", "veth0", "odd"]);
        let en = &list[1];
        assert_eq!((en.mtu, en.up), (Some(9000), true));
        assert_eq!(
            en.addrs,
            [(ip("10.0.0.11"), 24), (ip("fe80::3eec:efff:fe12:3456"), 64)]
        );
        assert!(!list[2].up && list[2].addrs.is_empty());
        assert_eq!(list[3].mtu, Some(1400));
        assert!(list[3].on_subnet(ip("192.168.50.2")));
        assert!(!list[3].on_subnet(ip("192.168.50.5")));
        assert!(list[4].addrs.is_empty() && list[4].mtu.is_none());
        // Not JSON, or JSON of another shape: an error, never a panic.
        assert!(ip_addr_json("Object \"-j\" is unknown").is_err());
        assert!(ip_addr_json("{}").is_err());
        assert_eq!(ip_addr_json("[1, null, {}]").unwrap(), []);
    }

    #[test]
    fn ifconfig_reads_macos_with_bridge_members() {
        // macOS 14/15 `ifconfig -a`: hex netmasks, scoped link-local IPv6, bridge0 with
        // `member:` lines, an interface without addresses.
        let list = ifconfig(&fixture("ifconfig-macos.txt"));
        let names: Vec<&str> = list.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(
            names,
            ["lo0", "gif0", "en0", "en2", "en3", "bridge0", "utun0"]
        );
        let en0 = &list[2];
        assert_eq!((en0.mtu, en0.up), (Some(1500), true));
        assert_eq!(
            en0.addrs,
            [
                (ip("fe80::18c1:5b4d:7e1f:2a3b"), 64),
                (ip("192.168.1.23"), 24)
            ]
        );
        assert!(!list[1].up);
        assert_eq!(list[3].addrs, [(ip("192.168.0.1"), 30)]);
        assert_eq!(list[5].members, ["en2", "en3"]);
        assert!(list[5].addrs.is_empty());
        assert_eq!(list[6].mtu, Some(1380));
    }

    #[test]
    fn ifconfig_reads_linux_net_tools() {
        // net-tools 2.10 `ifconfig -a` on Linux: dotted netmasks, two spaces between fields.
        let text = "eth0: flags=4163<UP,BROADCAST,RUNNING,MULTICAST>  mtu 1500\n        \
                    inet 10.1.2.3  netmask 255.255.254.0  broadcast 10.1.3.255\n        \
                    inet6 fe80::1  prefixlen 64  scopeid 0x20<link>\n        \
                    ether 02:42:ac:11:00:02  txqueuelen 0  (Ethernet)\n\n\
                    lo: flags=73<UP,LOOPBACK,RUNNING>  mtu 65536\n        \
                    inet 127.0.0.1  netmask 255.0.0.0\n";
        let list = ifconfig(text);
        assert_eq!(list.len(), 2);
        assert_eq!(list[0].addrs[0], (ip("10.1.2.3"), 23));
        assert_eq!(list[0].addrs[1], (ip("fe80::1"), 64));
        assert_eq!((list[1].name.as_str(), list[1].mtu), ("lo", Some(65536)));
        // A mask that is not contiguous ones, and garbage, do not panic.
        assert_eq!(netmask_prefix("0xff00ff00"), None);
        assert_eq!(netmask_prefix("0x"), None);
        assert_eq!(netmask_prefix("0xffffffff"), Some(32));
        assert_eq!(netmask_prefix("0x00000000"), Some(0));
        // Indented lines before any interface, a nameless header: nothing, no panic.
        assert_eq!(
            ifconfig("\t inet 1.2.3.4\n: flags=0 mtu x\nnot a header\n"),
            []
        );
    }

    #[test]
    fn networksetup_names_the_thunderbolt_ports() {
        // macOS 15 `networksetup -listallhardwareports`.
        let ports = hardware_ports(&fixture("networksetup.txt"));
        assert_eq!(ports.len(), 5);
        let tb: Vec<&str> = ports
            .iter()
            .filter(|p| p.is_thunderbolt())
            .map(|p| p.device.as_str())
            .collect();
        assert_eq!(tb, ["en2", "en3"], "the bridge is not a port");
        assert_eq!(ports[1].port, "Thunderbolt Bridge");
        assert_eq!(hardware_ports("Device: en9\nHardware Port: x\n"), []);
    }

    #[test]
    fn system_profiler_tells_tb5_from_tb4() {
        // macOS 15 `system_profiler SPThunderboltDataType` (text): only ports with a device
        // connected count; bus 1's empty port does not.
        assert_eq!(
            thunderbolt_speeds(&fixture("system-profiler-tb5.txt")),
            [80, 80]
        );
        assert_eq!(
            thunderbolt_speeds(&fixture("system-profiler-tb4.txt")),
            [40, 40]
        );
        assert_eq!(
            thunderbolt_speeds("Port:\nStatus: No device connected\nSpeed: Up to 40 Gb/s\n"),
            Vec::<u32>::new()
        );
        assert!(thunderbolt_speeds("Speed: Up to lots Gb/s\nStatus: Device connected").is_empty());
    }

    #[test]
    fn ibv_devinfo_reads_devices_and_port_states() {
        // rdma-core's `ibv_devinfo` layout (as macOS 26.2 prints it for rdma_enX).
        let devices = ibv_devinfo(&fixture("ibv_devinfo.txt"));
        assert_eq!(devices.len(), 2);
        assert_eq!(devices[0].name, "rdma_en2");
        assert_eq!(devices[0].ports, [(1, "PORT_ACTIVE".to_string())]);
        assert!(devices[0].active());
        assert_eq!(devices[1].ports, [(1, "PORT_DOWN".to_string())]);
        assert!(!devices[1].active());
        assert_eq!(devices[0].jaccl_port(), Some(1));
        assert_eq!(devices[1].jaccl_port(), None);
        // A device whose active port is the second.
        let two = ibv_devinfo(
            "hca_id:\trdma_en5\n\tport:\t1\n\t\tstate:\t\tPORT_DOWN (1)\n\
             \tport:\t2\n\t\tstate:\t\tPORT_ACTIVE (4)\n",
        );
        assert_eq!(two[0].ports.len(), 2);
        assert_eq!(two[0].jaccl_port(), Some(2));
        assert_eq!(ibv_devinfo("No IB devices found\n"), []);
        assert_eq!(ibv_devinfo("\t\tport:\t1\nstate: X\n"), []);
    }

    #[test]
    fn default_route_on_linux_and_macos() {
        assert_eq!(
            default_route_interface(
                r#"[{"dst":"default","gateway":"10.0.0.1","dev":"enp3s0","protocol":"dhcp","flags":[]}]"#
            )
            .as_deref(),
            Some("enp3s0")
        );
        let macos = "   route to: default\ndestination: default\n       mask: default\n    \
                     gateway: 192.168.1.1\n  interface: en0\n      flags: <UP,GATEWAY,DONE>\n";
        assert_eq!(default_route_interface(macos).as_deref(), Some("en0"));
        assert_eq!(default_route_interface("[]"), None);
        assert_eq!(default_route_interface(""), None);
    }

    #[test]
    fn sections_split_at_markers() {
        let s = sections("ignored\n@@a\n1\n2\n@@b\n@@c\nx\n");
        assert_eq!(s["a"], "1\n2\n");
        assert_eq!(s["b"], "");
        assert_eq!(s["c"], "x\n");
        assert!(!s.contains_key("ignored"));
    }
}
