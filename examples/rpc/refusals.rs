//! What the server must answer to requests it refuses (`rpc client --bad`):
//! each bad request gets its error response and the connection stays
//! usable.

use crate::client::Client;
use crate::proto::{Header, Op, Status, HEADER};
use crate::{BoxError, Opts};

/// What the server answers to requests it must refuse, then that a good
/// request still works: true when every answer was the right one.
pub fn bad_requests(c: &mut Client, server: (&str, u16), opts: &Opts) -> Result<bool, BoxError> {
    c.open(server)?;
    let max = opts.max_payload;
    let good = Header::new(Op::ECHO, Status::OK, 4, 7);
    let with_payload = |h: Header, len: usize| {
        let mut b = h.encode().to_vec();
        b.resize(HEADER + len, 0x5A);
        b
    };
    let cases: Vec<(&str, Vec<u8>, Status)> = vec![
        ("shorter than a header", vec![1, 2, 3], Status::MALFORMED),
        (
            "wrong magic",
            with_payload(
                Header {
                    magic: 0xBEEF,
                    ..good
                },
                4,
            ),
            Status::MALFORMED,
        ),
        ("length disagrees", with_payload(good, 9), Status::MALFORMED),
        (
            "over the limit",
            with_payload(
                Header {
                    len: max + 1,
                    ..good
                },
                max as usize + 1,
            ),
            Status::TOO_LARGE,
        ),
        (
            "unknown op",
            with_payload(
                Header {
                    op: Op(200),
                    ..good
                },
                4,
            ),
            Status::UNKNOWN_OP,
        ),
        ("good", with_payload(good, 4), Status::OK),
    ];
    let mut ok = true;
    if c.ud {
        // Over UD the limit is a datagram: a bigger request is refused
        // here, before posting, and never reaches the server.
        let datagram = c.engine.ud_max_payload(c.conns[0].qp)? as usize;
        let big = with_payload(good, datagram + 1 - HEADER);
        let refused = c.send(0, Op(0), 0, Some(&big)).is_err();
        println!(
            "client: over a datagram ({} B): {}",
            big.len(),
            if refused {
                "refused before posting, as it should"
            } else {
                "POSTED"
            }
        );
        ok &= refused;
    }
    for (what, bytes, want) in cases {
        if c.ud && bytes.len() > HEADER + max as usize {
            continue; // over the datagram: checked above
        }
        let h = c.call(0, &bytes)?;
        let pass = h.status == want;
        println!(
            "client: {what}: answered {} ({})",
            h.status.name(),
            if pass { "as it should" } else { "WRONG" }
        );
        ok &= pass;
    }
    println!("RESULT bad_requests={}", if ok { "pass" } else { "FAIL" });
    Ok(ok)
}
