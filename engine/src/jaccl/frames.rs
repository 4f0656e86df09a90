//! The data plane's units: messages of 4 KiB x 2^k, the size class a message length selects,
//! the pipeline depth, and the local tags of work requests. All constants are MLX 0.32.1's
//! (`jaccl/rdma.h`, `mesh_impl.h`, `ring_impl.h`).
//!
//! Every message on the wire is a whole registered buffer of its class, `S = 4096 << k`
//! bytes, even when fewer bytes are valid: the receiver works out the valid length itself and
//! ignores the stale tail. Which `k` a collective uses depends on a *message length* `M` that
//! each algorithm defines (the whole array, a slice per wire, ...), and on the macOS release:
//! macOS 26.2 only has 4 KiB messages, 26.3 and later choose the largest class not above `M`.
//! Ranks that disagree on the class cannot talk, so a mixed 26.2 / 26.3 group does not work,
//! with MLX as with this crate.

use std::fmt;
use std::str::FromStr;

use crate::error::Error;

/// The smallest message, and the unit of every class: 4 KiB.
pub const FRAME_SIZE: usize = 4096;

/// The number of size classes: 4 KiB to 512 KiB.
pub const CLASSES: usize = 8;

/// How many messages per connection and direction may be in flight: MLX's double buffering.
pub const PIPELINE: usize = 2;

/// The send queue depth MLX creates its queue pairs with (`rdma.h`), in work requests.
pub const MAX_SEND_WR: u32 = 32;

/// The receive queue depth MLX creates its queue pairs with.
pub const MAX_RECV_WR: u32 = 32;

/// MLX's completion queue: both queues' worth (sends and receives share it).
pub const CQ_ENTRIES: u32 = MAX_SEND_WR + MAX_RECV_WR;

/// The packet sequence number every queue pair starts at, and advertises.
pub const PSN: u32 = 7;

/// The most ranks MLX's mesh supports (work-request tags hold a rank in 8 bits).
pub const MESH_MAX_RANKS: usize = 8;

/// The most devices (cables) per neighbour MLX's ring supports.
pub const RING_MAX_CONNECTIONS: usize = 4;

/// The variable that overrides the size classes: `small` (macOS 26.2) or `large` (26.3+).
pub use crate::config::env::JACCL_BUFFERS_VAR as BUFFERS_VAR;

/// Which message sizes the ranks use: a property of the macOS release, which every rank of a
/// group must share.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SizeClasses {
    /// macOS 26.2: every message is 4 KiB.
    Small,
    /// macOS 26.3 and later: 4 KiB to 512 KiB, chosen by message length.
    Large,
}

impl SizeClasses {
    /// The classes this machine uses: [`BUFFERS_VAR`] if set; else, on macOS, `Small` before
    /// 26.3 and `Large` from it (MLX decides with `__builtin_available(macOS 26.3)`); `Large`
    /// elsewhere, which matches Macs on a current release.
    ///
    /// # Errors
    ///
    /// [`BUFFERS_VAR`] holds something other than `small` or `large`.
    pub fn detect() -> crate::error::Result<SizeClasses> {
        use crate::config::env;
        if let Some(classes) = env::value(&env::process, BUFFERS_VAR)? {
            return classes.parse();
        }
        Ok(Self::for_os_release(macos_release()))
    }

    /// The classes for a macOS release `(major, minor)`; `None` (not macOS, or unknown)
    /// gives `Large`.
    pub fn for_os_release(release: Option<(u32, u32)>) -> SizeClasses {
        match release {
            Some(release) if release < (26, 3) => SizeClasses::Small,
            _ => SizeClasses::Large,
        }
    }

    /// The class of a message of `message` bytes: MLX's `buffer_size_from_message`.
    pub fn class_for(self, message: usize) -> Class {
        if self == SizeClasses::Large {
            for k in (1..CLASSES).rev() {
                if message >= FRAME_SIZE << k {
                    return Class(k as u8);
                }
            }
        }
        Class(0)
    }

