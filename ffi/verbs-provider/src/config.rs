//! What the tests tell the provider, through the environment: the profile, the machine's
//! devices, the directory its queue pairs meet in, and the faults to inject.
//!
//! - [`PROFILE_VAR`]: whose rules the provider follows. `apple` (the default, and what the
//!   JACCL tests run on) enforces the rules reported for Apple's `librdma` over Thunderbolt
//!   (see the crate docs, "The Apple profile", for each rule and its source); `rdma-core`
//!   follows the InfiniBand specification as rdma-core's providers do.
//! - [`DEVICES_VAR`]: comma-separated devices, each `name` followed by optional `:key=value`
//!   settings: `ports=N` (how many ports, 1 to 16; default 2 with the Apple profile, 1
//!   with rdma-core's), `active=K` (the port that is cabled and up; default the last port with
//!   the Apple profile, which reports that the active port is not always 1, else 1; every
//!   other port is down and has only a link-local GID), `state=active|down|init|armed` (that
//!   port's state, default active), `ipv4=a.b.c.d` (its IPv4-mapped GID, default `10.77.x.y`
//!   from the device's position; `ipv4=none` publishes none), `gid=N` (the GID table index of
//!   that entry, default 1; index 0 always holds a link-local GID, as on real ports) and
//!   `max_qp=N` (queue pairs the device allows; default 10 with the Apple profile, unlimited
//!   with rdma-core's).
//! - [`DIR_VAR`]: the directory under which the hidden fabric directory (`.nuvec-verbs`)
//!   holds one Unix socket per queue pair; each test uses its own. Without it,
//!   `/tmp/.nuvec-verbs-<uid>` is used.
//! - [`EARLY_VAR`] (rdma-core profile only): what happens to a message that arrives before a
//!   receive is posted: `hold` (the default) keeps it until one is; `drop` loses it, as the
//!   InfiniBand specification's UC does. The Apple profile always holds it (Apple's
//!   transport has credit-based flow control, and JACCL, which has no credits of its own,
//!   depends on that: see `src/transport/rdma/emulated.rs`); asking it to drop is an error.
//! - [`FAULT_VAR`]: comma-separated faults of this process, each keyed to the N-th SEND it
//!   posts (counting from 1): `drop=N` (completes successfully, never arrives), `error=N`
//!   (completes with a general error), `exit=N` (the process exits at once with code 86:
//!   a peer gone mid-collective), `down=N` (every port of every device goes down from that
//!   send on: it and later sends complete with an error, arrivals are lost, queries say
//!   down).

use std::net::Ipv4Addr;
use std::path::PathBuf;

use crate::abi::{IBV_PORT_ACTIVE, IBV_PORT_DOWN};

/// `apple` (the default) or `rdma-core`: whose rules the provider follows.
pub const PROFILE_VAR: &str = "NUVEC_VERBS_PROVIDER_PROFILE";
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

/// Whose rules the provider follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Profile {
    /// Apple's `librdma` over Thunderbolt, as reported (see the crate docs).
    Apple,
    /// The InfiniBand specification, as rdma-core's providers implement it.
    RdmaCore,
}

/// The profile [`PROFILE_VAR`] names.
pub(crate) fn profile() -> Result<Profile, String> {
    match std::env::var(PROFILE_VAR).as_deref() {
        Err(_) | Ok("apple") => Ok(Profile::Apple),
        Ok("rdma-core") => Ok(Profile::RdmaCore),
        Ok(other) => Err(format!(
            "{PROFILE_VAR}={other:?} is neither apple nor rdma-core"
        )),
    }
}

/// One device and its ports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DeviceSpec {
    pub(crate) name: String,
    /// How many ports, numbered from 1.
    pub(crate) ports: u8,
    /// The port that is cabled; every other is down.
    pub(crate) active: u8,
    /// The cabled port's state.
    pub(crate) state: u32,
    /// The cabled port's GID table: index 0 link-local, the IPv4-mapped entry at its index,
    /// zeros between. The other ports have the link-local entry only.
    pub(crate) gids: Vec<[u8; 16]>,
    /// Queue pairs the device allows at once.
    pub(crate) max_qp: usize,
}

impl DeviceSpec {
    /// Port `port`'s state.
    pub(crate) fn port_state(&self, port: u8) -> Option<u32> {
        match port {
            p if p == self.active => Some(self.state),
            p if (1..=self.ports).contains(&p) => Some(IBV_PORT_DOWN),
            _ => None,
        }
    }

