//! Mutation fuzzing of the endpoint wire decoder, plus explicit cases.
//!
//! The decoder faces bytes from any process that can open a TCP
//! connection, so it must never panic and never accept a message that is
//! not exactly what the encoder would produce. This drives it with
//! mutations of valid encodings from a seeded PRNG (no test dependency),
//! reproducible via `VERBS_FUZZ_SEED`; `VERBS_FUZZ_ITERS` changes the
//! iteration count (default 1,000,000).

use std::time::Instant;

use verbs::endpoint::{Endpoint, Mtu, RemoteRegion, MAX_REGIONS};
use verbs::gid::Gid;
use verbs::wire::tutorial::{ConnInfo, CONN_INFO_LEN};
use verbs::wire::{
    self, body_len_for, decode, encode, parse_header, WireError, HEADER_LEN, MAX_BODY_LEN,
    MAX_MESSAGE_LEN,
};

/// splitmix64: tiny, fast, good enough to spread mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform-ish in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A random valid endpoint, biased toward edge values.
fn random_endpoint(rng: &mut Rng) -> Endpoint {
    let count = match rng.below(16) {
        0 => MAX_REGIONS,
        1 => rng.below(MAX_REGIONS + 1),
        _ => rng.below(4),
    };
    let pick_u64 = |rng: &mut Rng| match rng.below(6) {
        0 => 0,
        1 => u64::MAX,
        2 => rng.next() & 0xffff,
        _ => rng.next(),
    };
    let regions = (0..count)
        .map(|_| {
            let addr = pick_u64(rng);
            let room = u64::MAX - addr;
            let len = match rng.below(4) {
                0 => room,
                1 => 0,
                _ if room == u64::MAX => rng.next(),
                _ => rng.next() % (room + 1),
            };
            RemoteRegion {
                addr,
                len,
                rkey: rng.next() as u32,
            }
        })
        .collect();
    let mut gid = [0u8; 16];
    for b in &mut gid {
        *b = rng.next() as u8;
    }
    let ep = Endpoint {
        qpn: (rng.next() as u32) & 0x00ff_ffff,
        psn: (rng.next() as u32) & 0x00ff_ffff,
        lid: rng.next() as u16,
        gid: Gid::from_raw(gid),
        mtu: Mtu(1 + rng.below(5) as u32),
        regions,
    };
    ep.validate().expect("generator makes valid endpoints");
    ep
}

fn put_u16(buf: &mut [u8], at: usize, v: u16) {
    if let Some(dst) = buf.get_mut(at..at + 2) {
        dst.copy_from_slice(&v.to_be_bytes());
    }
}

fn put_u32(buf: &mut [u8], at: usize, v: u32) {
    if let Some(dst) = buf.get_mut(at..at + 4) {
        dst.copy_from_slice(&v.to_be_bytes());
    }
}

fn get_u16(buf: &[u8], at: usize) -> u16 {
    buf.get(at..at + 2)
        .map_or(0, |b| u16::from_be_bytes([b[0], b[1]]))
}

