//! A stream's bookkeeping: the data received and not yet read, the send
//! buffers free, the credits each way, and what completions change.
//! Every queue is sized when the stream is made: nothing here allocates.

use std::collections::VecDeque;
use std::io;

use verbs::{
    site, ArenaBuf, CompletionRef, Engine, Error, ErrorKind, HostBuf, Local, NicBuf, QpId,
    RecvRequest, RemoteSlice, SendOp, SendRequest,
};

use super::config::StreamConfig;
use super::parts::{verbs_io, CTRL_SLOTS};

/// The immediate's top bit: the sender will send no more data.
const FIN: u32 = 1 << 31;

/// Tags of the sends, told apart by their completions.
const DATA: u64 = 1;
const CTRL: u64 = 2;
const KEEPALIVE: u64 = 3;

#[derive(Debug)]
pub(crate) struct Flow {
    qp: QpId,
    /// Received data not yet read, oldest first, with its length.
    rx: VecDeque<(ArenaBuf, usize)>,
    /// Bytes of `rx`'s front already read.
    rx_read: usize,
    /// Receive buffers to post again once the poll that freed them ends.
    repost: Vec<ArenaBuf>,
    send_free: Vec<ArenaBuf>,
    /// A data send is signaled once no more than this many buffers are
    /// free: the rest come back with it (an acknowledgement alone wakes
    /// nobody).
    signal_below: usize,
    /// Data messages the peer can still take.
    credits: u32,
    /// Control messages we may still have in flight.
    ctrl_free: u32,
    /// Data receives posted again and not yet reported to the peer.
    owed: u32,
    /// Report `owed` in a control message from this many on.
    owed_threshold: u32,
    /// Sends posted and not yet completed.
    pub(crate) in_flight: u32,
    keepalive_in_flight: bool,
    /// A completion arrived since the last keepalive tick.
    pub(crate) heard: bool,
    fin_sent: bool,
    fin_received: bool,
    /// The first failure; every later call reports it.
    failed: Option<Error>,
}

impl Flow {
    pub(crate) fn new(qp: QpId, send_free: Vec<ArenaBuf>, config: &StreamConfig) -> Flow {
        let recvs = (config.recv_slots + CTRL_SLOTS) as usize;
        Flow {
            qp,
            rx: VecDeque::with_capacity(recvs),
            rx_read: 0,
            repost: Vec::with_capacity(recvs),
            signal_below: send_free.len() / 2,
            send_free,
            credits: config.recv_slots,
            ctrl_free: CTRL_SLOTS,
            owed: 0,
            owed_threshold: config.recv_slots.div_ceil(2),
            in_flight: 0,
            keepalive_in_flight: false,
            heard: false,
            fin_sent: false,
            fin_received: false,
            failed: None,
        }
    }

    /// What a completion changes (called inside the engine's poll: posts
    /// wait for [`Flow::settle`]).
    pub(crate) fn on_completion(&mut self, mut c: CompletionRef<'_, ArenaBuf>) {
        self.heard = true;
        if !c.is_recv() {
            self.in_flight -= 1;
        }
        if let Err(e) = c.result() {
            let probe = !c.is_recv() && c.tag() == KEEPALIVE && !e.is_flush();
            self.fail(if probe { probe_unanswered(e) } else { e });
            return; // its buffer drops here: the device is done with it
        }
        if c.is_recv() {
            let len = c.byte_len() as usize;
            let (Some(buf), Some(imm)) = (c.take_buf(), c.imm()) else {
                return self.fail(protocol_error());
            };
            // A lying peer only makes itself wait (receiver-not-ready).
            self.credits = self.credits.saturating_add(imm & !FIN);
            self.fin_received |= imm & FIN != 0;
            if len == 0 {
                self.repost.push(buf); // a control message: its slot is not a credit
            } else {
                self.rx.push_back((buf, len));
            }
            return;
        }
        match c.tag() {
            DATA => self.send_free.extend(c.take_buf()),
            CTRL => self.ctrl_free += 1,
            _ => self.keepalive_in_flight = false,
        }
    }

    fn fail(&mut self, e: Error) {
        self.failed.get_or_insert(e);
    }

    pub(crate) fn failure(&self) -> Option<io::Error> {
        self.failed.map(verbs_io)
    }

    /// Posts the freed receives again and reports the credits owed.
    pub(crate) fn settle(&mut self, engine: &mut Engine<ArenaBuf>) -> Result<(), Error> {
        if self.failed.is_some() {
            // The queue pair takes nothing more; what was received and
            // not read stays readable.
            self.repost.clear();
            return Ok(());
        }
        while let Some(buf) = self.repost.pop() {
            engine
                .post_recv(self.qp, RecvRequest::new(buf))
                .map_err(|e| e.error)?;
        }
        // Once the peer ended its stream it sends no more data: it needs
        // no credits (and may be gone).
        if self.owed >= self.owed_threshold && self.ctrl_free > 0 && !self.fin_received {
            self.post_ctrl(engine, 0)?;
        }
        Ok(())
    }

