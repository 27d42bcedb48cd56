//! perftest's out-of-band messages as `examples/perf` reads and writes
//! them (`examples/perf/perftest_msg.rs`, included as source): the bytes
//! perftest 4.5-0.17's binaries sent under strace, and garbage. A `perf`
//! server faces whatever connects to its port, so every parser must refuse
//! (never panic on, never accept) anything that is not a well-formed
//! message. Host only; the exchange itself across two guests is
//! `tests/softroce/perftest_interop`.

#[allow(dead_code)]
#[path = "../examples/perf/perftest_msg.rs"]
mod perftest_msg;

use perftest_msg::{
    parse_cache_line, parse_cycle_buffer, parse_mtu, parse_version, Key, Report, KEY_LEN,
    KEY_LEN_GID, VERSION_LEN,
};
use verbs::Mtu;

/// `ib_write_bw`'s client's key message (rxe, RoCE v2, 10.77.0.1), as
/// strace showed it.
const CAPTURED: &[u8; 108] = b"0000:0001:000012:c24972:00000299:0000557bccc03000:\
00:00:00:00:00:00:00:00:00:00:ff:ff:0a:4d:00:01:00000000:\0";

fn captured_key() -> Key {
    Key {
        lid: 0,
        out_reads: 1,
        qpn: 0x12,
        psn: 0xc2_4972,
        rkey: 0x299,
        vaddr: 0x557b_ccc0_3000,
        gid: Some([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0x0a, 0x4d, 0, 1]),
        srqn: 0,
    }
}

#[test]
fn a_captured_key_parses_and_encodes_to_the_same_bytes() {
    let key = Key::parse(CAPTURED, true).expect("perftest's own message");
    assert_eq!(key, captured_key());
    assert_eq!(key.encode().unwrap(), CAPTURED.to_vec());
    // Read as the other form, it is refused.
    assert!(Key::parse(CAPTURED, false).is_err());
}

#[test]
fn the_key_without_a_gid_is_59_bytes_and_round_trips() {
    let key = Key {
        gid: None,
        lid: 0x1a,
        out_reads: 16,
        srqn: 7,
        ..captured_key()
    };
    let m = key.encode().unwrap();
    assert_eq!(m.len(), KEY_LEN);
    assert_eq!(
        &m,
        b"001a:0010:000012:c24972:00000299:0000557bccc03000:00000007\0"
    );
    assert_eq!(Key::parse(&m, false), Ok(key));
    assert!(Key::parse(&m, true).is_err());
}

#[test]
fn fields_wider_than_the_wire_are_not_encoded() {
    for key in [
        Key {
            qpn: 1 << 24,
            ..captured_key()
        },
        Key {
            psn: 1 << 24,
            ..captured_key()
        },
    ] {
        assert_eq!(key.encode(), None);
    }
    let widest = Key {
        lid: u16::MAX,
        out_reads: u16::MAX,
        qpn: 0xFF_FFFF,
        psn: 0xFF_FFFF,
        rkey: u32::MAX,
        vaddr: u64::MAX,
        gid: Some([0xff; 16]),
        srqn: u32::MAX,
    };
    let m = widest.encode().unwrap();
    assert_eq!(m.len(), KEY_LEN_GID);
    assert_eq!(Key::parse(&m, true), Ok(widest));
}

#[test]
fn every_single_byte_change_to_a_key_is_refused_or_still_exact() {
    // Any byte: a digit changed to another hex digit still parses (to
    // another key, which encodes back to the changed bytes); anything
    // else (a separator, the NUL, a non-hex byte) is refused.
    for at in 0..CAPTURED.len() {
        for b in 0..=255u8 {
            let mut m = *CAPTURED;
            m[at] = b;
            match Key::parse(&m, true) {
                Ok(k) => {
                    let again = k.encode().unwrap();
                    assert!(
                        again.eq_ignore_ascii_case(&m),
                        "byte {at} = {b:#x} parsed to {k:?}, which is not the message"
                    );
                }
                Err(e) => assert!(!e.is_empty()),
            }
        }
    }
}

