//! What the tests tell the provider, through the environment: the machine's devices, the
//! directory its queue pairs meet in, and the faults to inject.
//!
//! - [`DEVICES_VAR`]: comma-separated devices, each `name` followed by optional `:key=value`
//!   settings: `state=active|down|init|armed` (port 1's state, default active),
//!   `ipv4=a.b.c.d` (the IPv4-mapped GID, default `10.77.x.y` from the device's position;
//!   `ipv4=none` publishes none) and `gid=N` (the GID table index of that entry, default 1;
//!   index 0 always holds a link-local GID, as on real ports).
//! - [`DIR_VAR`]: the directory under which the hidden fabric directory (`.nuvec-verbs`)
//!   holds one Unix socket per queue pair; each test uses its own. Without it,
//!   `/tmp/.nuvec-verbs-<uid>` is used.
//! - [`EARLY_VAR`]: what happens to a message that arrives before a receive is posted:
//!   `hold` (the default) keeps it until one is, as Apple's Thunderbolt transport evidently
//!   does and JACCL depends on (it has no credits; see `src/jaccl/emulated.rs`); `drop` loses
//!   it, as the InfiniBand specification's UC does.
//! - [`FAULT_VAR`]: comma-separated faults of this process, each keyed to the N-th SEND it
//!   posts (counting from 1): `drop=N` (completes successfully, never arrives), `error=N`
//!   (completes with a general error), `exit=N` (the process exits at once with code 86:
//!   a peer gone mid-collective), `down=N` (port 1 of every device goes down from that send
//!   on: it and later sends complete with an error, arrivals are lost, queries say down).

use std::net::Ipv4Addr;
use std::path::PathBuf;

use crate::abi::{IBV_PORT_ACTIVE, IBV_PORT_DOWN};

/// The devices of the machine.
pub const DEVICES_VAR: &str = "NUVEC_VERBS_PROVIDER_DEVICES";
/// The directory (per test) under which queue pairs meet.
pub const DIR_VAR: &str = "NUVEC_VERBS_PROVIDER_DIR";
/// `hold` or `drop`: the fate of a message that finds no receive posted.
pub const EARLY_VAR: &str = "NUVEC_VERBS_PROVIDER_EARLY";
/// Faults to inject in this process.
pub const FAULT_VAR: &str = "NUVEC_VERBS_PROVIDER_FAULT";
/// Set to `off` to refuse completion channels (`ibv_create_comp_channel` fails with
/// `ENOSYS`), as a library without them would: the binding then polls and naps.
pub const CHANNELS_VAR: &str = "NUVEC_VERBS_PROVIDER_CHANNELS";

/// One device, with its single port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DeviceSpec {
    pub(crate) name: String,
    pub(crate) state: u32,
    /// The GID table: index 0 link-local, the IPv4-mapped entry at its index, zeros between.
    pub(crate) gids: Vec<[u8; 16]>,
}

/// The devices [`DEVICES_VAR`] describes.
pub(crate) fn devices() -> Result<Vec<DeviceSpec>, String> {
    let text = std::env::var(DEVICES_VAR).unwrap_or_default();
    parse_devices(&text)
}

pub(crate) fn parse_devices(text: &str) -> Result<Vec<DeviceSpec>, String> {
    let mut out: Vec<DeviceSpec> = Vec::new();
    for (i, entry) in text
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .enumerate()
    {
        let mut parts = entry.split(':');
        let name = parts.next().unwrap_or_default().to_string();
        if name.is_empty() || name.len() > 63 {
            return Err(format!(
                "{DEVICES_VAR}: device {i} has an empty or too long name"
            ));
        }
        if out.iter().any(|d| d.name == name) {
            return Err(format!("{DEVICES_VAR}: device {name} is listed twice"));
        }
        let index = u8::try_from(i).map_err(|_| format!("{DEVICES_VAR}: too many devices"))?;
        let mut state = IBV_PORT_ACTIVE;
        let mut ipv4 = Some(Ipv4Addr::new(10, 77, index / 16, index % 16 + 1));
        let mut gid_index = 1usize;
        for setting in parts {
            let (key, value) = setting
                .split_once('=')
                .ok_or_else(|| format!("{DEVICES_VAR}: {name}: {setting:?} is not key=value"))?;
            match key {
                "state" => {
                    state = match value {
                        "down" => IBV_PORT_DOWN,
                        "init" => 2,
                        "armed" => 3,
                        "active" => IBV_PORT_ACTIVE,
                        _ => return Err(format!("{DEVICES_VAR}: {name}: unknown state {value}")),
                    }
                }
                "ipv4" if value == "none" => ipv4 = None,
                "ipv4" => {
                    ipv4 = Some(value.parse().map_err(|_| {
                        format!("{DEVICES_VAR}: {name}: {value} is not an IPv4 address")
                    })?)
                }
                "gid" => {
                    gid_index = value
                        .parse()
                        .ok()
                        .filter(|&g| (1..16).contains(&g))
                        .ok_or_else(|| {
                            format!("{DEVICES_VAR}: {name}: gid index {value} is not 1..15")
                        })?
                }
                _ => return Err(format!("{DEVICES_VAR}: {name}: unknown setting {key}")),
            }
        }
        let mut link_local = [0u8; 16];
        link_local[..2].copy_from_slice(&[0xfe, 0x80]);
        link_local[8..].copy_from_slice(&[0x02, 0x00, 0x5e, 0xff, 0xfe, 0x77, index, 1]);
        let mut gids = vec![link_local];
        if let Some(ip) = ipv4 {
            gids.resize(gid_index + 1, [0; 16]);
            let mut mapped = [0u8; 16];
            mapped[10..12].copy_from_slice(&[0xff, 0xff]);
            mapped[12..].copy_from_slice(&ip.octets());
            gids[gid_index] = mapped;
        }
        out.push(DeviceSpec { name, state, gids });
    }
    Ok(out)
}