    /// The depth this crate gives each queue of a queue pair, sends and receives alike: the
    /// frames of two messages (the pipeline) of the largest class in use, and never less
    /// than MLX's 32.
    ///
    /// Apple's transport counts queue depth in 4 KiB Thunderbolt frames, not work requests
    /// (TN3205, as llama.cpp's Apple transport reports it). MLX asks for 32 per queue and
    /// keeps 2 messages in flight on each; counted in frames, 32 holds two messages of 4 to
    /// 64 KiB (2 x 1 to 2 x 16 frames) but only one of 128 KiB (32 frames) and none of 256 or
    /// 512 KiB (64 and 128 frames), the classes messages of 128 KiB and more use from macOS
    /// 26.3. So MLX's pipeline does not fit from the 128 KiB class, and this crate asks for
    /// 2 x 128 = 256 with large classes (MLX's 32 with small ones, which need 2). Where the
    /// depth counts work requests, 256 is only more room; llama.cpp's Apple transport asks
    /// for 512 on the same hardware. Nothing of it reaches the wire.
    ///
    /// # Examples
    ///
    /// ```
    /// use nuvec_distributed_engine::jaccl::SizeClasses;
    ///
    /// assert_eq!(SizeClasses::Large.queue_depth(), 256); // 2 x 512 KiB / 4 KiB
    /// assert_eq!(SizeClasses::Small.queue_depth(), 32); // MLX's
    /// ```
    pub fn queue_depth(self) -> u32 {
        let largest = self.used().last().map_or(1, Class::frames);
        (PIPELINE * largest).max(MAX_SEND_WR as usize) as u32
    }

    /// The classes that can occur: buffers are allocated for these only.
    pub fn used(self) -> impl Iterator<Item = Class> {
        let n = match self {
            SizeClasses::Small => 1,
            SizeClasses::Large => CLASSES,
        };
        (0..n as u8).map(Class)
    }
}

impl FromStr for SizeClasses {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        match s.trim() {
            "small" => Ok(SizeClasses::Small),
            "large" => Ok(SizeClasses::Large),
            other => Err(Error::Environment {
                var: BUFFERS_VAR,
                reason: format!(
                    "{other:?} is not a size class: \"small\" (macOS 26.2, 4 KiB messages) or \
                     \"large\" (macOS 26.3 and later)"
                ),
            }),
        }
    }
}

impl fmt::Display for SizeClasses {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SizeClasses::Small => "small",
            SizeClasses::Large => "large",
        })
    }
}

/// A size class `k`: messages of `4096 << k` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Class(pub u8);

impl Class {
    /// The message size `S` in bytes.
    pub fn bytes(self) -> usize {
        FRAME_SIZE << self.0
    }

    /// The index `k`.
    pub fn index(self) -> usize {
        usize::from(self.0)
    }

    /// The 4 KiB frames a message of this class covers: `2^k`.
    pub fn frames(self) -> usize {
        self.bytes() / FRAME_SIZE
    }
}

/// This Mac's release, from the system's version file (no process, no system call beyond a
/// read). `None` elsewhere or if the file cannot be read.
fn macos_release() -> Option<(u32, u32)> {
    if !cfg!(target_os = "macos") {
        return None;
    }
    let plist = std::fs::read_to_string("/System/Library/CoreServices/SystemVersion.plist").ok()?;
    parse_product_version(&plist)
}

/// The `(major, minor)` of the `ProductVersion` string of a `SystemVersion.plist`.
fn parse_product_version(plist: &str) -> Option<(u32, u32)> {
    let after_key = &plist[plist.find("<key>ProductVersion</key>")? + 25..];
    let start = after_key.find("<string>")? + 8;
    let end = start + after_key[start..].find("</string>")?;
    let mut parts = after_key[start..end].trim().split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next().map_or(Some(0), |m| m.parse().ok())?;
    Some((major, minor))
}

/// What a work request was, in MLX's tag layout: `kind << 16 | slot << 8 | index`, where the
/// index is the peer rank (mesh) or the direction (ring). The tag never leaves this process;
/// it is kept as MLX lays it out so traces read the same.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkTag {
    /// Whether it is a receive (MLX `RECV_WR`, 2) rather than a send (`SEND_WR`, 1).
    pub recv: bool,
    /// The pipeline slot (buffer) it used.
    pub slot: usize,
    /// The peer rank or direction.
    pub index: usize,
}

const SEND_WR: u64 = 1;
const RECV_WR: u64 = 2;

impl WorkTag {
    /// A send's tag.
    pub fn send(slot: usize, index: usize) -> Self {
        WorkTag {
            recv: false,
            slot,
            index,
        }
    }

    /// A receive's tag.
    pub fn recv(slot: usize, index: usize) -> Self {
        WorkTag {
            recv: true,
            slot,
            index,
        }
    }

    /// The 64-bit work-request id.
    pub fn encode(self) -> u64 {
        let kind = if self.recv { RECV_WR } else { SEND_WR };
        kind << 16 | (self.slot as u64 & 0xff) << 8 | (self.index as u64 & 0xff)
    }

