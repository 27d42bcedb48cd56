//! Mutation fuzzing of the endpoint wire decoder (explicit cases, one per
//! rule, are the unit tests in `src/wire/tests.rs`).
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
    self, body_len_for, check_prefix, decode, encode, parse_header, Kind, Message, Token,
    WireError, HEADER_LEN, MAX_BODY_LEN, MAX_MESSAGE_LEN, MAX_TOKEN_LEN,
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
        qpn: ((rng.next() as u32) & 0x00ff_ffff).max(2),
        psn: (rng.next() as u32) & 0x00ff_ffff,
        lid: rng.next() as u16,
        gid: Gid::from_raw(gid),
        mtu: Mtu(1 + rng.below(5) as u32),
        regions,
    };
    ep.validate().expect("generator makes valid endpoints");
    ep
}

/// A random valid message: a hello with or without a token, or a reply.
fn random_message(rng: &mut Rng) -> Message {
    let endpoint = random_endpoint(rng);
    if rng.chance(3) {
        return Message::reply(endpoint);
    }
    let token = match rng.below(4) {
        0 => None,
        1 => Some(MAX_TOKEN_LEN),
        _ => Some(1 + rng.below(32)),
    }
    .map(|len| {
        let bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        Token::new(&bytes).unwrap()
    });
    Message::hello(endpoint, token)
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

/// Where the endpoint starts: after the header and the token it announces.
fn fields_at(buf: &[u8]) -> usize {
    HEADER_LEN + usize::from(buf.get(7).copied().unwrap_or(0))
}

/// Interesting values for length and count fields.
fn edge_u32(rng: &mut Rng, current: u32) -> u32 {
    match rng.below(8) {
        0 => 0,
        1 => u32::MAX,
        2 => current.wrapping_add(1 + rng.below(40) as u32),
        3 => current.wrapping_sub(1 + rng.below(40) as u32),
        4 => MAX_BODY_LEN as u32 + rng.below(3) as u32,
        5 => body_len_for(rng.below(MAX_TOKEN_LEN + 2), rng.below(MAX_REGIONS + 3)) as u32,
        6 => 1 << rng.below(32),
        _ => rng.next() as u32,
    }
}

/// One mutation; several may be stacked per message.
fn mutate(rng: &mut Rng, buf: &mut Vec<u8>) {
    let len = buf.len();
    match rng.below(13) {
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
            let v = edge_u32(rng, get_u32(buf, 10));
            put_u32(buf, 10, v);
        }
        // Region count field edit.
        6 => {
            let cur = u32::from(get_u16(buf, 8));
            let v = match rng.below(3) {
                0 => edge_u32(rng, cur) as u16,
                1 => (MAX_REGIONS + rng.below(3)) as u16,
                _ => cur.wrapping_add(1) as u16,
            };
            put_u16(buf, 8, v);
        }
        // Consistent count + length + size edit: reaches the body checks
        // with region counts the base did not have.
        7 if len >= HEADER_LEN => {
            let count = rng.below(MAX_REGIONS + 1);
            let body = body_len_for(usize::from(buf[7]), count);
            put_u16(buf, 8, count as u16);
            put_u32(buf, 10, body as u32);
            let target = HEADER_LEN + body;
            while buf.len() < target {
                buf.push(rng.next() as u8);
            }
            buf.truncate(target);
        }
        // Magic, version or kind edit.
        8 => match rng.below(3) {
            0 => put_u16(buf, 4, [0, 1, 3, 0xffff, 0x0200][rng.below(5)]),
            1 if len > 3 => buf[rng.below(4)] = rng.next() as u8,
            _ if len > 6 => buf[6] = [0, 1, 2, 3, 0xff][rng.below(5)],
            _ => {}
        },
        // Token length edit, half the time with the body resized to match.
        9 if len >= HEADER_LEN => {
            let old = usize::from(buf[7]);
            let new = [
                0,
                1,
                MAX_TOKEN_LEN,
                MAX_TOKEN_LEN + 1,
                0xff,
                old + 1,
                old.saturating_sub(1),
            ][rng.below(7)]
            .min(0xff);
            buf[7] = new as u8;
            if rng.chance(2) {
                let count = usize::from(get_u16(buf, 8));
                put_u32(buf, 10, body_len_for(new, count) as u32);
                if new > old {
                    let fill: Vec<u8> = (old..new).map(|_| rng.next() as u8).collect();
                    let at = (HEADER_LEN + old).min(buf.len());
                    buf.splice(at..at, fill);
                } else {
                    let end = (HEADER_LEN + old).min(buf.len());
                    buf.drain((HEADER_LEN + new).min(end)..end);
                }
            }
        }
        // qpn/psn around the limits (0, 1 reserved; 24 bits), mtu code.
        10 => {
            let base = fields_at(buf);
            match rng.below(3) {
                0 => put_u32(buf, base, [0, 1, 2, 0xff_ffff, 0x100_0000][rng.below(5)]),
                1 => put_u32(
                    buf,
                    base + 4,
                    [0xff_ffff, 0x100_0000, u32::MAX][rng.below(3)],
                ),
                _ => put_u16(
                    buf,
                    base + 10,
                    [0, 1, 5, 6, 0xffff, rng.next() as u16][rng.below(6)],
                ),
            }
        }
        // Region length near overflow.
        11 => {
            let count = usize::from(get_u16(buf, 8));
            if count > 0 {
                let at = fields_at(buf) + 28 + 20 * rng.below(count) + 8;
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

/// The spec's field rules, restated independently of `Message::validate`
/// (which the encoder shares with the decoder, so a bug there would not
/// show up as a round-trip failure).
fn meets_spec(msg: &Message) -> bool {
    let ep = &msg.endpoint;
    (2..=0xff_fffe).contains(&ep.qpn)
        && ep.psn <= 0xff_ffff
        && (1..=5).contains(&ep.mtu.0)
        && ep.regions.len() <= 64
        && ep
            .regions
            .iter()
            .all(|r| r.addr.checked_add(r.len).is_some())
        && match (&msg.kind, &msg.token) {
            (Kind::Reply, token) => token.is_none(),
            (Kind::Hello, Some(t)) => (1..=64).contains(&t.as_bytes().len()),
            (Kind::Hello, None) => true,
        }
}

#[derive(Default, Debug)]
struct Tally {
    accepted: u64,
    accepted_changed: u64,
    truncated: u64,
    oversized: u64,
    bad_magic: u64,
    bad_version: u64,
    bad_kind: u64,
    reserved_qpn: u64,
    inconsistent: u64,
}

impl Tally {
    /// Counts a refusal, checking what its fields claim.
    fn refused(&mut self, e: WireError, buf: &[u8]) {
        match e {
            WireError::Truncated { needed, got } => {
                assert!(got < needed && got == buf.len());
                self.truncated += 1;
            }
            WireError::Oversized { claimed, max } => {
                assert!(claimed > max && max == MAX_BODY_LEN);
                self.oversized += 1;
            }
            WireError::BadMagic(_) => self.bad_magic += 1,
            WireError::BadVersion(v) => {
                assert_ne!(v, wire::VERSION);
                self.bad_version += 1;
            }
            WireError::BadKind(k) => {
                assert!(k != 1 && k != 2);
                self.bad_kind += 1;
            }
            WireError::ReservedQpn(q) => {
                assert!(q < 2 || q == 0xff_ffff);
                self.reserved_qpn += 1;
            }
            WireError::Inconsistent(_) => self.inconsistent += 1,
            other => panic!("decode returned an encoder-only error: {other:?}"),
        }
    }
}

#[test]
fn mutated_messages_never_panic_and_never_decode_inconsistently() {
    let iterations = env_u64("VERBS_FUZZ_ITERS", 1_000_000);
    let seed = env_u64("VERBS_FUZZ_SEED", 0x5eed_0fab_1e55_u64);
    let mut rng = Rng(seed);
    let mut tally = Tally::default();
    let mut base = Vec::new();
    let mut buf = Vec::with_capacity(MAX_MESSAGE_LEN + 300);
    let mut reencoded = vec![0u8; MAX_MESSAGE_LEN];
    let started = Instant::now();

    for iter in 0..iterations {
        if iter % 256 == 0 {
            let msg = random_message(&mut rng);
            base = encode(&msg).unwrap();
            assert_eq!(decode(&base).unwrap(), msg);
        }
        buf.clear();
        buf.extend_from_slice(&base);
        for _ in 0..1 + rng.below(3) {
            mutate(&mut rng, &mut buf);
        }
        match decode(&buf) {
            Ok(msg) => {
                tally.accepted += 1;
                if buf != base {
                    tally.accepted_changed += 1;
                }
                let ctx = || format!("seed {seed:#x} iter {iter}: accepted {buf:02x?}");
                assert!(msg.validate().is_ok(), "{}", ctx());
                assert!(meets_spec(&msg), "{}", ctx());
                let n = wire::encode_into(&msg, &mut reencoded)
                    .unwrap_or_else(|e| panic!("{e}: {}", ctx()));
                assert_eq!(&reencoded[..n], &buf[..], "not canonical: {}", ctx());
                let header = parse_header(&buf).unwrap();
                assert_eq!(header.body_len, buf.len() - HEADER_LEN, "{}", ctx());
                assert_eq!(check_prefix(&buf), Ok(()), "{}", ctx());
            }
            Err(e) => {
                // A prefix check never refuses what decode would accept,
                // and refuses a bad magic, version or kind as decode does.
                if let Err(early) = check_prefix(&buf) {
                    assert_eq!(early, e, "check_prefix and decode disagree on {buf:02x?}");
                }
                // Display must work for every error (cheap enough to sample).
                if iter % 64 == 0 {
                    assert!(!e.to_string().is_empty());
                }
                tally.refused(e, &buf);
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
        assert!(tally.bad_kind > 1000, "{tally:?}");
        assert!(tally.reserved_qpn > 1000, "{tally:?}");
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
        let len = rng.below(120);
        for _ in 0..len {
            buf.push(rng.next() as u8);
        }
        if rng.chance(2) && buf.len() >= HEADER_LEN {
            let kind = 1 + rng.below(2) as u8;
            let room = len.saturating_sub(HEADER_LEN + 28);
            let token = if kind == 1 {
                rng.below(room.min(64) + 1)
            } else {
                0
            };
            let count = (room - token) / 20;
            buf[..4].copy_from_slice(b"VRBS");
            buf[4..6].copy_from_slice(&wire::VERSION.to_be_bytes());
            buf[6] = kind;
            buf[7] = token as u8;
            buf[8..10].copy_from_slice(&(count as u16).to_be_bytes());
            buf[10..14].copy_from_slice(&(body_len_for(token, count) as u32).to_be_bytes());
        }
        if let Ok(msg) = decode(&buf) {
            assert_eq!(encode(&msg).unwrap(), buf);
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
            let qpn = [0, 1, (rng.next() as u32) & 0xff_ffff][rng.below(3)];
            bytes[0..4].copy_from_slice(&qpn.to_ne_bytes());
            bytes[4..8].copy_from_slice(&u32::from(rng.next() as u16).to_ne_bytes());
        }
        let ci = ConnInfo::from_bytes(&bytes);
        assert_eq!(ci.to_bytes(), bytes);
        let len = if rng.chance(2) { 4096 } else { rng.next() };
        match ci.to_endpoint(len) {
            Ok(ep) => {
                assert!(ep.validate().is_ok() && ep.qpn >= 2);
                assert_eq!(ConnInfo::from_endpoint(&ep), Ok(ci));
                let reply = Message::reply(ep);
                assert_eq!(decode(&encode(&reply).unwrap()).unwrap(), reply);
            }
            Err(WireError::ReservedQpn(qpn)) => assert!(qpn < 2 && ci.qpn == qpn),
            Err(e) => assert!(matches!(e, WireError::Inconsistent(_)), "{e}"),
        }
    }
}
