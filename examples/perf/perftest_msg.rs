//! The messages of perftest's out-of-band exchange: what `ib_write_bw`,
//! `ib_write_lat`, `ib_send_lat`, `ib_read_lat` and the others send each
//! other over TCP (port 18515 unless `-p`) when they do not use rdma_cm.
//! Read from perftest 4.5-0.17 (version string "6.06", Debian bookworm's
//! `perftest 4.5+0.17`): `src/perftest_communication.c` (`exchange_versions`,
//! `check_sys_data`, `check_mtu`, `ctx_hand_shake`, `ethernet_write_keys`
//! and `ethernet_read_keys`, `xchg_bw_reports`, `ctx_close_connection`) and
//! `src/perftest_communication.h` (`KEY_PRINT_FMT*`, `KEY_MSG_SIZE*`), and
//! checked against the installed binaries under strace.
//!
//! Every exchange is one fixed-size message each way: the client writes
//! its own, then reads the server's; the server reads first, then writes.
//! In order:
//! 1. The version: 16 bytes, a NUL-padded string ("6.06"). perftest gives
//!    up on a peer below 5.70.
//! 2. The page size ("cycle buffer"), then 3. the cache line size: a
//!    32-bit big-endian integer each. Both sides use the larger: the bw
//!    client cycles its target address through the peer's first cycle
//!    buffer of bytes.
//! 4. The port's MTU: its `enum ibv_mtu` code in ASCII and a NUL ("3\0"
//!    for 1024). Both use the smaller.
//! 5. Key messages, one per queue pair per round (when and how many
//!    rounds: module `perftest_wire`): `LID:OUT_READS:QPN:PSN:RKEY:VADDR:`,
//!    the GID's 16 bytes each followed by `:`, `SRQN:` and a NUL, in
//!    lowercase hex of fixed widths (4, 4, 6, 6, 8, 16, 2 each, 8): 108
//!    bytes. Where perftest uses no GID (InfiniBand without `-x`) it is
//!    `LID:OUT_READS:QPN:PSN:RKEY:VADDR:SRQN` and a NUL, 59 bytes.
//!    OUT_READS is the RDMA Reads the sender accepts in flight (its
//!    `max_dest_rd_atomic`, and the peer's `max_rd_atomic`).
//! 6. After a bandwidth test, the client's report of its last size:
//!    message size and iterations (64-bit big-endian), BW peak and BW
//!    average (MB/s of 2^20 bytes) and the message rate (Mpps), as
//!    big-endian IEEE doubles. The server prints it; what it sends back
//!    is never read (perftest sends uninitialised memory).
//! 7. `done` and a NUL, after the last round; nobody reads it.
//!
//! Everything read is checked before use: exact lengths, every field hex
//! of its width, the separators, the terminating NUL, sizes within bounds,
//! no QPN 0 or 1. Nothing here panics on any input.

use verbs::Mtu;

/// The version of the wire this module speaks.
pub const VERSION: &str = "6.06";

/// Bytes of the version message.
pub const VERSION_LEN: usize = 16;

/// Oldest peer version perftest itself accepts.
const OLDEST_PEER: f64 = 5.70;

/// The cycle buffer we ask for: x86-64 Linux's page size, what perftest
/// sends there (`sysconf(_SC_PAGESIZE)`).
pub const PAGE_SIZE: u32 = 4096;

/// The cache line size we send (perftest's default, and x86-64's).
pub const CACHE_LINE: u32 = 64;

/// Largest cycle buffer a peer may make us allocate for it.
pub const MAX_CYCLE_BUFFER: u32 = 2 << 20;

/// Largest cache line size a peer may claim.
const MAX_CACHE_LINE: u32 = 1024;

/// Bytes of a key message with a GID.
pub const KEY_LEN_GID: usize = 108;

/// Bytes of a key message without one.
pub const KEY_LEN: usize = 59;

/// Bytes of each field of the bandwidth report.
pub const REPORT_FIELD: usize = 8;

/// What each side sends last.
pub const DONE: &[u8; 5] = b"done\0";

/// Our version message.
pub fn version() -> [u8; VERSION_LEN] {
    let mut m = [0u8; VERSION_LEN];
    m[..VERSION.len()].copy_from_slice(VERSION.as_bytes());
    m
}

