//! The transfer's failure handling on the simulated device: what it does
//! when a reset or a destroy fails, and whose completions it believes.

use crate::endpoint::RemoteRegion;
use crate::engine::sim::device::{Sim, SimBuf};
use alloc::vec::Vec;

use crate::error::{Error, ErrorKind};
use crate::sys::ibv_wc_status as WcStatus;
use crate::wr::{RemoteSlice, SendOp, SendRequest};

use super::sim::{bed, bed_with, complete_all, device_qp, Peer};
use super::Transfer;

/// Steps (the device finishing everything it holds before each) until
/// every chunk is done or a step fails, at most `steps` times.
fn run(t: &mut Transfer<SimBuf, Sim>, peer: &mut Peer, steps: usize) -> Result<bool, Error> {
    for _ in 0..steps {
        complete_all(t);
        if t.step(peer)?.done {
            return Ok(true);
        }
    }
    Ok(false)
}

/// After a first step (every path full), the device of plane 0 refuses
/// state changes, and destroys too when `leak`, and path 0 is failed:
/// the next step's reset of it fails.
fn refuse_reset_of_path_0(t: &mut Transfer<SimBuf, Sim>, peer: &mut Peer, leak: bool) {
    t.step(peer).unwrap();
    assert_eq!(t.paths[0].stats.in_flight, 4);
    let dev = &mut t.planes[0].engine.0.prov.dev;
    dev.fail_state_changes = true;
    dev.fail_destroy_permille = if leak { 1000 } else { 0 };
    t.fail_path(0);
}

/// One plane: what path 0 held has no other plane to go to. Its reset
/// fails with four chunks in flight; the destroy that follows works.
#[test]
fn a_failed_reset_gives_the_chunks_back() {
    let mut t = bed(1, 2, 16, 4);
    let mut peer = Peer { reconnects: 0 };
    refuse_reset_of_path_0(&mut t, &mut peer, false);
    let failed = t.step(&mut peer);
    t.planes[0].engine.0.prov.dev.fail_state_changes = false;
    failed.unwrap();
    let done = run(&mut t, &mut peer, 200).unwrap();
    assert!(
        done,
        "not done after 200 steps, no error: {:?}",
        t.progress()
    );
}

/// The same, but the queue pair cannot be destroyed either: its buffers
/// are leaked with it, and with no other plane those chunks can never be
/// sent. The transfer must say so at once, not run to its deadline.
#[test]
// Leaks on purpose (what a failed destroy must leak); Miri runs this
// module without tolerating leaks (`.ci/run`).
#[cfg_attr(miri, ignore = "leaks on purpose")]
fn a_failed_reset_and_destroy_fail_the_transfer_at_once_with_the_reason() {
    let mut t = bed(1, 2, 16, 4);
    let mut peer = Peer { reconnects: 0 };
    refuse_reset_of_path_0(&mut t, &mut peer, true);
    // The step that finds the queue pair leaked fails; so would any later.
    let outcome = t.step(&mut peer).map(|_| false);
    let outcome = outcome.and_then(|_| run(&mut t, &mut peer, 50));
    match outcome {
        Err(e) => assert!(
            e.kind() == ErrorKind::Leaked && e.to_string().contains("never be sent"),
            "the error names the cause: {e}"
        ),
        Ok(done) => panic!(
            "no error (done: {done}) though 4 chunks' only buffers were leaked: {:?}",
            t.progress()
        ),
    }
    assert_eq!(
        t.progress().chunks_done,
        0,
        "failed in the step that leaked"
    );
}

/// Two planes: the chunks whose plane-0 buffers were leaked go out on
/// plane 1, and the transfer completes.
#[test]
// Leaks on purpose (what a failed destroy must leak); Miri runs this
// module without tolerating leaks (`.ci/run`).
#[cfg_attr(miri, ignore = "leaks on purpose")]
fn chunks_leaked_on_one_plane_go_out_on_another() {
    let mut t = bed(2, 1, 16, 4);
    let mut peer = Peer { reconnects: 0 };
    refuse_reset_of_path_0(&mut t, &mut peer, true);
    t.step(&mut peer).unwrap();
    let dev = &mut t.planes[0].engine.0.prov.dev;
    dev.fail_state_changes = false;
    dev.fail_destroy_permille = 0;
    assert!(run(&mut t, &mut peer, 200).unwrap(), "{:?}", t.progress());
    for c in 0..4 {
        assert_eq!(t.placement(c), Some(1), "chunk {c}");
    }
}

