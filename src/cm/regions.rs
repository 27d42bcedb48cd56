//! Memory descriptors in a connection's private data.

use alloc::vec::Vec;

use crate::endpoint::RemoteRegion;
use crate::error::{site, Error};

/// Encodes up to 2 (connect) or 9 (accept) memory descriptors as private
/// data: a count byte, then per region addr (8), len (8), rkey (4), big-endian.
pub fn encode_regions(regions: &[RemoteRegion]) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + 20 * regions.len());
    out.push(regions.len() as u8);
    for r in regions {
        out.extend_from_slice(&r.addr.to_be_bytes());
        out.extend_from_slice(&r.len.to_be_bytes());
        out.extend_from_slice(&r.rkey.to_be_bytes());
    }
    out
}

/// Decodes [`encode_regions`]; trailing bytes (the transport pads private
/// data) are ignored, a short or overflowing record is an error.
pub fn decode_regions(data: &[u8]) -> Result<Vec<RemoteRegion>, Error> {
    let bad = || Error::invalid(site!("decode private data", "not a region list"));
    let (&count, rest) = data.split_first().ok_or_else(bad)?;
    let count = usize::from(count);
    if rest.len() < count * 20 {
        return Err(bad());
    }
    let regions: Vec<RemoteRegion> = rest
        .chunks_exact(20)
        .take(count)
        .map(|c| RemoteRegion {
            addr: u64::from_be_bytes(c[0..8].try_into().unwrap_or_default()),
            len: u64::from_be_bytes(c[8..16].try_into().unwrap_or_default()),
            rkey: u32::from_be_bytes(c[16..20].try_into().unwrap_or_default()),
        })
        .collect();
    if regions.iter().any(|r| r.end().is_none()) {
        return Err(bad());
    }
    Ok(regions)
}