#[test]
fn truncated_padded_and_random_keys_are_refused() {
    for len in 0..=200 {
        let mut m = CAPTURED.to_vec();
        m.resize(len, b'0');
        if len != KEY_LEN_GID {
            assert!(Key::parse(&m, true).is_err(), "length {len}");
        }
        if len != KEY_LEN {
            assert!(Key::parse(&m, false).is_err(), "length {len}");
        }
    }
    // Seeded noise, both forms and both lengths.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..20_000 {
        let mut m = [0u8; KEY_LEN_GID];
        for b in &mut m {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        assert!(Key::parse(&m, true).is_err());
        assert!(Key::parse(&m[..KEY_LEN], false).is_err());
    }
    // QPN 0 and 1 are special queue pairs, never an RC peer.
    for qpn in [0, 1] {
        let m = Key {
            qpn,
            ..captured_key()
        }
        .encode()
        .unwrap();
        assert!(Key::parse(&m, true).is_err(), "QPN {qpn}");
    }
    // Separators and hex in the right places, but the sign of a number.
    let spaced = CAPTURED.map(|b| if b == b'0' { b' ' } else { b });
    assert!(Key::parse(&spaced, true).is_err());
    let signed = {
        let mut m = *CAPTURED;
        m[0] = b'-';
        m
    };
    assert!(Key::parse(&signed, true).is_err());
}

#[test]
fn versions_are_nul_terminated_numbers_from_5_70() {
    let msg = |s: &[u8]| {
        let mut m = [0u8; VERSION_LEN];
        m[..s.len()].copy_from_slice(s);
        m
    };
    assert_eq!(parse_version(&perftest_msg::version()), Ok(6.06));
    assert_eq!(parse_version(&msg(b"5.70")), Ok(5.70));
    assert_eq!(parse_version(&msg(b"6.29")), Ok(6.29));
    assert_eq!(parse_version(&msg(b"25.07.0-0.104")), Ok(25.07));
    for bad in [
        &b""[..],
        b"5.6",
        b"4.5",
        b"abc",
        b".",
        b"perf/1 write_la",
        b"6.06 x",
        b"\x7f6.06",
        b"99999999999",
    ] {
        assert!(parse_version(&msg(bad)).is_err(), "{bad:?}");
    }
    // No NUL, the wrong length, bytes past garbage.
    assert!(parse_version(b"6.06666666666666").is_err());
    assert!(parse_version(b"6.06\0").is_err());
    assert!(parse_version(&[0xff; VERSION_LEN]).is_err());
}

#[test]
fn sizes_and_mtus_are_bounded() {
    assert_eq!(parse_cycle_buffer(&4096u32.to_be_bytes()), Ok(4096));
    assert_eq!(parse_cycle_buffer(&65536u32.to_be_bytes()), Ok(65536));
    for bad in [0u32, 3, 4095, 1 << 22, u32::MAX, 0x8000_0000] {
        assert!(parse_cycle_buffer(&bad.to_be_bytes()).is_err(), "{bad}");
    }
    assert!(parse_cycle_buffer(&[0, 0, 16]).is_err());
    assert_eq!(parse_cache_line(&64u32.to_be_bytes()), Ok(64));
    assert_eq!(parse_cache_line(&128u32.to_be_bytes()), Ok(128));
    for bad in [0u32, 65, 1 << 20] {
        assert!(parse_cache_line(&bad.to_be_bytes()).is_err(), "{bad}");
    }
    assert_eq!(parse_mtu(b"3\0"), Ok(Mtu::MTU_1024));
    assert_eq!(
        parse_mtu(&perftest_msg::mtu(Mtu::MTU_4096)),
        Ok(Mtu::MTU_4096)
    );
    for bad in [&b"0\0"[..], b"6\0", b"33", b"\0\0", b"3", b"3\0\0", b"x\0"] {
        assert!(parse_mtu(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn the_report_is_big_endian_and_implausible_figures_are_refused() {
    // The first fields of ib_write_bw's client's report under strace:
    // 64 B, 5 iterations, BW peak 0.0582 MB/s.
    let r = Report {
        size: 64,
        iters: 5,
        peak: 0.058_228_632_622_115_95,
        average: 0.03,
        msg_rate: 0.000_443,
    };
    let fields = r.encode();
    assert_eq!(fields[0], *b"\0\0\0\0\0\0\0@");
    assert_eq!(fields[1], *b"\0\0\0\0\0\0\0\x05");
    assert_eq!(fields[2], [0x3f, 0xad, 0xd0, 0x24, 0xb1, 0x9b, 0x06, 0xdd]);
    assert_eq!(Report::parse(&fields), Ok(r));
    for bad in [
        Report { size: 0, ..r },
        Report {
            size: u64::MAX,
            ..r
        },
        Report { peak: -1.0, ..r },
        Report {
            average: f64::NAN,
            ..r
        },
        Report {
            msg_rate: f64::INFINITY,
            ..r
        },
    ] {
        assert!(Report::parse(&bad.encode()).is_err(), "{bad:?}");
    }
}