    /// The tag of an id made by [`WorkTag::encode`].
    pub fn decode(id: u64) -> Self {
        WorkTag {
            recv: id >> 16 == RECV_WR,
            slot: (id >> 8 & 0xff) as usize,
            index: (id & 0xff) as usize,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The depth arithmetic of `queue_depth`'s docs: MLX's 32 work requests, counted in
    /// frames, hold two messages up to the 64 KiB class only; this crate's depth holds two of
    /// the largest class in use.
    #[test]
    fn queues_hold_two_messages_of_the_largest_class_counted_in_frames() {
        let fits_mlx = |k: u8| PIPELINE * Class(k).frames() <= MAX_SEND_WR as usize;
        assert!(
            (0..=4).all(fits_mlx),
            "4 to 64 KiB: two messages fit in 32 frames"
        );
        assert!((5..8).all(|k| !fits_mlx(k)), "128 to 512 KiB: they do not");
        assert_eq!(Class(5).frames(), 32);
        assert_eq!(Class(7).frames(), 128);
        assert_eq!(SizeClasses::Large.queue_depth(), 256);
        assert_eq!(SizeClasses::Small.queue_depth(), MAX_SEND_WR);
        for classes in [SizeClasses::Small, SizeClasses::Large] {
            let depth = classes.queue_depth() as usize;
            assert!(classes.used().all(|c| PIPELINE * c.frames() <= depth));
        }
    }

    #[test]
    fn large_classes_pick_the_largest_message_not_above_the_length() {
        let c = SizeClasses::Large;
        assert_eq!(c.class_for(0), Class(0));
        assert_eq!(c.class_for(1), Class(0));
        assert_eq!(c.class_for(8191), Class(0));
        assert_eq!(c.class_for(8192), Class(1));
        assert_eq!(c.class_for(16383), Class(1));
        assert_eq!(c.class_for(16384), Class(2));
        assert_eq!(c.class_for(512 << 10), Class(7));
        assert_eq!(c.class_for(usize::MAX / 2), Class(7));
        for k in 0..8u8 {
            assert_eq!(Class(k).bytes(), 4096 << k);
        }
    }

    #[test]
    fn small_classes_are_always_4_kib() {
        for m in [0, 1, 8192, 1 << 20, 1 << 30] {
            assert_eq!(SizeClasses::Small.class_for(m), Class(0));
        }
        assert_eq!(SizeClasses::Small.used().count(), 1);
        assert_eq!(SizeClasses::Large.used().count(), 8);
    }

    #[test]
    fn the_macos_release_decides_the_classes() {
        assert_eq!(
            SizeClasses::for_os_release(Some((26, 2))),
            SizeClasses::Small
        );
        assert_eq!(
            SizeClasses::for_os_release(Some((26, 3))),
            SizeClasses::Large
        );
        assert_eq!(
            SizeClasses::for_os_release(Some((27, 0))),
            SizeClasses::Large
        );
        assert_eq!(SizeClasses::for_os_release(None), SizeClasses::Large);
        let plist = "<dict>\n\t<key>ProductName</key>\n\t<string>macOS</string>\n\t\
                     <key>ProductVersion</key>\n\t<string>26.3.1</string>\n</dict>";
        assert_eq!(parse_product_version(plist), Some((26, 3)));
        assert_eq!(
            parse_product_version("<key>ProductVersion</key><string>27</string>"),
            Some((27, 0))
        );
        assert_eq!(parse_product_version("<key>Other</key>"), None);
    }

    #[test]
    fn size_classes_parse_from_the_override() {
        assert_eq!("small".parse::<SizeClasses>().unwrap(), SizeClasses::Small);
        assert_eq!(
            " large ".parse::<SizeClasses>().unwrap(),
            SizeClasses::Large
        );
        let e = "26.2".parse::<SizeClasses>().unwrap_err().to_string();
        assert!(e.contains(BUFFERS_VAR), "{e}");
    }

    #[test]
    fn work_tags_use_mlx_layout() {
        assert_eq!(WorkTag::send(1, 3).encode(), 1 << 16 | 1 << 8 | 3);
        assert_eq!(WorkTag::recv(0, 7).encode(), 2 << 16 | 7);
        for tag in [
            WorkTag::send(1, 0),
            WorkTag::recv(0, 1),
            WorkTag::recv(1, 7),
        ] {
            assert_eq!(WorkTag::decode(tag.encode()), tag);
        }
    }
}