    /// Port `port`'s GID table.
    pub(crate) fn port_gids(&self, port: u8) -> Option<&[[u8; 16]]> {
        match port {
            p if p == self.active => Some(&self.gids),
            p if (1..=self.ports).contains(&p) => Some(&self.gids[..1]),
            _ => None,
        }
    }
}

/// The devices [`DEVICES_VAR`] describes, with `profile`'s defaults.
pub(crate) fn devices(profile: Profile) -> Result<Vec<DeviceSpec>, String> {
    let text = std::env::var(DEVICES_VAR).unwrap_or_default();
    parse_devices(&text, profile)
}

pub(crate) fn parse_devices(text: &str, profile: Profile) -> Result<Vec<DeviceSpec>, String> {
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
        let mut ports = match profile {
            Profile::Apple => 2,
            Profile::RdmaCore => 1,
        };
        let mut active = None;
        let mut max_qp = match profile {
            Profile::Apple => 10,
            Profile::RdmaCore => usize::MAX,
        };
        let number = |value: &str, what: &str, range: std::ops::RangeInclusive<usize>| {
            value
                .parse::<usize>()
                .ok()
                .filter(|n| range.contains(n))
                .ok_or_else(|| {
                    format!(
                        "{DEVICES_VAR}: {name}: {what} {value} is not {}..{}",
                        range.start(),
                        range.end()
                    )
                })
        };
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
                "ports" => ports = number(value, "port count", 1..=16)? as u8,
                "active" => active = Some(number(value, "active port", 1..=16)? as u8),
                "max_qp" => max_qp = number(value, "queue-pair limit", 1..=1 << 20)?,
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
        let active = active.unwrap_or(match profile {
            Profile::Apple => ports,
            Profile::RdmaCore => 1,
        });
        if active > ports {
            return Err(format!(
                "{DEVICES_VAR}: {name}: active port {active} of {ports} port(s)"
            ));
        }
        out.push(DeviceSpec {
            name,
            ports,
            active,
            state,
            gids,
            max_qp,
        });
    }
    Ok(out)
}

/// Whether messages that find no receive posted are held (else dropped), under
/// `profile`: Apple's transport always holds them.
///
/// # Errors
///
/// A value other than `hold` or `drop`, or `drop` with the Apple profile.
pub(crate) fn hold_early_sends(profile: Profile) -> Result<bool, String> {
    match (std::env::var(EARLY_VAR).as_deref(), profile) {
        (Ok("drop"), Profile::Apple) => Err(format!(
            "{EARLY_VAR}=drop contradicts {PROFILE_VAR}=apple: Apple's transport holds a \
             message until a receive is posted (use {PROFILE_VAR}=rdma-core)"
        )),
        (Ok("drop"), Profile::RdmaCore) => Ok(false),
        (Ok("hold") | Err(_), _) => Ok(true),
        (Ok(other), _) => Err(format!("{EARLY_VAR}={other:?} is neither hold nor drop")),
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
        let d = parse_devices(
            "a, b:state=down:ipv4=169.254.0.2:gid=3, c:ipv4=none",
            Profile::RdmaCore,
        )
        .unwrap();
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
        assert_eq!((d[0].ports, d[0].active, d[0].max_qp), (1, 1, usize::MAX));
        let rd = Profile::RdmaCore;
        assert!(parse_devices("a,a", rd).unwrap_err().contains("twice"));
        assert!(
            parse_devices("a:colour=red", rd)
                .unwrap_err()
                .contains("colour")
        );
        assert!(parse_devices("a:gid=0", rd).unwrap_err().contains("gid"));
        assert!(parse_devices("", rd).unwrap().is_empty());
    }

    #[test]
    fn apple_devices_have_their_active_port_last_and_ten_queue_pairs() {
        let d = parse_devices("a, b:ports=4:active=3:max_qp=2, c:ports=1", Profile::Apple).unwrap();
        assert_eq!((d[0].ports, d[0].active, d[0].max_qp), (2, 2, 10));
        assert_eq!(d[0].port_state(2), Some(IBV_PORT_ACTIVE));
        assert_eq!(d[0].port_state(1), Some(IBV_PORT_DOWN));
        assert_eq!(d[0].port_state(3), None);
        assert_eq!(d[0].port_gids(1).unwrap().len(), 1);
        assert_eq!(d[0].port_gids(2).unwrap().len(), 2);
        assert_eq!((d[1].ports, d[1].active, d[1].max_qp), (4, 3, 2));
        assert_eq!((d[2].ports, d[2].active), (1, 1));
        let apple = Profile::Apple;
        assert!(parse_devices("a:ports=2:active=3", apple).is_err());
        assert!(parse_devices("a:ports=0", apple).is_err());
        assert!(parse_devices("a:max_qp=0", apple).is_err());
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
