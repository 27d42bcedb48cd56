//! Reading a message's fields in order, each big-endian.

use super::error::WireError;

/// Bounds-checked big-endian reads: a short input is an error, never a panic.
pub(super) struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(super) fn new(buf: &'a [u8]) -> Self {
        Reader { buf }
    }

    pub(super) fn bytes<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        self.take(N).map(|head| {
            let mut out = [0u8; N];
            out.copy_from_slice(head);
            out
        })
    }

    pub(super) fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if n > self.buf.len() {
            return Err(WireError::Truncated {
                needed: n,
                got: self.buf.len(),
            });
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    pub(super) fn u16(&mut self) -> Result<u16, WireError> {
        self.bytes().map(u16::from_be_bytes)
    }

    pub(super) fn u32(&mut self) -> Result<u32, WireError> {
        self.bytes().map(u32::from_be_bytes)
    }

    pub(super) fn u64(&mut self) -> Result<u64, WireError> {
        self.bytes().map(u64::from_be_bytes)
    }
}