/// The peer's version message: a NUL-terminated string whose leading
/// number (what perftest's `atof` reads) is at least 5.70.
pub fn parse_version(m: &[u8]) -> Result<f64, String> {
    let text = m
        .split(|&b| b == 0)
        .next()
        .filter(|t| t.len() < m.len() && m.len() == VERSION_LEN)
        .ok_or("the version is not a NUL-terminated string of 16 bytes")?;
    if !text.iter().all(|b| b.is_ascii_graphic()) {
        return Err("the version is not printable text".into());
    }
    // What atof reads: digits, then a point and digits.
    let digits = |from: usize| {
        from + text[from..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count()
    };
    let mut end = digits(0);
    if text.get(end) == Some(&b'.') {
        end = digits(end + 1);
    }
    let v: f64 = std::str::from_utf8(&text[..end])
        .ok()
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("the version {:?} is not a number", show(text)))?;
    if !(OLDEST_PEER..1e6).contains(&v) {
        return Err(format!(
            "peer version {} (perftest talks to {OLDEST_PEER:.2} and later)",
            show(text)
        ));
    }
    Ok(v)
}

/// A 32-bit integer message (page size, cache line size).
pub fn int(v: u32) -> [u8; 4] {
    v.to_be_bytes()
}

/// The peer's cycle buffer: a power of two up to [`MAX_CYCLE_BUFFER`].
pub fn parse_cycle_buffer(m: &[u8]) -> Result<u32, String> {
    power_of_two(m, "cycle buffer (page size)", 256, MAX_CYCLE_BUFFER)
}

/// The peer's cache line size: a power of two up to 1 KiB.
pub fn parse_cache_line(m: &[u8]) -> Result<u32, String> {
    power_of_two(m, "cache line size", 8, MAX_CACHE_LINE)
}

fn power_of_two(m: &[u8], what: &str, min: u32, max: u32) -> Result<u32, String> {
    let b: [u8; 4] = m
        .try_into()
        .map_err(|_| format!("the {what} is not 4 bytes"))?;
    let v = u32::from_be_bytes(b);
    if v.is_power_of_two() && (min..=max).contains(&v) {
        Ok(v)
    } else {
        Err(format!(
            "the {what} {v} is not a power of two from {min} to {max}"
        ))
    }
}

/// Our MTU message: the code's digit and a NUL.
pub fn mtu(m: Mtu) -> [u8; 2] {
    [b'0' + (m.0.clamp(1, 5) as u8), 0]
}

/// The peer's MTU message: a digit from 1 (256) to 5 (4096) and a NUL.
pub fn parse_mtu(m: &[u8]) -> Result<Mtu, String> {
    match m {
        [d @ b'1'..=b'5', 0] => Ok(Mtu(u32::from(d - b'0'))),
        _ => Err(format!("the MTU message {:?} is not 1 to 5", show(m))),
    }
}

/// One queue pair's key message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Key {
    /// The port's LID (0 on RoCE).
    pub lid: u16,
    /// RDMA Reads the sender accepts in flight.
    pub out_reads: u16,
    /// Queue pair number (24 bits).
    pub qpn: u32,
    /// First packet sequence number (24 bits).
    pub psn: u32,
    /// The buffer's remote key (0 where there is none).
    pub rkey: u32,
    /// The buffer's address.
    pub vaddr: u64,
    /// The port's GID, in the 108-byte form.
    pub gid: Option<[u8; 16]>,
    /// XRC/DC shared receive queue number (0 for RC).
    pub srqn: u32,
}

impl Key {
    /// The message's length with or without a GID.
    pub fn len(with_gid: bool) -> usize {
        if with_gid {
            KEY_LEN_GID
        } else {
            KEY_LEN
        }
    }

