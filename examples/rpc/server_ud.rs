//! The service over datagrams (`--ud`): one UD queue pair on an engine
//! answers every client queue pair. A request's receive buffer starts with
//! the 40-byte GRH, which names the sender's GID; the response goes back in
//! the same buffer, after the GRH, to that GID and the completion's source
//! queue pair, through one address handle per client port, made on its
//! first request and given up when it falls silent (peers.rs): at most
//! `--max-conns` of them, whatever clients claim in their handshakes.

use std::time::{Duration, Instant};

use verbs::exchange::{Server, ServerConfig};
use verbs::{
    AhId, ArenaBuf, Context, Deadline, Engine, EngineConfig, Gid, Grh, HostBuf, ProtectionDomain,
    QpConfig, QpId, RecvRequest, SendRequest, Transport, UdDest, WcStatus, DEFAULT_QKEY, GRH_LEN,
};

use crate::nap::Nap;
use crate::peers::{Handles, Peers};
use crate::proto::HEADER;
use crate::server::{respond, Counters, Summary};
use crate::{BoxError, Opts};

/// Responses in flight at once (the send queue's depth).
const SEND_DEPTH: u32 = 256;

pub fn run(opts: &Opts) -> Result<(), BoxError> {
    let ctx = Context::open(opts.dev.as_deref())?;
    let pd = ProtectionDomain::new(&ctx)?;
    let depth = opts.srq_depth;
    let mut engine: Engine<ArenaBuf> = Engine::new(
        &pd,
        &EngineConfig {
            cq_depth: Some(depth + SEND_DEPTH),
            events: opts.sleep_after > 0,
            ..EngineConfig::default()
        },
    )?;
    let qp = engine.add_qp(&QpConfig {
        transport: Transport::Ud,
        max_send_wr: SEND_DEPTH,
        max_recv_wr: depth,
        max_sge: 1,
        ..QpConfig::default()
    })?;
    engine.ready_ud(qp)?;
    // The service's limit is what one datagram holds after the header.
    let datagram = engine.ud_max_payload(qp)? as usize;
    let limit = opts.max_payload.min((datagram - HEADER) as u32);
    let opts = &Opts {
        max_payload: limit,
        ..opts.clone()
    };
    let buf_len = GRH_LEN + datagram;
    let buffers = depth + SEND_DEPTH;
    let mut arena = crate::arena(&pd, buffers as usize, buf_len)?;
    for _ in 0..depth {
        let buf = arena.alloc(buf_len)?;
        engine
            .post_recv(qp, RecvRequest::new(buf))
            .map_err(|e| e.error)?;
    }
    let ours = engine.endpoint(qp)?;
    let server = Server::bind(
        ("0.0.0.0", opts.port),
        ServerConfig {
            link_layer: Some(ctx.query_port(1)?.link_layer()),
            ..ServerConfig::default()
        },
        |peer, err| eprintln!("server: refused {peer}: {err}"),
    )?;
    println!(
        "server: UD queue pair {} on port {}, payloads up to {limit} B (datagrams of {datagram} B), {depth} receives",
        ours.qpn, opts.port
    );
    let mut peers: Peers<AhId> = Peers::new(opts.max_conns as usize);
    let mut n = Counters::default();
    let published = crate::server::metrics(opts, &ctx)?;
    let mut summary = Summary::new();
    let mut scratch = vec![0u8; buf_len];
    // Buffers a post refused, posted again after the poll.
    let mut free: Vec<ArenaBuf> = Vec::with_capacity(buffers as usize);
    // Requests from peers with no address handle yet (their first): the
    // handle is made after the poll (making one is not a post), then the
    // response goes out. Every other response is posted by the handler.
    let mut first: Vec<(Gid, u32, SendRequest<ArenaBuf>)> = Vec::with_capacity(64);
    let (mut stop, mut polls) = (false, 0u32);
    // Counters go out as often as a shard's (the loop's only lock).
    let mut publish_at = Instant::now();
    let mut nap = Nap::new(opts.sleep_after, Duration::from_millis(50));
    while !stop {
        polls = polls.wrapping_add(1);
        let now = Instant::now();
        let got = engine.poll(|mut c| {
            let ok = c.status() == WcStatus::SUCCESS;
            let (is_recv, from_qp, len, at) = (
                c.is_recv(),
                c.src_qp(),
                c.byte_len() as usize,
                c.payload_offset(),
            );
            let Some(buf) = c.take_buf() else { return };
            if !ok || !is_recv || at != GRH_LEN {
                n.dropped += u64::from(!ok);
                recv_again(&mut c, qp, buf, &mut free);
                return;
            }
            let mut grh = [0u8; GRH_LEN];
            let from = buf
                .read_at(0, &mut grh)
                .ok()
                .and_then(|()| Grh::from_bytes(&grh))
                .and_then(|g| g.source_gid());
            let Some(from) = from else {
                recv_again(&mut c, qp, buf, &mut free);
                return;
            };
            n.requests += 1;
            let req = match respond(buf, at, len - at, opts, &mut scratch, &mut n, &mut stop) {
                Ok(req) => req,
                Err(buf) => return recv_again(&mut c, qp, buf, &mut free),
            };
            let Some(ah) = peers.known(from, now) else {
                if first.len() < first.capacity() {
                    first.push((from, from_qp, req));
                } else {
                    n.dropped += 1;
                    free.extend(req.into_bufs());
                }
                return;
            };
            let dest = UdDest {
                ah,
                qpn: from_qp,
                qkey: DEFAULT_QKEY,
            };
            if let Err(e) = c.poster().post_ud_send(qp, &dest, req) {
                n.dropped += 1;
                free.extend(e.request.into_bufs());
            }
        })?;
        if !first.is_empty() || polls % 512 == 0 {
            // Routes first, then sends: an address handle is only given
            // up while no send is in flight (one may name it).
            let mut handles = AddressHandles {
                engine: &mut engine,
                qp,
            };
            if polls % 512 == 0 {
                peers.prune(now, &mut handles);
            }
            for (gid, qpn, req) in first.drain(..) {
                let sent = match peers.route(gid, now, &mut handles) {
                    Some(ah) => {
                        let dest = UdDest {
                            ah,
                            qpn,
                            qkey: DEFAULT_QKEY,
                        };
                        handles
                            .engine
                            .post_ud_send(qp, &dest, req)
                            .map_err(|e| e.request)
                    }
                    None => Err(req),
                };
                if let Err(req) = sent {
                    n.dropped += 1;
                    free.extend(req.into_bufs());
                }
            }
        }
        for buf in free.drain(..) {
            if let Err(e) = engine.post_recv(qp, RecvRequest::new(buf)) {
                return Err(format!("server: a receive was refused: {}", e.error).into());
            }
        }
        let slept = nap.after_poll(&engine, got)?;
        if polls % 512 == 0 || slept {
            accept(&server, &ours);
            n.conns = peers.len() as u64;
            if now >= publish_at {
                publish_at = now + crate::server::KEEPALIVE_ROUND;
                n.engine = engine.counters();
                if let Some(p) = &published {
                    p.publish(0, &n);
                }
            }
            summary.tick(&n, peers.len());
            if summary.over(opts.seconds) {
                break;
            }
        }
    }
    n.engine = engine.counters();
    if let Some(p) = &published {
        p.publish(0, &n);
    }
    summary.last_line(&n);
    println!(
        "server: {} peers, {} address handles (at most {})",
        peers.len(),
        engine.ah_count(),
        opts.max_conns
    );
    Ok(())
}

