//! Hostile clients the server must survive, each checking what the
//! server made of it: connections that never post a receive (`--rnr K`,
//! RC) and handshakes naming peers that do not exist (`--hellos K`, UD).

use std::time::{Duration, Instant};

use verbs::exchange::connect_and_exchange;
use verbs::{ConnectOptions, Deadline, Endpoint, Gid, Mtu};

use crate::client::Client;
use crate::proto::Op;
use crate::server::RNR_RETRY;
use crate::BoxError;

/// How long the connections wait before they check: far beyond the
/// server's bound for them, `RNR_RETRY + 1` waits of the RNR timer they
/// ask for (0.64 ms; the longest any queue pair can ask is 655 ms).
const CHECK_AFTER: Duration = Duration::from_secs(2);

/// `k` connections that post no receive, one request each: the server's
/// responses find none (receiver not ready), and it must drop every such
/// connection within its bound, so they cannot hold its slots. (They ask
/// for the default, short RNR timer: with one much longer than the
/// server's ACK timeout, Soft-RoCE ends the wait as a transport timeout
/// however many RNR retries are allowed.) After [`CHECK_AFTER`] each
/// posts a receive and asks again, once a second: a dropped one's request
/// goes unacknowledged and fails; one still held gets the old response.
/// True when all were dropped.
pub fn never_receiving(c: &mut Client, server: (&str, u16), k: usize) -> Result<bool, BoxError> {
    let timer = ConnectOptions::default().min_rnr_timer;
    for _ in 0..k {
        c.open_as(server, false, timer)?;
    }
    let mut failed = 0;
    for i in 0..k {
        while !c.send(i, Op::ECHO, 8, None)? {
            c.poll(|_, _, _, _, _| {}, &mut failed)?;
        }
    }
    let started = Instant::now();
    while started.elapsed() < CHECK_AFTER {
        c.poll(|_, _, _, _, _| {}, &mut failed)?;
        std::thread::sleep(Duration::from_millis(10));
    }
    for i in 0..k {
        c.post_receive(i)?;
    }
    let mut answered = vec![false; k];
    let until = Instant::now() + Duration::from_secs(30);
    let mut next_ask = Instant::now();
    loop {
        let open: Vec<usize> = (0..k).filter(|&i| !answered[i] && c.is_alive(i)).collect();
        if open.is_empty() || Instant::now() > until {
            break;
        }
        if Instant::now() >= next_ask {
            for &i in &open {
                c.send(i, Op::ECHO, 8, None)?; // false: the last one is still out
            }
            next_ask = Instant::now() + Duration::from_secs(1);
        }
        c.poll(|i, _, _, _, _| answered[i] = true, &mut failed)?;
    }
    let dropped = (0..k).filter(|&i| !c.is_alive(i)).count();
    let held = answered.iter().filter(|&&a| a).count();
    println!(
        "client: {k} connections that post no receive (the server retries {RNR_RETRY} times): {dropped} dropped by the server, {held} still held"
    );
    println!("RESULT rnr_dropped={dropped}/{k}");
    Ok(dropped == k)
}

/// `k` handshakes, each naming a peer no host is (198.18.0.0/15, the
/// benchmarking range) with a made-up queue pair: valid hellos, so the
/// server answers them, but it must make nothing for them (an address
/// handle per claimed GID would grow without bound); its last line says
/// how many peers and address handles it holds. True when all were
/// answered.
pub fn made_up_peers(server: (&str, u16), k: usize) -> Result<bool, BoxError> {
    for i in 0..k {
        let ep = Endpoint {
            qpn: 0x100 + i as u32,
            psn: 0,
            lid: 0,
            gid: Gid::from_ipv4([198, 18, (i >> 8) as u8, i as u8]),
            mtu: Mtu::MTU_1024,
            regions: Vec::new(),
        };
        connect_and_exchange(server, &ep, None, Deadline::after(Duration::from_secs(10)))?;
    }
    println!("RESULT made_up_peers={k}");
    Ok(true)
}
