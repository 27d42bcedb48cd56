//! librdmacm handles (cargo feature `rdmacm`): event channels and the
//! connect requests they deliver, ids, and the device contexts librdmacm
//! opened. Queue pairs created on an id are `raw::qp`'s.

mod channel;
mod devices;
mod id;

pub(crate) use channel::{CmEvent, RawCmChannel};
pub(crate) use devices::RawCmDevices;
pub(crate) use id::RawCmId;
