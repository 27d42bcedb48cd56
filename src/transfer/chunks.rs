//! The transfer's chunks: where each one is (waiting, in flight on a
//! path, done on a plane) and which wait to be posted, in order. Sized
//! once; nothing here allocates after [`ChunkTable::new`].

use alloc::collections::VecDeque;
use alloc::vec::Vec;

/// Where one chunk is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChunkState {
    /// Not posted, or posted and lost with a failed path: in the queue.
    Waiting,
    /// Posted on this path; its completion has not come back.
    InFlight(u16),
    /// Completed successfully through a path of this plane: its bytes are
    /// in that plane's buffer (a read) or the peer's region of that plane
    /// (a write).
    Done(u16),
}

/// Every chunk's state and the queue of those waiting.
#[derive(Debug)]
pub struct ChunkTable {
    state: Vec<ChunkState>,
    /// Posts of each chunk so far: more than one means it was re-sprayed.
    posts: Vec<u16>,
    /// The path whose post of each chunk completed it.
    by: Vec<u16>,
    waiting: VecDeque<u32>,
    done: usize,
}

impl ChunkTable {
    /// `count` chunks, all waiting, in order.
    pub fn new(count: usize) -> ChunkTable {
        let mut waiting = VecDeque::with_capacity(count);
        waiting.extend(0..count as u32);
        ChunkTable {
            state: alloc::vec![ChunkState::Waiting; count],
            posts: alloc::vec![0; count],
            by: alloc::vec![0; count],
            waiting,
            done: 0,
        }
    }

    /// How many chunks.
    pub fn len(&self) -> usize {
        self.state.len()
    }

    /// True for a transfer of nothing.
    pub fn is_empty(&self) -> bool {
        self.state.is_empty()
    }

    /// Chunks done.
    pub fn done(&self) -> usize {
        self.done
    }

    /// True when every chunk is done.
    pub fn all_done(&self) -> bool {
        self.done == self.state.len()
    }

    /// Chunks waiting to be posted.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Chunk `c`'s state.
    pub fn state(&self, c: usize) -> ChunkState {
        self.state[c]
    }

    /// The next chunk to post (a re-queued one first).
    pub fn next_waiting(&mut self) -> Option<usize> {
        self.waiting.pop_front().map(|c| c as usize)
    }

    /// Puts back a chunk taken by [`ChunkTable::next_waiting`] but not
    /// posted after all, at the front.
    pub fn put_back(&mut self, c: usize) {
        // Never beyond capacity: each chunk is in the queue at most once.
        self.waiting.push_front(c as u32);
    }

    /// Chunk `c` was posted on `path`; true when it had been posted before
    /// (a re-spray).
    pub fn posted(&mut self, c: usize, path: u16) -> bool {
        self.state[c] = ChunkState::InFlight(path);
        self.posts[c] = self.posts[c].saturating_add(1);
        self.posts[c] > 1
    }

    /// Chunk `c` completed through a path of `plane`. A completion that
    /// does not match the chunk's state (a duplicate) changes nothing;
    /// returns whether it counted.
    pub fn completed(&mut self, c: usize, path: u16, plane: u16) -> bool {
        if self.state.get(c) != Some(&ChunkState::InFlight(path)) {
            return false;
        }
        self.state[c] = ChunkState::Done(plane);
        self.by[c] = path;
        self.done += 1;
        true
    }

    /// Chunk `c`'s post on `path` failed or was flushed: it waits again,
    /// at the front, so the bytes a failure held up go out first. Returns
    /// whether it counted (as in [`ChunkTable::completed`]).
    pub fn lost(&mut self, c: usize, path: u16) -> bool {
        if self.state.get(c) != Some(&ChunkState::InFlight(path)) {
            return false;
        }
        self.state[c] = ChunkState::Waiting;
        self.waiting.push_front(c as u32);
        true
    }

    /// Done chunk `c` waits again, at the back (an end-to-end check found
    /// its bytes wrong). Returns whether it was done.
    pub fn redo(&mut self, c: usize) -> bool {
        if !matches!(self.state.get(c), Some(ChunkState::Done(_))) {
            return false;
        }
        self.state[c] = ChunkState::Waiting;
        self.done -= 1;
        self.waiting.push_back(c as u32);
        true
    }

    /// The plane whose memory holds chunk `c`'s final bytes, once done.
    pub fn placement(&self, c: usize) -> Option<u16> {
        match self.state.get(c) {
            Some(ChunkState::Done(plane)) => Some(*plane),
            _ => None,
        }
    }

    /// The path that completed chunk `c`, once done.
    pub fn done_by(&self, c: usize) -> Option<u16> {
        self.placement(c).map(|_| self.by[c])
    }

    /// How often chunk `c` was posted.
    pub fn posts(&self, c: usize) -> u16 {
        self.posts[c]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_chunk_goes_out_first_and_counts_as_a_respray() {
        let mut t = ChunkTable::new(3);
        let a = t.next_waiting().unwrap();
        let b = t.next_waiting().unwrap();
        assert!(!t.posted(a, 0));
        assert!(!t.posted(b, 1));
        assert!(t.lost(b, 1));
        assert_eq!(t.next_waiting(), Some(b));
        assert!(t.posted(b, 0));
        assert!(t.completed(b, 0, 0));
        assert!(t.completed(a, 0, 0));
        assert_eq!(t.next_waiting(), Some(2));
        assert!(!t.posted(2, 1));
        assert!(t.completed(2, 1, 1));
        assert!(t.all_done());
        assert_eq!(
            (t.placement(0), t.placement(1), t.placement(2)),
            (Some(0), Some(0), Some(1))
        );
        assert_eq!(t.posts(b), 2);
        assert_eq!((t.done_by(1), t.done_by(2)), (Some(0), Some(1)));
    }

    #[test]
    fn stale_and_duplicate_completions_count_nothing() {
        let mut t = ChunkTable::new(2);
        let c = t.next_waiting().unwrap();
        t.posted(c, 4);
        assert!(!t.completed(c, 5, 1), "another path's");
        assert!(t.completed(c, 4, 2));
        assert!(!t.completed(c, 4, 2), "twice");
        assert!(!t.lost(c, 4), "a done chunk is never lost");
        assert!(!t.completed(7, 0, 0), "out of range");
        assert_eq!(t.done(), 1);
        assert_eq!(t.waiting(), 1);
    }

    #[test]
    fn a_redone_chunk_waits_again_and_only_a_done_one() {
        let mut t = ChunkTable::new(2);
        let c = t.next_waiting().unwrap();
        t.posted(c, 0);
        assert!(!t.redo(c), "in flight: not done yet");
        assert!(t.completed(c, 0, 1));
        assert!(t.redo(c));
        assert_eq!((t.done(), t.waiting(), t.placement(c)), (0, 2, None));
        assert_eq!(t.next_waiting(), Some(1));
        assert_eq!(t.next_waiting(), Some(c));
        assert!(t.posted(c, 1), "a second post");
    }
}
