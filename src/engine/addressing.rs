//! What a new queue pair is set up from: the device's limits, the port's
//! attributes and the GID chosen on it. Read once and kept for a second:
//! a burst of `add_qp` calls then queries the device once rather than
//! four times per queue pair (the GID table alone was most of a queue
//! pair's set-up time under emulation), and a change of the port (a GID
//! added or removed, a port going down) reaches the queue pairs created a
//! second later.

use core::time::Duration;

use crate::device::{GidEntry, PortAttr};
use crate::time::Deadline;

/// How long a reading is used for new queue pairs.
const FRESH: Duration = Duration::from_secs(1);

#[derive(Clone, Copy)]
pub(crate) struct Addressing {
    /// The `QpConfig::port` and `QpConfig::gid_index` it was read for.
    port_num: u8,
    gid_index: Option<u32>,
    pub(crate) port: PortAttr,
    pub(crate) gid: Option<GidEntry>,
    pub(crate) max_qp_wr: u32,
    pub(crate) max_qp_init_rd_atom: u8,
    pub(crate) max_qp_rd_atom: u8,
    fresh_until: Deadline,
}

impl Addressing {
    pub(crate) fn new(
        port_num: u8,
        gid_index: Option<u32>,
        port: PortAttr,
        gid: Option<GidEntry>,
        limits: (u32, u8, u8),
    ) -> Addressing {
        Addressing {
            port_num,
            gid_index,
            port,
            gid,
            max_qp_wr: limits.0,
            max_qp_init_rd_atom: limits.1,
            max_qp_rd_atom: limits.2,
            fresh_until: Deadline::after(FRESH),
        }
    }

    /// True when it was read for this port and GID choice, recently enough.
    pub(crate) fn serves(&self, port_num: u8, gid_index: Option<u32>) -> bool {
        self.port_num == port_num && self.gid_index == gid_index && !self.fresh_until.passed()
    }
}
