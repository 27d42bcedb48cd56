//! A server answering from a ring of prepared replies, from inside its
//! poll's callback (`Poster::write_prepared`, `post_prepared`), on a real
//! device: every reply carries what the callback wrote, and a reply whose
//! last post is still in flight refuses a write from the callback (the
//! NIC may still be reading its buffer). A server that reads each
//! request where it landed in its shared receive queue and posts that
//! receive again in place. And replies posted unreported: handed back
//! only if they fail.

mod support;

use support::numbered::{self, NumberedClient};

use verbs::sys::ibv_wc_status as S;
use verbs::{
    ErrorKind, HostBuf, Local, MemoryRegion, PreparedSend, ProtectionDomain, QpState, QueuePair,
    RecvRequest, RemoteSlice, SendOp, SendRequest, WcStatus,
};

type Qp = QueuePair<MemoryRegion>;

const MSG: usize = 64;
const ROUNDS: u8 = 40;

fn buf(pd: &ProtectionDomain, byte: u8) -> MemoryRegion {
    let mut buf = MemoryRegion::new(pd, MSG).unwrap();
    buf.write_at(0, &[byte; MSG]).unwrap();
    buf
}

/// Requests arrive on the server's shared receive queue; its callback
/// writes each answer (the request's byte plus one) into the one prepared
/// reply, posts it, tries to write it again while that post is in flight
/// (refused, `BadState`, the bytes on the wire untouched), and posts the
/// request's buffer back. A request that arrives before the previous
/// reply's completion (the device's order, not the test's) is answered
/// after that completion, outside the callback.
#[test]
fn a_prepared_reply_is_written_from_the_callback_only_while_none_of_its_posts_is_in_flight() {
    let ctx = support::test_context("a_prepared_reply_from_the_callback");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let (mut server, mut client, s, c) = support::srq_server_and_client(&pd, 4, MSG);
    let reply = Local::range(buf(&pd, 0), 0, MSG)
        .map_err(|(e, _)| e)
        .unwrap();
    let reply = server
        .prepare_send(s, SendRequest::new(SendOp::Send, reply))
        .map_err(|e| e.error)
        .unwrap();
    let request = |byte| SendRequest::new(SendOp::Send, buf(&pd, byte));
    client
        .post_recv(c, RecvRequest::new(buf(&pd, 0)))
        .map_err(|e| e.error)
        .unwrap();
    client
        .post_send(c, request(0))
        .map_err(|e| e.error)
        .unwrap();

    let (mut replies, mut from_callback) = (0u8, 0u32);
    let mut deferred: Option<(MemoryRegion, u8)> = None;
    let deadline = support::deadline();
    while replies < ROUNDS {
        assert!(!deadline.passed(), "{replies} replies of {ROUNDS}");
        server
            .poll(|mut done| {
                done.result().unwrap();
                if !done.is_recv() {
                    return; // the reply's buffer stays with the prepared request
                }
                let request = done.take_buf().expect("a request's buffer");
                let answer = support::first_byte(&request) + 1;
                let mut post = done.poster();
                match post.write_prepared(reply, 0, &[answer; MSG]) {
                    Ok(()) => {}
                    Err(e) => {
                        assert_eq!(e.kind(), ErrorKind::BadState, "{e}");
                        deferred = Some((request, answer));
                        return;
                    }
                }
                post.post_prepared(reply).unwrap();
                let again = post
                    .write_prepared(reply, 0, &[0xEE; MSG])
                    .expect_err("the NIC may still read the reply's buffer");
                assert_eq!(again.kind(), ErrorKind::BadState, "{again}");
                from_callback += 1;
                post.post_srq_recv(RecvRequest::new(request))
                    .map_err(|e| e.error)
                    .unwrap();
            })
            .unwrap();
        if let Some((request, answer)) = deferred.take() {
            match server.write_prepared(reply, 0, &[answer; MSG]) {
                Ok(()) => {
                    server.post_prepared(reply).unwrap();
                    server
                        .post_srq_recv(RecvRequest::new(request))
                        .map_err(|e| e.error)
                        .unwrap();
                }
                Err(_) => deferred = Some((request, answer)), // not yet completed
            }
        }
        client
            .poll(|mut done| {
                done.result().unwrap();
                if !done.is_recv() {
                    return;
                }
                let got = done.take_buf().unwrap();
                assert_eq!(
                    support::first_byte(&got),
                    2 * replies + 1,
                    "reply {replies}"
                );
                replies += 1;
                let mut post = done.poster();
                post.post_recv(c, RecvRequest::new(got))
                    .map_err(|e| e.error)
                    .unwrap();
                if replies < ROUNDS {
                    post.post_send(c, request(2 * replies))
                        .map_err(|e| e.error)
                        .unwrap();
                }
            })
            .unwrap();
    }
    // The callback answered at least one (in practice all), each refused a
    // second write while its post was in flight.
    assert!(from_callback > 0, "no reply was written from the callback");
}