fn get_u32(buf: &[u8], at: usize) -> u32 {
    buf.get(at..at + 4)
        .map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

/// Interesting values for length and count fields.
fn edge_u32(rng: &mut Rng, current: u32) -> u32 {
    match rng.below(8) {
        0 => 0,
        1 => u32::MAX,
        2 => current.wrapping_add(1 + rng.below(40) as u32),
        3 => current.wrapping_sub(1 + rng.below(40) as u32),
        4 => MAX_BODY_LEN as u32 + rng.below(3) as u32,
        5 => body_len_for(rng.below(MAX_REGIONS + 3)) as u32,
        6 => 1 << rng.below(32),
        _ => rng.next() as u32,
    }
}

/// One mutation; several may be stacked per message.
fn mutate(rng: &mut Rng, buf: &mut Vec<u8>) {
    let len = buf.len();
    match rng.below(12) {
        // Bit flip.
        0 | 1 if len > 0 => {
            let i = rng.below(len);
            buf[i] ^= 1 << rng.below(8);
        }
        // Byte set, random or edge value.
        2 if len > 0 => {
            let i = rng.below(len);
            buf[i] = [0, 0xff, 0x7f, 0x80, rng.next() as u8][rng.below(5)];
        }
        // Truncation.
        3 => buf.truncate(rng.below(len + 1)),
        // Extension with random bytes.
        4 => {
            for _ in 0..1 + rng.below(24) {
                buf.push(rng.next() as u8);
            }
        }
        // Body length field edit.
        5 => {
            let v = edge_u32(rng, get_u32(buf, 8));
            put_u32(buf, 8, v);
        }
        // Region count field edit.
        6 => {
            let cur = u32::from(get_u16(buf, 6));
            let v = match rng.below(3) {
                0 => edge_u32(rng, cur) as u16,
                1 => (MAX_REGIONS + rng.below(3)) as u16,
                _ => cur.wrapping_add(1) as u16,
            };
            put_u16(buf, 6, v);
        }
        // Consistent count + length + size edit: reaches the body checks
        // with region counts the base did not have.
        7 => {
            let count = rng.below(MAX_REGIONS + 1);
            let body = body_len_for(count);
            put_u16(buf, 6, count as u16);
            put_u32(buf, 8, body as u32);
            let target = HEADER_LEN + body;
            while buf.len() < target {
                buf.push(rng.next() as u8);
            }
            buf.truncate(target);
        }
        // Magic or version edit.
        8 => {
            if rng.chance(2) {
                put_u16(buf, 4, [0, 2, 0xffff, 0x0100][rng.below(4)]);
            } else if len > 3 {
                buf[rng.below(4)] = rng.next() as u8;
            }
        }
        // qpn/psn around the 24-bit limit, mtu code.
        9 => {
            let at = [12, 16, 22][rng.below(3)];
            if at == 22 {
                put_u16(
                    buf,
                    22,
                    [0, 1, 5, 6, 0xffff, rng.next() as u16][rng.below(6)],
                );
            } else if rng.chance(2) {
                let v = [0xff_ffff, 0x100_0000, u32::MAX, 1 << rng.below(32)][rng.below(4)];
                put_u32(buf, at, v);
            } else if let Some(b) = buf.get_mut(at) {
                *b = rng.next() as u8;
            }
        }
        // Region length near overflow.
        10 => {
            let count = usize::from(get_u16(buf, 6));
            if count > 0 {
                let at = 40 + 20 * rng.below(count) + 8;
                if let Some(dst) = buf.get_mut(at..at + 8) {
                    dst.copy_from_slice(&(u64::MAX - rng.next() % 4).to_be_bytes());
                }
            }
        }
        // Random field-sized overwrite anywhere in the body.
        _ if len > HEADER_LEN => {
            let i = HEADER_LEN + rng.below(len - HEADER_LEN);
            let end = (i + 4).min(len);
            for b in &mut buf[i..end] {
                *b = rng.next() as u8;
            }
        }
        _ => buf.push(rng.next() as u8),
    }
}

/// The spec's field rules, restated independently of `Endpoint::validate`
/// (which the encoder shares with the decoder, so a bug there would not
/// show up as a round-trip failure).
fn meets_spec(ep: &Endpoint) -> bool {
    ep.qpn <= 0xff_ffff
        && ep.psn <= 0xff_ffff
        && (1..=5).contains(&ep.mtu.0)
        && ep.regions.len() <= 64
        && ep
            .regions
            .iter()
            .all(|r| r.addr.checked_add(r.len).is_some())
}

#[derive(Default, Debug)]
struct Tally {
    accepted: u64,
    accepted_changed: u64,
    truncated: u64,
    oversized: u64,
    bad_magic: u64,
    bad_version: u64,
    inconsistent: u64,
}

#[test]
fn mutated_messages_never_panic_and_never_decode_inconsistently() {
    let iterations = env_u64("VERBS_FUZZ_ITERS", 1_000_000);
    let seed = env_u64("VERBS_FUZZ_SEED", 0x5eed_0fab_1e55_u64);
    let mut rng = Rng(seed);
    let mut tally = Tally::default();
    let mut base = Vec::new();
    let mut buf = Vec::with_capacity(MAX_MESSAGE_LEN + 64);
    let mut reencoded = vec![0u8; MAX_MESSAGE_LEN];
    let started = Instant::now();

    for iter in 0..iterations {
        if iter % 256 == 0 {
            base = encode(&random_endpoint(&mut rng)).unwrap();
            assert_eq!(decode(&base).unwrap(), decode(&base).unwrap());
        }
        buf.clear();
        buf.extend_from_slice(&base);
        for _ in 0..1 + rng.below(3) {
            mutate(&mut rng, &mut buf);
        }
        match decode(&buf) {
            Ok(ep) => {
                tally.accepted += 1;
                if buf != base {
                    tally.accepted_changed += 1;
                }
                let ctx = || format!("seed {seed:#x} iter {iter}: accepted {buf:02x?}");
                assert!(ep.validate().is_ok(), "{}", ctx());
                assert!(meets_spec(&ep), "{}", ctx());
                let n = wire::encode_into(&ep, &mut reencoded)
                    .unwrap_or_else(|e| panic!("{e}: {}", ctx()));
                assert_eq!(&reencoded[..n], &buf[..], "not canonical: {}", ctx());
                assert_eq!(parse_header(&buf), Ok(buf.len() - HEADER_LEN), "{}", ctx());
            }
            Err(e) => {
                match e {
                    WireError::Truncated { needed, got } => {
                        assert!(got < needed && got == buf.len());
                        tally.truncated += 1;
                    }
                    WireError::Oversized { claimed, max } => {
                        assert!(claimed > max && max == MAX_BODY_LEN);
                        tally.oversized += 1;
                    }
                    WireError::BadMagic(_) => tally.bad_magic += 1,
                    WireError::BadVersion(v) => {
                        assert_ne!(v, wire::VERSION);
                        tally.bad_version += 1;
                    }
                    WireError::Inconsistent(_) => tally.inconsistent += 1,
                    other => panic!("decode returned an encoder-only error: {other:?}"),
                }
                // Display must work for every error (cheap enough to sample).
                if iter % 64 == 0 {
                    assert!(!e.to_string().is_empty());
                }
            }
        }
    }

    let elapsed = started.elapsed();
    println!(
        "wire fuzz: {iterations} mutated messages in {:.2?} (seed {seed:#x}): {tally:?}",
        elapsed
    );
    if iterations >= 100_000 {
        // Every path must have been exercised, including acceptance of
        // changed messages (e.g. a flipped GID bit is still valid).
        assert!(tally.accepted_changed > 1000, "{tally:?}");
        assert!(tally.truncated > 1000, "{tally:?}");
        assert!(tally.oversized > 1000, "{tally:?}");
        assert!(tally.bad_magic > 1000, "{tally:?}");
        assert!(tally.bad_version > 1000, "{tally:?}");
        assert!(tally.inconsistent > 1000, "{tally:?}");
    }
}

#[test]
fn random_bytes_never_panic() {
    // Unstructured input, with a valid header half the time so the body
    // checks see arbitrary bytes too.
    let mut rng = Rng(env_u64("VERBS_FUZZ_SEED", 7) ^ 0xabcdef);
    let mut buf = Vec::new();
    for _ in 0..100_000 {
        buf.clear();
        let len = rng.below(80);
        for _ in 0..len {
            buf.push(rng.next() as u8);
        }
        if rng.chance(2) && buf.len() >= HEADER_LEN {
            let count = (len.saturating_sub(HEADER_LEN + 28)) / 20;
            buf[..4].copy_from_slice(b"VRBS");
            buf[4..6].copy_from_slice(&1u16.to_be_bytes());
            buf[6..8].copy_from_slice(&(count as u16).to_be_bytes());
            buf[8..12].copy_from_slice(&(body_len_for(count) as u32).to_be_bytes());
        }
        if let Ok(ep) = decode(&buf) {
            assert_eq!(encode(&ep).unwrap(), buf);
        }
        let _ = parse_header(&buf);
        if let Ok(ci) = ConnInfo::decode(&buf) {
            if let Ok(ep) = ci.to_endpoint(rng.next()) {
                assert!(ep.validate().is_ok());
                assert_eq!(ConnInfo::from_endpoint(&ep), Ok(ci));
            }
        }
    }
}

#[test]
fn tutorial_conversion_is_consistent() {
    let mut rng = Rng(99);
    for _ in 0..100_000 {
        let mut bytes = [0u8; CONN_INFO_LEN];
        for b in &mut bytes {
            *b = rng.next() as u8;
        }
        if rng.chance(2) {
            bytes[0..4].copy_from_slice(&((rng.next() as u32) & 0xff_ffff).to_ne_bytes());
            bytes[4..8].copy_from_slice(&u32::from(rng.next() as u16).to_ne_bytes());
        }
        let ci = ConnInfo::from_bytes(&bytes);
        assert_eq!(ci.to_bytes(), bytes);
        let len = if rng.chance(2) { 4096 } else { rng.next() };
        match ci.to_endpoint(len) {
            Ok(ep) => {
                assert!(ep.validate().is_ok());
                assert_eq!(ConnInfo::from_endpoint(&ep), Ok(ci));
                assert_eq!(decode(&encode(&ep).unwrap()).unwrap(), ep);
            }
            Err(e) => assert!(matches!(e, WireError::Inconsistent(_))),
        }
    }
}

fn sample() -> Endpoint {
    Endpoint {
        qpn: 0x12_3456,
        psn: 0xab_cdef,
        lid: 7,
        gid: Gid::from_ipv4([10, 0, 0, 2]),
        mtu: Mtu::MTU_1024,
        regions: vec![
            RemoteRegion {
                addr: 0x1000,
                len: 0x2000,
                rkey: 1,
            },
            RemoteRegion {
                addr: 0x9000,
                len: 0x10,
                rkey: 2,
            },
        ],
    }
}

#[test]
fn round_trip_edges() {
    let mut ep = sample();
    assert_eq!(decode(&encode(&ep).unwrap()).unwrap(), ep);
    ep.regions.clear();
    assert_eq!(encode(&ep).unwrap().len(), HEADER_LEN + 28);
    assert_eq!(decode(&encode(&ep).unwrap()).unwrap(), ep);
    ep.qpn = 0xff_ffff;
    ep.psn = 0xff_ffff;
    ep.lid = u16::MAX;
    ep.gid = Gid::from_raw([0xff; 16]);
    ep.mtu = Mtu::MTU_4096;
    ep.regions = vec![
        RemoteRegion {
            addr: u64::MAX,
            len: 0,
            rkey: u32::MAX
        };
        MAX_REGIONS
    ];
    let bytes = encode(&ep).unwrap();
    assert_eq!(bytes.len(), MAX_MESSAGE_LEN);
    assert_eq!(decode(&bytes).unwrap(), ep);
}

#[test]
fn truncated_at_every_length() {
    let bytes = encode(&sample()).unwrap();
    for cut in 0..bytes.len() {
        let needed = if cut < HEADER_LEN {
            HEADER_LEN
        } else {
            bytes.len()
        };
        assert_eq!(
            decode(&bytes[..cut]),
            Err(WireError::Truncated { needed, got: cut }),
            "cut at {cut}"
        );
    }
    assert_eq!(
        parse_header(&bytes[..HEADER_LEN - 1]),
        Err(WireError::Truncated {
            needed: HEADER_LEN,
            got: HEADER_LEN - 1
        })
    );
}

#[test]
fn oversized_claims_are_refused_from_the_header_alone() {
    let mut header = encode(&sample()).unwrap()[..HEADER_LEN].to_vec();
    for claim in [MAX_BODY_LEN as u32 + 1, 1 << 20, u32::MAX] {
        header[8..12].copy_from_slice(&claim.to_be_bytes());
        let want = WireError::Oversized {
            claimed: claim as usize,
            max: MAX_BODY_LEN,
        };
        assert_eq!(parse_header(&header), Err(want));
        assert_eq!(decode(&header), Err(want));
    }
    header[6..8].copy_from_slice(&(MAX_REGIONS as u16 + 1).to_be_bytes());
    header[8..12].copy_from_slice(&(MAX_BODY_LEN as u32).to_be_bytes());
    assert!(matches!(
        parse_header(&header),
        Err(WireError::Inconsistent(_))
    ));
}

#[test]
fn wrong_magic_and_version() {
    let good = encode(&sample()).unwrap();
    let mut bad = good.clone();
    bad[..4].copy_from_slice(b"GET ");
    assert_eq!(decode(&bad), Err(WireError::BadMagic(0x4745_5420)));
    let msg = WireError::BadMagic(0x4745_5420).to_string();
    assert!(
        msg.contains("0x47455420") && msg.contains("0x56524253"),
        "{msg}"
    );
    let mut bad = good.clone();
    bad[4..6].copy_from_slice(&2u16.to_be_bytes());
    assert_eq!(decode(&bad), Err(WireError::BadVersion(2)));
    assert!(WireError::BadVersion(2).to_string().contains("expected 1"));
    // The primer's raw conn_info is not our format.
    let tutorial = ConnInfo::default().to_bytes();
    assert!(matches!(decode(&tutorial), Err(WireError::BadMagic(0))));
}

#[test]
fn inconsistent_fields() {
    let good = encode(&sample()).unwrap();
    let edit = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut b = good.clone();
        f(&mut b);
        decode(&b)
    };
    let inconsistent =
        |r: Result<Endpoint, WireError>| matches!(r, Err(WireError::Inconsistent(_)));
    assert!(inconsistent(edit(&|b| b.push(0))), "trailing byte");
    assert!(
        inconsistent(edit(&|b| b[7] = 1)),
        "count says 1, length says 2"
    );
    assert!(inconsistent(edit(&|b| b[11] += 1)), "length off by one");
    assert!(inconsistent(edit(&|b| b[12] = 1)), "qpn > 24 bits");
    assert!(inconsistent(edit(&|b| b[16] = 0x80)), "psn > 24 bits");
    for code in [0u8, 6, 0xff] {
        assert!(inconsistent(edit(&|b| b[23] = code)), "mtu code {code}");
    }
    assert!(
        inconsistent(edit(&|b| b[48..56].copy_from_slice(&u64::MAX.to_be_bytes()))),
        "region overflow"
    );
    let mut ep = sample();
    ep.qpn = 1 << 24;
    assert!(matches!(encode(&ep), Err(WireError::Inconsistent(_))));
    assert!(WireError::Inconsistent("x").to_string().contains("x"));
}
