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

    /// Whether `ip` is on one of its IPv4/IPv6 subnets (excluding its own addresses'
    /// host routes: a /32 or /128 matches only itself).
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
            let Some(name) = words.first().and_then(|w| w.strip_suffix(':')) else {
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
                let prefix = rest
                    .iter()
                    .position(|&w| w == "netmask")
                    .and_then(|i| rest.get(i + 1))
                    .and_then(|m| netmask_prefix(m))
                    .unwrap_or(32);
                current.addrs.push((ip, prefix));
            }
            ["inet6", addr, rest @ ..] => {
                // A link-local address carries its scope: fe80::1%en0.
                let addr = addr.split('%').next().unwrap_or(addr);
                let Ok(ip) = addr.parse::<IpAddr>() else {
                    continue;
                };
                let prefix = rest
                    .iter()
                    .position(|&w| w == "prefixlen")
                    .and_then(|i| rest.get(i + 1))
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
        self.ports.iter().any(|(_, s)| s == "PORT_ACTIVE")
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