/// The server reads each request in its shared receive queue's slot
/// (`CompletionRef::buf`), posts that receive again in place
/// (`repost_recv`) and answers: every reply carries its request's number
/// and bytes, the queue keeps its receives posted, and once a receive is
/// posted again nothing of it is left to read, take or post twice.
#[test]
fn a_server_reads_each_request_in_its_slot_and_posts_it_again_there() {
    let ctx = support::test_context("a_server_reads_each_request_in_its_slot");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let (mut server, mut client, _, c) = support::srq_server_and_client(&pd, 4, MSG);
    let mut numbered = NumberedClient::new(&pd, &mut client, c, 300, 4);
    let mut answered = 0u64;
    let mut replies = Vec::new();
    let deadline = support::deadline();
    while !numbered.done() {
        assert!(!deadline.passed(), "{} replies", numbered.received);
        numbered.send(&pd, &mut client, c);
        server
            .poll(|mut done| {
                done.result().unwrap();
                if !done.is_recv() {
                    replies.extend(done.take_buf());
                    return;
                }
                let mut request = [0u8; MSG];
                done.buf()
                    .expect("the request in its slot")
                    .read_at(0, &mut request)
                    .unwrap();
                done.repost_recv().unwrap();
                if answered == 0 {
                    assert!(done.buf().is_none(), "readable once posted again");
                    assert!(done.take_buf().is_none(), "taken once posted again");
                    done.repost_recv()
                        .expect_err("a receive posted again twice");
                }
                let mut reply = replies.pop().unwrap_or_else(|| buf(&pd, 0));
                reply.write_at(0, &numbered::answer(&request)).unwrap();
                done.reply(SendRequest::new(SendOp::Send, reply))
                    .map_err(|e| e.error)
                    .unwrap();
                answered += 1;
            })
            .unwrap();
        assert_eq!(server.srq_posted(), 4, "a receive not posted again");
        numbered.poll(&mut client);
    }
    assert_eq!(answered, numbered.sent);
}

/// A Write of `byte`s to `remote` at `offset`, prepared on `qp` with `tag`.
fn prepared_write(
    qp: &mut Qp,
    pd: &ProtectionDomain,
    dst: RemoteSlice,
    byte: u8,
    tag: u64,
) -> PreparedSend {
    let src = Local::range(buf(pd, byte), 0, MSG)
        .map_err(|(e, _)| e)
        .unwrap();
    qp.prepare_send(SendRequest::new(SendOp::Write(dst), src).tag(tag))
        .map_err(|e| e.error)
        .unwrap()
}

/// Polls `qp` until nothing is in flight: each request handed back, its
/// tag and status.
fn handed_back(qp: &mut Qp) -> Vec<(u64, WcStatus)> {
    let mut got = Vec::new();
    let deadline = support::deadline();
    while qp.in_flight().unwrap() != (0, 0) {
        assert!(!deadline.passed(), "still in flight; handed back {got:?}");
        qp.poll(|c| got.push((c.tag(), c.status()))).unwrap();
    }
    got
}

/// Replies written unreported (`post_prepared_unreported`) land, and the
/// poll hands back only the reported one behind them; each is refused to
/// the caller while its post is in flight.
#[test]
fn unreported_writes_that_land_are_not_handed_back() {
    let (pd, mut a, _b) = support::pd_and_pair::<MemoryRegion>("unreported_writes_that_land");
    let target = support::remote_region(&pd, 4096);
    let remote = target.remote().unwrap();
    let at = |offset| RemoteSlice::new(&remote, offset, MSG as u64).unwrap();
    let quiet = prepared_write(&mut a, &pd, at(0), 0x5A, 1);
    let last = prepared_write(&mut a, &pd, at(MSG as u64), 0xC3, 2);
    for _ in 0..6 {
        a.post_prepared_unreported(quiet).unwrap();
    }
    let busy = a.write_prepared(quiet, 0, &[0xEE; MSG]).unwrap_err();
    assert_eq!(busy.kind(), ErrorKind::BadState, "{busy}");
    a.post_prepared(last).unwrap();
    assert_eq!(handed_back(&mut a), [(2, WcStatus::SUCCESS)]);
    let mut landed = [0u8; 2 * MSG];
    target.read_at(0, &mut landed).unwrap();
    assert_eq!(landed[..MSG], [0x5A; MSG]);
    assert_eq!(landed[MSG..], [0xC3; MSG]);
    a.write_prepared(quiet, 0, &[0xEE; MSG]).unwrap();
}

/// An unreported Write the target refuses is handed back with its status,
/// and so is the unreported one behind it, flushed: a failure is never
/// quiet.
#[test]
fn an_unreported_write_the_target_refuses_is_handed_back_with_what_it_flushed() {
    let (pd, mut a, _b) = support::pd_and_pair::<MemoryRegion>("an_unreported_write_refused");
    let target = support::remote_region(&pd, 4096);
    let remote = target.remote().unwrap();
    let bad = RemoteSlice::unchecked(remote.addr, MSG as u64, remote.rkey ^ 0x5500);
    let good = RemoteSlice::new(&remote, 0, MSG as u64).unwrap();
    let refused = prepared_write(&mut a, &pd, bad, 0x5A, 3);
    let flushed = prepared_write(&mut a, &pd, good, 0xC3, 1);
    a.post_prepared_unreported(refused).unwrap();
    a.post_prepared_unreported(flushed).unwrap();
    assert_eq!(
        handed_back(&mut a),
        [(3, S::REM_ACCESS_ERR), (1, S::WR_FLUSH_ERR)]
    );
    assert_eq!(a.state().unwrap(), QpState::ERR);
}
