//! A request's scatter/gather list: up to [`MAX_SGE`] local buffers, each
//! with the range the request uses. The one representation of "a request's
//! buffers", used by sends, receives, prepared requests, the shared receive
//! queue and completions, and the one place that turns it into `ibv_sge`s.

use core::mem::{ManuallyDrop, MaybeUninit};

use crate::error::{site, Error};
use crate::memory::NicBuf;
use crate::sys;

/// Most scatter/gather entries one request carries.
pub const MAX_SGE: usize = 4;

/// A local buffer (moved in) and the part of it a request uses.
#[derive(Debug)]
pub struct Local<B> {
    pub(crate) buf: B,
    pub(crate) offset: usize,
    pub(crate) len: usize,
}

impl<B: NicBuf> Local<B> {
    /// The whole buffer.
    pub fn whole(buf: B) -> Local<B> {
        let len = buf.len();
        Local {
            buf,
            offset: 0,
            len,
        }
    }

    /// `len` bytes at `offset`; gives the buffer back if they do not fit.
    pub fn range(buf: B, offset: usize, len: usize) -> Result<Local<B>, (Error, B)> {
        match offset.checked_add(len) {
            Some(end) if end <= buf.len() => Ok(Local { buf, offset, len }),
            _ => Err((
                Error::invalid(site!(
                    "Local::range",
                    "range past the end of the local buffer"
                )),
                buf,
            )),
        }
    }

    /// The buffer back.
    pub fn into_buf(self) -> B {
        self.buf
    }
}

impl<B: NicBuf> From<B> for Local<B> {
    fn from(buf: B) -> Local<B> {
        Local::whole(buf)
    }
}

/// The entries of a list after its first (`Sgl::move_out`).
pub(crate) type Rest<B> = [Option<Local<B>>; MAX_SGE - 1];

/// Up to [`MAX_SGE`] local buffers, a prefix of the array in use.
#[derive(Debug)]
pub(crate) struct Sgl<B> {
    /// Every `Some` is below `n` (taking one out may leave a `None`
    /// below it), so a list with `n` 0 holds nothing to drop.
    items: ManuallyDrop<[Option<Local<B>>; MAX_SGE]>,
    n: u8,
}

impl<B> Drop for Sgl<B> {
    /// One test for the lists the data path empties (moved into a ring
    /// slot, handed back), rather than one per entry.
    #[inline(always)]
    fn drop(&mut self) {
        if self.n != 0 {
            // By value: the list's address never leaves its frame.
            drop_items(core::mem::take(&mut *self.items));
        }
    }
}

/// `Sgl::from_parts` of more than one buffer: by exception. Some may have
/// been taken out (a hole): the count covers the last one held.
#[cold]
fn from_many<B>(first: Option<Local<B>>, rest: Rest<B>) -> Sgl<B> {
    let [a, b, c] = rest;
    let items = [first, a, b, c];
    let n = items.iter().rposition(Option::is_some).map_or(0, |i| i + 1);
    Sgl {
        n: n as u8,
        items: ManuallyDrop::new(items),
    }
}

#[cold]
fn drop_items<B>(items: [Option<Local<B>>; MAX_SGE]) {
    drop(items);
}

impl<B> Sgl<B> {
    /// No buffers.
    #[inline(always)]
    pub(crate) const fn empty() -> Sgl<B> {
        Sgl {
            items: ManuallyDrop::new([None, None, None, None]),
            n: 0,
        }
    }

    /// One buffer.
    #[inline(always)]
    pub(crate) fn one(local: Local<B>) -> Sgl<B> {
        Sgl {
            items: ManuallyDrop::new([Some(local), None, None, None]),
            n: 1,
        }
    }

    /// Adds a buffer at the end; gives it back when the list is full.
    pub(crate) fn push(&mut self, local: Local<B>) -> Result<(), Local<B>> {
        match self.items.get_mut(usize::from(self.n)) {
            Some(slot) => {
                *slot = Some(local);
                self.n += 1;
                Ok(())
            }
            None => Err(local),
        }
    }

    /// Buffers held.
    #[inline(always)]
    pub(crate) fn len(&self) -> usize {
        usize::from(self.n)
    }

    /// Bytes the request uses, over every entry.
    #[inline(always)]
    pub(crate) fn total_len(&self) -> usize {
        match (self.n, &self.items[0]) {
            (0, _) => 0,
            (1, Some(l)) => l.len,
            _ => self.total_len_of_many(),
        }
    }

    #[cold]
    #[inline(never)]
    fn total_len_of_many(&self) -> usize {
        self.items.iter().flatten().map(|l| l.len).sum()
    }