    /// The message, exactly [`Key::len`] bytes; `None` if a field does not
    /// fit its width (a QPN or PSN over 24 bits).
    pub fn encode(&self) -> Option<Vec<u8>> {
        if self.qpn > 0xFF_FFFF || self.psn > 0xFF_FFFF {
            return None;
        }
        let mut s = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
            self.lid, self.out_reads, self.qpn, self.psn, self.rkey, self.vaddr
        );
        match self.gid {
            Some(gid) => {
                for b in gid {
                    s.push_str(&format!("{b:02x}:"));
                }
                s.push_str(&format!("{:08x}:", self.srqn));
            }
            None => s.push_str(&format!("{:08x}", self.srqn)),
        }
        let mut m = s.into_bytes();
        m.push(0);
        (m.len() == Key::len(self.gid.is_some())).then_some(m)
    }

    /// The peer's key message in the form both sides use (`with_gid`).
    pub fn parse(m: &[u8], with_gid: bool) -> Result<Key, String> {
        if m.len() != Key::len(with_gid) {
            return Err(format!(
                "a key message of {} bytes, not {}",
                m.len(),
                Key::len(with_gid)
            ));
        }
        let bad = || format!("malformed key message {:?}", show(m));
        let mut f = Fields(m);
        let lid = f.hex(4, b':').ok_or_else(bad)? as u16;
        let out_reads = f.hex(4, b':').ok_or_else(bad)? as u16;
        let qpn = f.hex(6, b':').ok_or_else(bad)? as u32;
        let psn = f.hex(6, b':').ok_or_else(bad)? as u32;
        let rkey = f.hex(8, b':').ok_or_else(bad)? as u32;
        let vaddr = f.hex(16, b':').ok_or_else(bad)?;
        let (gid, srqn) = if with_gid {
            let mut gid = [0u8; 16];
            for b in &mut gid {
                *b = f.hex(2, b':').ok_or_else(bad)? as u8;
            }
            (Some(gid), f.hex(8, b':').ok_or_else(bad)? as u32)
        } else {
            (None, f.hex(8, 0).ok_or_else(bad)? as u32)
        };
        match f.0 {
            [] if !with_gid => {}
            [0] if with_gid => {}
            _ => return Err(bad()),
        }
        if qpn <= 1 {
            return Err(format!(
                "QPN {qpn} in a key message: no RC peer has QPN 0 or 1"
            ));
        }
        Ok(Key {
            lid,
            out_reads,
            qpn,
            psn,
            rkey,
            vaddr,
            gid,
            srqn,
        })
    }
}

/// The rest of a key message, read field by field.
struct Fields<'a>(&'a [u8]);

impl Fields<'_> {
    /// `width` hex digits, then `end`.
    fn hex(&mut self, width: usize, end: u8) -> Option<u64> {
        let (digits, rest) = self.0.split_at_checked(width)?;
        let (&sep, rest) = rest.split_first()?;
        if sep != end {
            return None;
        }
        let mut v = 0u64;
        for &d in digits {
            v = v << 4 | u64::from((d as char).to_digit(16)?);
        }
        self.0 = rest;
        Some(v)
    }
}

/// The bandwidth tests' report, client to server.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Report {
    /// Message size.
    pub size: u64,
    /// Messages, all queue pairs.
    pub iters: u64,
    /// BW peak, MB/s (2^20 bytes).
    pub peak: f64,
    /// BW average, MB/s.
    pub average: f64,
    /// Message rate, millions per second.
    pub msg_rate: f64,
}

impl Report {
    /// The five fields, each sent in an exchange of its own.
    pub fn encode(&self) -> [[u8; REPORT_FIELD]; 5] {
        [
            self.size.to_be_bytes(),
            self.iters.to_be_bytes(),
            self.peak.to_bits().to_be_bytes(),
            self.average.to_bits().to_be_bytes(),
            self.msg_rate.to_bits().to_be_bytes(),
        ]
    }

    /// The client's report: sizes within perf's and figures finite and
    /// not negative.
    pub fn parse(fields: &[[u8; REPORT_FIELD]; 5]) -> Result<Report, String> {
        let int = |i: usize| u64::from_be_bytes(fields[i]);
        let real = |i: usize| f64::from_bits(int(i));
        let r = Report {
            size: int(0),
            iters: int(1),
            peak: real(2),
            average: real(3),
            msg_rate: real(4),
        };
        let figures = [r.peak, r.average, r.msg_rate];
        if r.size == 0 || r.size > 1 << 32 || !figures.iter().all(|x| x.is_finite() && *x >= 0.0) {
            return Err(format!("an implausible report from the client: {r:?}"));
        }
        Ok(r)
    }
}

/// Bytes for an error message: printable ASCII as is, the rest escaped.
fn show(m: &[u8]) -> String {
    m.iter()
        .flat_map(|b| b.escape_ascii())
        .map(char::from)
        .collect()
}