/// Whether messages that find no receive posted are held (else dropped); an unknown value
/// is reported on stderr and holds.
pub(crate) fn hold_early_sends() -> bool {
    match std::env::var(EARLY_VAR).as_deref() {
        Ok("drop") => false,
        Ok("hold") | Err(_) => true,
        Ok(other) => {
            eprintln!("nuvec verbs provider: {EARLY_VAR}={other:?} is neither hold nor drop");
            true
        }
    }
}

/// The fabric directory.
pub(crate) fn fabric_dir() -> PathBuf {
    match std::env::var_os(DIR_VAR) {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir).join(".nuvec-verbs"),
        // Without a per-test directory, one per user, so users do not share sockets.
        _ => std::env::temp_dir().join(format!(".nuvec-verbs-{}", user_tag())),
    }
}

fn user_tag() -> String {
    std::env::var("USER").unwrap_or_else(|_| "default".into())
}

/// Faults of this process, by the number of the send they strike.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Faults {
    pub(crate) drop: Option<u64>,
    pub(crate) error: Option<u64>,
    pub(crate) exit: Option<u64>,
    pub(crate) down: Option<u64>,
}

/// The faults [`FAULT_VAR`] asks for; an unreadable setting is reported on stderr once and
/// injects nothing (a test that meant a fault then fails to see it).
pub(crate) fn faults() -> Faults {
    let text = std::env::var(FAULT_VAR).unwrap_or_default();
    parse_faults(&text).unwrap_or_else(|e| {
        eprintln!("nuvec verbs provider: {e}");
        Faults::default()
    })
}

pub(crate) fn parse_faults(text: &str) -> Result<Faults, String> {
    let mut f = Faults::default();
    for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (key, n) = entry
            .split_once('=')
            .ok_or_else(|| format!("{FAULT_VAR}: {entry:?} is not kind=N"))?;
        let n: u64 = n
            .parse()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("{FAULT_VAR}: {entry:?}: N counts sends from 1"))?;
        let slot = match key {
            "drop" => &mut f.drop,
            "error" => &mut f.error,
            "exit" => &mut f.exit,
            "down" => &mut f.down,
            _ => return Err(format!("{FAULT_VAR}: unknown fault {key}")),
        };
        *slot = Some(n);
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_have_a_link_local_gid_and_an_ipv4_mapped_one_where_asked() {
        let d = parse_devices("a, b:state=down:ipv4=169.254.0.2:gid=3, c:ipv4=none").unwrap();
        assert_eq!(d.len(), 3);
        assert_eq!(d[0].state, IBV_PORT_ACTIVE);
        assert_eq!(d[0].gids.len(), 2);
        assert_eq!(d[0].gids[1][10..], [0xff, 0xff, 10, 77, 0, 1]);
        assert_eq!(d[1].state, IBV_PORT_DOWN);
        assert_eq!(d[1].gids.len(), 4);
        assert_eq!(d[1].gids[2], [0; 16]);
        assert_eq!(d[1].gids[3][12..], [169, 254, 0, 2]);
        assert_eq!(d[2].gids.len(), 1);
        assert_eq!(d[2].gids[0][..2], [0xfe, 0x80]);
        assert!(parse_devices("a,a").unwrap_err().contains("twice"));
        assert!(
            parse_devices("a:colour=red")
                .unwrap_err()
                .contains("colour")
        );
        assert!(parse_devices("a:gid=0").unwrap_err().contains("gid"));
        assert!(parse_devices("").unwrap().is_empty());
    }

    #[test]
    fn faults_name_the_send_they_strike() {
        let f = parse_faults("drop=3, exit=9").unwrap();
        assert_eq!(
            (f.drop, f.exit, f.error, f.down),
            (Some(3), Some(9), None, None)
        );
        assert!(parse_faults("drop=0").is_err());
        assert!(parse_faults("melt=1").is_err());
    }
}
