//! The one work-request id codec: what every `wr_id` the engine posts
//! says about whose request it is. Decoding never trusts it alone: a ring
//! id is checked against its queue pair's number and sequence window, an
//! SRQ id against its slot's generation.
//!
//! ```text
//!  63 62 | 61 ............ 42 | 41 ..................... 0
//!  kind  | queue pair index   | sequence number (ring)        kind 0: send ring, 1: receive ring
//!  kind  | 61 ......... 40: slot | 39 ......... 0: generation   kind 2: shared receive queue
//!  kind  | 61 .......................................... 0     kind 3: a raw post's own id
//! ```

/// Queue pairs one engine can hold (the index's 20 bits).
pub(crate) const MAX_QPS: u32 = 1 << QP_BITS;
/// Shared receive queue slots (the slot's 22 bits).
pub(crate) const MAX_SRQ_SLOTS: u32 = 1 << SLOT_BITS;
/// Ids a raw post may use: below this bound (kind 3 is added).
pub const RAW_ID_LIMIT: u64 = 1 << KIND_SHIFT;

const KIND_SHIFT: u32 = 62;
const QP_BITS: u32 = 20;
const SEQ_BITS: u32 = 42;
const SLOT_BITS: u32 = 22;
const GEN_BITS: u32 = 40;

/// The sequence bits of a ring id.
pub(crate) const SEQ_MASK: u64 = (1 << SEQ_BITS) - 1;
/// The generation bits of an SRQ id.
pub(crate) const GEN_MASK: u64 = (1 << GEN_BITS) - 1;
/// The top generation bit of an SRQ id: where `next_generation`'s carry
/// lands (always clear in an id the engine posts).
const GEN_CARRY: u64 = 1 << (GEN_BITS - 1);
/// The top slot bit of an SRQ id, flipped in the id an unposted slot
/// keeps (`srq.rs`): that id names another slot, so no completion of its
/// own matches it.
pub(crate) const UNPOSTED: u64 = 1 << (GEN_BITS + SLOT_BITS - 1);

const KIND_SEND: u64 = 0;
const KIND_RECV: u64 = 1;
const KIND_SRQ: u64 = 2;
const KIND_RAW: u64 = 3;

/// What a work-request id names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WrId {
    /// Request `seq` (its low 42 bits) of queue pair `qp`'s send (or
    /// receive) ring.
    Ring { recv: bool, qp: u32, seq: u64 },
    /// A receive in slot `slot` of the shared receive queue, posted when
    /// the slot had `generation`.
    Srq { slot: u32, generation: u64 },
    /// A raw post's own id.
    Raw(u64),
}

impl WrId {
    /// A raw post's own id (0 for the engine's own kinds).
    #[inline]
    pub(crate) const fn raw_id(self) -> u64 {
        match self {
            WrId::Raw(id) => id,
            _ => 0,
        }
    }
}

/// The id of request `seq` on queue pair `qp`'s send or receive ring.
#[inline(always)]
pub(crate) const fn ring(recv: bool, qp: u32, seq: u64) -> u64 {
    let kind = if recv { KIND_RECV } else { KIND_SEND };
    kind << KIND_SHIFT | (qp as u64) << SEQ_BITS | (seq & SEQ_MASK)
}

/// The id of a shared-receive-queue receive in `slot` at `generation`.
#[inline(always)]
pub(crate) const fn srq(slot: u32, generation: u64) -> u64 {
    KIND_SRQ << KIND_SHIFT | (slot as u64) << GEN_BITS | (generation & GEN_MASK)
}

/// The id of a raw post whose caller's id is `id` (below [`RAW_ID_LIMIT`]).
#[inline(always)]
pub(crate) const fn raw(id: u64) -> u64 {
    KIND_RAW << KIND_SHIFT | (id & (RAW_ID_LIMIT - 1))
}

/// The id of request `seq` of the ring whose ids start at `base`
/// (`ring(recv, qp, 0)`): `ring(recv, qp, seq)` with the constant part
/// computed once.
#[inline(always)]
pub(crate) const fn ring_at(base: u64, seq: u64) -> u64 {
    base | (seq & SEQ_MASK)
}

/// The sequence number `id` carries when it names a request of the ring
/// whose ids start at `base` (`ring(recv, qp, 0)`): one comparison, for
/// a caller that knows which ring it expects.
#[inline(always)]
pub(crate) const fn seq_in(id: u64, base: u64) -> Option<u64> {
    let seq = id ^ base;
    if seq <= SEQ_MASK {
        Some(seq)
    } else {
        None
    }
}