    /// The first entry's buffer, if it is still held.
    #[inline(always)]
    pub(crate) fn first(&self) -> Option<&B> {
        self.items[0].as_ref().map(|l| &l.buf)
    }

    /// Takes the first buffer still held (most requests have exactly one).
    #[inline(always)]
    pub(crate) fn take_first(&mut self) -> Option<B> {
        if self.n == 0 {
            return None;
        }
        if self.n == 1 {
            // Its one entry is the first: the list is empty after this, and
            // its drop has nothing to look at.
            self.n = 0;
        }
        // Constant indices only, so that a completion can live in registers.
        let [a, b, c, d] = &mut *self.items;
        a.take()
            .or_else(|| b.take())
            .or_else(|| c.take())
            .or_else(|| d.take())
            .map(|l| l.buf)
    }

    /// Moves every entry into `dst` (empty), leaving this list empty; the
    /// common single buffer costs one move.
    #[inline(always)]
    pub(crate) fn move_into(&mut self, dst: &mut Sgl<B>) {
        let n = self.n;
        self.n = 0;
        dst.n = n;
        let [d0, d1, d2, d3] = &mut *dst.items;
        let [s0, s1, s2, s3] = &mut *self.items;
        if n > 0 {
            *d0 = s0.take();
            if n > 1 {
                *d1 = s1.take();
                if n > 2 {
                    *d2 = s2.take();
                    if n > 3 {
                        *d3 = s3.take();
                    }
                }
            }
        }
    }

    /// Moves the entries out, leaving the list empty: the first, and the
    /// rest only when there is more than one (the common single buffer
    /// costs one move).
    #[inline(always)]
    pub(crate) fn move_out(&mut self) -> (Option<Local<B>>, Option<Rest<B>>) {
        let n = self.n;
        self.n = 0;
        let [s0, s1, s2, s3] = &mut *self.items;
        let first = s0.take();
        if n <= 1 {
            return (first, None);
        }
        (first, Some([s1.take(), s2.take(), s3.take()]))
    }

    /// Takes the first entry out and empties the list: for a list of at
    /// most one entry (the rest, if any, taken before: `take_rest`).
    #[inline(always)]
    pub(crate) fn take_head(&mut self) -> Option<Local<B>> {
        self.n = 0;
        self.items[0].take()
    }

    /// Takes the entries after the first out (the first stays).
    #[inline(always)]
    pub(crate) fn take_rest(&mut self) -> Rest<B> {
        let [_, b, c, d] = &mut *self.items;
        [b.take(), c.take(), d.take()]
    }

    /// The list of `first` and `rest` (as `move_out` gave them).
    #[inline(always)]
    pub(crate) fn from_parts(first: Option<Local<B>>, rest: Option<Rest<B>>) -> Sgl<B> {
        match rest {
            None => Sgl {
                n: u8::from(first.is_some()),
                items: ManuallyDrop::new([first, None, None, None]),
            },
            Some(rest) => from_many(first, rest),
        }
    }

    /// True when every entry below the count still holds its buffer
    /// (none was taken out): what a list posted again must be.
    pub(crate) fn is_whole(&self) -> bool {
        self.items
            .iter()
            .take(usize::from(self.n))
            .all(Option::is_some)
    }

    /// Every buffer, in order.
    pub(crate) fn into_bufs(mut self) -> impl Iterator<Item = B> {
        self.n = 0;
        core::mem::take(&mut *self.items)
            .into_iter()
            .flatten()
            .map(|l| l.buf)
    }

    /// The buffer of entry `i`, mutably (for a prepared request's loan).
    pub(crate) fn buf_mut(&mut self, i: usize) -> Option<&mut B> {
        self.items.get_mut(i)?.as_mut().map(|l| &mut l.buf)
    }
}

impl<B: NicBuf> Sgl<B> {
    /// The scatter/gather entries of this list, refused before the device
    /// sees them when there are more than `max_sge` (what the queue was
    /// granted), one is longer than 4 GiB (an `ibv_sge` length is 32-bit),
    /// or one's range leaves its buffer. Writes the first entries of
    /// `out`, as many as it returns (a post names only those: the rest
    /// need not be written).
    /// Returns the number of entries and their total length.
    #[inline]
    pub(crate) fn build(
        &self,
        max_sge: u32,
        out: &mut [MaybeUninit<sys::ibv_sge>; MAX_SGE],
    ) -> Result<(i32, u64), Error> {
        if u32::from(self.n) > max_sge {
            return Err(too_many_sges());
        }
        // Constant indices only, no call that takes the list's address:
        // a request built and posted in one function can stay in
        // registers.
        let n = self.n;
        let items = &*self.items;
        let mut total = 0;
        if n > 0 {
            total += entry(&items[0], &mut out[0])?;
            if n > 1 {
                total += entry(&items[1], &mut out[1])?;
                if n > 2 {
                    total += entry(&items[2], &mut out[2])?;
                    if n > 3 {
                        total += entry(&items[3], &mut out[3])?;
                    }
                }
            }
        }
        Ok((i32::from(n), total))
    }
}