    fn post_ctrl(&mut self, engine: &mut Engine<ArenaBuf>, flags: u32) -> Result<(), Error> {
        let mut req = SendRequest::empty(SendOp::SendImm(flags | self.owed)).tag(CTRL);
        // The end of the stream is waited for; others are signaled only
        // before the control budget runs low (the rest come back with it).
        if flags & FIN == 0 && self.ctrl_free > CTRL_SLOTS / 2 {
            req = req.unsignaled();
        }
        engine.post_send(self.qp, req).map_err(|e| e.error)?;
        self.owed = 0;
        self.ctrl_free -= 1;
        self.in_flight += 1;
        Ok(())
    }

    /// Copies received data into `out`; false when none is there.
    pub(crate) fn read(&mut self, out: &mut tokio::io::ReadBuf<'_>) -> Result<bool, Error> {
        let mut copied = false;
        while out.remaining() > 0 {
            let Some((buf, len)) = self.rx.front() else {
                break;
            };
            let data = &buf.as_slice()?[self.rx_read..*len];
            let n = data.len().min(out.remaining());
            out.put_slice(&data[..n]);
            copied = true;
            self.rx_read += n;
            if self.rx_read == *len {
                if let Some((buf, _)) = self.rx.pop_front() {
                    self.repost.push(buf);
                }
                self.rx_read = 0;
                self.owed += 1;
            }
        }
        Ok(copied)
    }

    /// True once the peer ended its stream.
    pub(crate) fn peer_done(&self) -> bool {
        self.fin_received
    }

    /// True once the peer ended its stream and everything was read.
    pub(crate) fn at_eof(&self) -> bool {
        self.fin_received && self.rx.is_empty()
    }

    /// Sends as much of `data` as credits and buffers allow; the bytes taken.
    pub(crate) fn write(
        &mut self,
        engine: &mut Engine<ArenaBuf>,
        data: &[u8],
    ) -> Result<usize, Error> {
        if self.fin_sent {
            return Err(Error::new(
                site!(
                    "RdmaStream::poll_write",
                    "the stream was shut down for writing"
                ),
                ErrorKind::BadState,
            ));
        }
        let mut taken = 0;
        while taken < data.len() && self.credits > 0 {
            let Some(mut buf) = self.send_free.pop() else {
                break;
            };
            let n = (data.len() - taken).min(buf.len());
            buf.write_at(0, &data[taken..taken + n])?;
            let local = match Local::range(buf, 0, n) {
                Ok(local) => local,
                Err((e, buf)) => {
                    self.send_free.push(buf);
                    return Err(e);
                }
            };
            let imm = core::mem::take(&mut self.owed);
            let mut req = SendRequest::new(SendOp::SendImm(imm), local).tag(DATA);
            if self.send_free.len() > self.signal_below {
                req = req.unsignaled();
            }
            if let Err(refused) = engine.post_send(self.qp, req) {
                self.owed += imm;
                self.send_free.extend(refused.request.into_bufs());
                return Err(refused.error);
            }
            self.credits -= 1;
            self.in_flight += 1;
            taken += n;
        }
        Ok(taken)
    }

    /// Sends the end of the stream, if a control message may go now;
    /// true once it is sent.
    pub(crate) fn send_fin(&mut self, engine: &mut Engine<ArenaBuf>) -> Result<bool, Error> {
        if self.fin_sent {
            return Ok(true);
        }
        if self.ctrl_free == 0 {
            return Ok(false);
        }
        self.post_ctrl(engine, FIN)?;
        self.fin_sent = true;
        Ok(true)
    }

    /// A keepalive, unless one is in flight or the peer was heard from
    /// since the last tick.
    pub(crate) fn tick(&mut self, engine: &mut Engine<ArenaBuf>) -> Result<(), Error> {
        if !core::mem::take(&mut self.heard) && !self.keepalive_in_flight {
            let probe = SendRequest::empty(SendOp::Write(RemoteSlice::unchecked(0, 0, 0)));
            engine
                .post_send(self.qp, probe.tag(KEEPALIVE))
                .map_err(|e| e.error)?;
            self.keepalive_in_flight = true;
            self.in_flight += 1;
        }
        Ok(())
    }
}

/// A keepalive probe's failure (status kept): a reader waiting on it
/// learns that the peer is gone, not only that a Write went unanswered.
#[cold]
fn probe_unanswered(e: Error) -> Error {
    e.at(site!(
        "RdmaStream keepalive",
        "the peer did not acknowledge a keepalive probe: its queue pair, process or host is gone, or the path to it is down"
    ))
}

#[cold]
fn protocol_error() -> Error {
    Error::new(
        site!(
            "RdmaStream",
            "the peer sent a message without immediate data (not an RdmaStream peer?)"
        ),
        ErrorKind::InvalidArgument,
    )
}