/// A request the transfer did not post, on a path's queue pair, tagged
/// like the transfer's post of chunk 0 on path 0, would settle chunk 0
/// when it completed (for a Read, handing back a chunk whose bytes have
/// not landed). A caller cannot make one: a plane's engine is made empty
/// and cannot be posted on (`PlaneEngine`'s compile_fail example). An
/// engine holding one anyway is refused.
#[test]
fn an_engine_holding_a_request_the_transfer_did_not_post_is_refused() {
    let remote = RemoteRegion {
        addr: 1 << 40,
        len: 1 << 20,
        rkey: 1,
    };
    let refused = bed_with(1, 1, 4, 4, 4096, |_, engine, qp| {
        let empty = RemoteSlice::new(&remote, 0, 0).unwrap();
        let req = SendRequest::<SimBuf>::empty(SendOp::Write(empty)).tag(0);
        engine.post_send(qp, req).map_err(|e| e.error).unwrap();
    });
    let e = refused.err().expect("refused");
    assert_eq!(e.kind(), ErrorKind::BadState, "{e}");
}

/// The drill's loss case on a starved host: a path's oldest Write fails
/// (retries exceeded) and the device has not flushed the three behind it
/// when the transfer resets the queue pair, so the engine takes them back
/// itself at RESET. They never ran: not one may count as done. (Before
/// the engine handed such requests back as flushed, it handed back all
/// but the newest as successful, and the drill's server found two
/// acknowledged chunks of zeros: FAULTS.md, "Integrity".)
#[test]
fn requests_taken_back_before_the_device_flushed_them_are_not_done() {
    let mut t = bed(2, 2, 32, 4);
    let mut peer = Peer { reconnects: 0 };
    let chunk_of: Vec<Vec<u64>> = t
        .planes
        .iter()
        .map(|p| p.bufs.iter().map(|b| b.as_ref().unwrap().id).collect())
        .collect();
    t.step(&mut peer).unwrap();
    assert_eq!(t.paths[2].stats.in_flight, 4);
    let q = device_qp(&t, 2).unwrap();
    let dev = &mut t.planes[1].engine.0.prov.dev;
    dev.lazy_flush = true;
    dev.fail_head(q, WcStatus::RETRY_EXC_ERR);
    let mut landed = Vec::new();
    for _ in 0..200 {
        if t.step(&mut peer).unwrap().done {
            break;
        }
        landed.extend(complete_all(&mut t));
    }
    assert!(t.chunks.all_done(), "{:?}", t.progress());
    let wrong: Vec<usize> = (0..32)
        .filter(|&c| {
            let p = usize::from(t.placement(c).unwrap());
            !landed.contains(&chunk_of[p][c])
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "chunks done on a plane where no post of them ran: {wrong:?}"
    );
    assert_eq!(t.paths[2].stats.failures, 1);
}

/// A plane's engine holds at most as many requests in flight as its
/// completion queue holds completions, whatever its paths' depths: here
/// 5, for two paths of depth 4. A post it refuses for that (`QueueFull`,
/// its room 0) waits for the next poll; it is no fault of the path.
#[test]
fn a_full_engine_holds_chunks_back_without_failing_a_path() {
    let mut t = bed_with(1, 2, 32, 4, 5, |_, _, _| {}).unwrap();
    let mut peer = Peer { reconnects: 0 };
    t.step(&mut peer).unwrap();
    let in_flight: u32 = t.paths.iter().map(|p| p.stats.in_flight).sum();
    assert_eq!(in_flight, 5, "as many as the engine has room for");
    assert!(run(&mut t, &mut peer, 200).unwrap(), "{:?}", t.progress());
    for p in &t.paths {
        assert_eq!((p.stats.failures, p.stats.last_cause), (0, None));
    }
}