/// Writes the entry of `l` into `sge`: refused when its buffer was taken
/// out (a list with a hole is never posted again), longer than 4 GiB or
/// when its range leaves its buffer. Returns its length.
#[inline(always)]
fn entry<B: NicBuf>(
    l: &Option<Local<B>>,
    sge: &mut MaybeUninit<sys::ibv_sge>,
) -> Result<u64, Error> {
    let Some(l) = l else { return Err(taken()) };
    let Ok(length) = u32::try_from(l.len) else {
        return Err(too_long());
    };
    // A loan of a prepared request's buffer may have swapped in a
    // shorter one: the range must still lie inside it.
    if l.offset
        .checked_add(l.len)
        .is_none_or(|end| end > l.buf.len())
    {
        return Err(outside());
    }
    sge.write(sys::ibv_sge {
        addr: l.buf.addr() + l.offset as u64,
        length,
        lkey: l.buf.lkey(),
    });
    Ok(u64::from(length))
}

#[cold]
fn too_many_sges() -> Error {
    Error::invalid(site!(
        "post",
        "more scatter/gather entries than the queue was granted",
        "QpConfig::max_sge (and the device's max_sge) bound the entries per request"
    ))
}

#[cold]
fn outside() -> Error {
    Error::invalid(site!(
        "post",
        "a scatter/gather range past the end of its buffer (a shorter buffer swapped in?)"
    ))
}

#[cold]
fn taken() -> Error {
    Error::invalid(site!(
        "post",
        "a scatter/gather list with a buffer taken out of it"
    ))
}

#[cold]
fn too_long() -> Error {
    Error::invalid(site!(
        "post",
        "a scatter/gather entry over 4 GiB (an ibv_sge length is 32-bit)"
    ))
}

impl<B> Default for Sgl<B> {
    fn default() -> Self {
        Sgl::empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::rc::Rc;

    fn local(count: &Rc<()>) -> Local<Rc<()>> {
        Local {
            buf: count.clone(),
            offset: 0,
            len: 1,
        }
    }

    /// A list drops the buffers it still holds, wherever they sit below
    /// its count, and nothing once emptied (its drop then looks at the
    /// count only).
    #[test]
    fn a_list_drops_what_it_holds_and_nothing_once_emptied() {
        let count = Rc::new(());
        let alive = || Rc::strong_count(&count) - 1;
        let mut full = Sgl::empty();
        for _ in 0..MAX_SGE {
            assert!(full.push(local(&count)).is_ok());
        }
        assert!(full.push(local(&count)).is_err(), "no fifth entry");
        assert_eq!(alive(), MAX_SGE);
        drop(full.take_first());
        drop(full.take_first());
        assert_eq!(alive(), MAX_SGE - 2);
        drop(full);
        assert_eq!(alive(), 0);
        let mut moved = Sgl::one(local(&count));
        let mut slot = Sgl::empty();
        moved.move_into(&mut slot);
        drop(moved);
        assert_eq!(alive(), 1, "the moved list held nothing");
        let back = slot.take_first();
        drop(slot);
        assert_eq!(alive(), 1, "the buffer taken out lives on");
        drop(back);
        assert_eq!(alive(), 0);
    }

    /// A list taken apart (a one-buffer request's head, a longer one's
    /// rest) and put together again with a buffer missing still drops
    /// every buffer it holds, and says it is not whole.
    #[test]
    fn a_list_put_together_with_a_hole_drops_what_it_holds() {
        let count = Rc::new(());
        let alive = || Rc::strong_count(&count) - 1;
        let mut list = Sgl::empty();
        for _ in 0..3 {
            assert!(list.push(local(&count)).is_ok());
        }
        let mut rest = list.take_rest();
        let head = list.take_head();
        assert_eq!(list.len(), 0);
        drop(list);
        assert_eq!(alive(), 3, "taken apart, nothing dropped");
        let taken = rest[0].take();
        let again = Sgl::from_parts(head, Some(rest));
        assert!(!again.is_whole(), "a buffer is missing");
        drop(again);
        assert_eq!(alive(), 1, "both buffers it held were dropped");
        drop(taken);
        let mut one = Sgl::one(local(&count));
        let (first, rest) = one.move_out();
        assert!(rest.is_none());
        let again = Sgl::from_parts(first, None);
        assert!(again.is_whole() && again.len() == 1);
        drop(again);
        assert_eq!(alive(), 0);
    }
}