/// The slot an SRQ id's slot bits name (of any id: the caller compares
/// the whole id with the slot's).
#[inline(always)]
pub(crate) const fn srq_slot_bits(id: u64) -> u32 {
    ((id >> GEN_BITS) & (MAX_SRQ_SLOTS as u64 - 1)) as u32
}

/// The SRQ id of the same slot at the next generation. A slot's
/// generations use the low 39 of the 40 bits and wrap there: the carry
/// lands in the top one, cleared again (one add, one bit cleared), so it
/// never reaches the slot bits. Its ids start at generation 0.
#[inline(always)]
pub(crate) const fn next_generation(id: u64) -> u64 {
    id.wrapping_add(1) & !GEN_CARRY
}

/// What `id` names.
#[inline(always)]
pub(crate) const fn decode(id: u64) -> WrId {
    match id >> KIND_SHIFT {
        KIND_SEND | KIND_RECV => WrId::Ring {
            recv: id >> KIND_SHIFT == KIND_RECV,
            qp: ((id >> SEQ_BITS) & (MAX_QPS as u64 - 1)) as u32,
            seq: id & SEQ_MASK,
        },
        KIND_SRQ => WrId::Srq {
            slot: ((id >> GEN_BITS) & (MAX_SRQ_SLOTS as u64 - 1)) as u32,
            generation: id & GEN_MASK,
        },
        _ => WrId::Raw(id & (RAW_ID_LIMIT - 1)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_round_trips() {
        for recv in [false, true] {
            for qp in [0, 1, MAX_QPS - 1] {
                for seq in [0, 1, SEQ_MASK, SEQ_MASK + 5] {
                    assert_eq!(
                        decode(ring(recv, qp, seq)),
                        WrId::Ring {
                            recv,
                            qp,
                            seq: seq & SEQ_MASK
                        }
                    );
                }
            }
        }
        for slot in [0, 7, MAX_SRQ_SLOTS - 1] {
            for generation in [0, 1, GEN_MASK] {
                assert_eq!(
                    decode(srq(slot, generation)),
                    WrId::Srq { slot, generation }
                );
            }
        }
        assert_eq!(decode(raw(42)), WrId::Raw(42));
        assert_eq!(decode(raw(RAW_ID_LIMIT - 1)), WrId::Raw(RAW_ID_LIMIT - 1));
    }

    #[test]
    fn seq_in_finds_exactly_its_own_ring() {
        for (recv, qp) in [(false, 0), (true, 0), (false, 7), (true, MAX_QPS - 1)] {
            let base = ring(recv, qp, 0);
            for seq in [0, 1, SEQ_MASK] {
                assert_eq!(ring_at(base, seq), ring(recv, qp, seq));
                assert_eq!(seq_in(ring(recv, qp, seq), base), Some(seq));
                assert_eq!(seq_in(ring(!recv, qp, seq), base), None);
                assert_eq!(seq_in(ring(recv, qp ^ 1, seq), base), None);
                assert_eq!(seq_in(srq(qp, seq), base), None);
                assert_eq!(srq_slot_bits(srq(qp, seq)), qp);
                let generation = seq & (GEN_CARRY - 1);
                assert_eq!(
                    next_generation(srq(qp, generation)),
                    srq(qp, (generation + 1) & (GEN_CARRY - 1))
                );
                assert_ne!(srq_slot_bits(srq(qp, seq) ^ UNPOSTED), qp);
                assert_eq!(seq_in(raw(seq), base), None);
            }
        }
    }

    #[test]
    fn kinds_never_alias() {
        // The same low bits under each kind decode to different things.
        let ids = [ring(false, 3, 9), ring(true, 3, 9), srq(3, 9), raw(9)];
        for (i, a) in ids.iter().enumerate() {
            for b in &ids[i + 1..] {
                assert_ne!(decode(*a), decode(*b));
            }
        }
    }

    #[test]
    fn any_u64_decodes_to_something_in_range() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..10_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            match decode(x) {
                WrId::Ring { qp, seq, .. } => assert!(qp < MAX_QPS && seq <= SEQ_MASK),
                WrId::Srq { slot, generation } => {
                    assert!(slot < MAX_SRQ_SLOTS && generation <= GEN_MASK)
                }
                WrId::Raw(id) => assert!(id < RAW_ID_LIMIT),
            }
        }
    }
}