/// Posts `buf` as a receive on `qp` from the poll's handler (kept in
/// `free` if refused, for the loop to post again).
fn recv_again(
    c: &mut verbs::CompletionRef<'_, ArenaBuf>,
    qp: QpId,
    buf: ArenaBuf,
    free: &mut Vec<ArenaBuf>,
) {
    if let Err(e) = c.poster().post_recv(qp, RecvRequest::new(buf)) {
        free.extend(e.request.into_bufs());
    }
}

/// The engine's address handles, from `qp`'s port.
struct AddressHandles<'a> {
    engine: &'a mut Engine<ArenaBuf>,
    qp: QpId,
}

impl Handles<AhId> for AddressHandles<'_> {
    fn make(&mut self, gid: Gid) -> Option<AhId> {
        self.engine.create_ah(self.qp, gid, 0).ok()
    }

    /// Refused by the engine while a send is in flight.
    fn give_up(&mut self, ah: AhId) -> bool {
        self.engine.remove_ah(ah).is_ok()
    }
}

/// Answers every finished handshake with our queue pair. Nothing is
/// made for it: its address handle comes with its first request, from
/// the address the request came from, not the one the handshake claims.
fn accept(server: &Server, ours: &verbs::Endpoint) {
    while let Ok(hs) = server.next_client(Deadline::after(Duration::ZERO)) {
        let _ = hs.reply(ours);
    }
}
