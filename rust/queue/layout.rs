//! Where everything of a queue lives in its words, how the cursor word is packed, and how a
//! row is stored (see the design in `queue.rs`).
//!
//! ```text
//! word  0        magic "SVQUEUE3"          (written last by `create`: attach checks it)
//!       1..3     action_dim, capacity, rtc
//!       4        producer lock             (producers only)
//!       5        write_end                 (ring position after the newest written row)
//!       6        write_head                (announced before rows are written: torn-read check)
//!       8..12    merges, rejected, delay mismatches, actions consumed, superseded reads
//!      16        cursor                    (its own 128-byte line: the consumer's hot word)
//!      32..63    4 descriptors × 8 words   (base, len, merged, plan kind, plan a, b, c)
//!      64..      ring of 2 × capacity rows (original, processed, provenance and step)
//! ```

use super::Provenance;

/// "SVQUEUE3", little-endian: the layout version is part of the magic.
pub(super) const MAGIC: u64 = u64::from_le_bytes(*b"SVQUEUE3");

pub(super) const MAGIC_WORD: usize = 0;
pub(super) const DIM: usize = 1;
pub(super) const CAPACITY: usize = 2;
pub(super) const RTC: usize = 3;
pub(super) const LOCK: usize = 4;
pub(super) const WRITE_END: usize = 5;
pub(super) const WRITE_HEAD: usize = 6;
pub(super) const MERGES: usize = 8;
pub(super) const REJECTED: usize = 9;
pub(super) const MISMATCHES: usize = 10;
pub(super) const CONSUMED: usize = 11;
pub(super) const SUPERSEDED: usize = 12;
pub(super) const CURSOR: usize = 16;
const DESCRIPTOR_AT: usize = 32;
const DESCRIPTOR_WORDS: usize = 8;
/// Descriptor slots; generation `g` uses slot `g % DESCRIPTORS` (at least 2 are needed).
pub(super) const DESCRIPTORS: u64 = 4;
const ROWS_AT: usize = 64;

// Descriptor fields.
pub(super) const D_BASE: usize = 0;
pub(super) const D_LEN: usize = 1;
pub(super) const D_MERGED: usize = 2;
pub(super) const D_PLAN: usize = 3;

/// The cursor's "replaced by the successor generation" bit.
pub(super) const SEALED: u64 = 1 << 63;
/// The cursor's "cleared: nothing left, no leftovers" bit.
pub(super) const CLEARED: u64 = 1 << 62;
const FIELD_BITS: u32 = 24;
const FIELD_MASK: u64 = (1 << FIELD_BITS) - 1;
const GEN_SHIFT: u32 = 2 * FIELD_BITS;
const GEN_MASK: u64 = (1 << 14) - 1;
/// Largest capacity: `start` and `index` are 24-bit fields of the cursor.
pub const MAX_CAPACITY: usize = FIELD_MASK as usize;

/// The cursor: generation (14 bits), start row and consumer index (24 bits each), flags.
pub(super) fn pack(generation: u64, start: u64, index: u64) -> u64 {
    ((generation & GEN_MASK) << GEN_SHIFT)
        | ((start & FIELD_MASK) << FIELD_BITS)
        | (index & FIELD_MASK)
}

pub(super) fn generation(word: u64) -> u64 {
    (word >> GEN_SHIFT) & GEN_MASK
}

pub(super) fn next_generation(word: u64) -> u64 {
    (generation(word) + 1) & GEN_MASK
}

pub(super) fn start(word: u64) -> u64 {
    (word >> FIELD_BITS) & FIELD_MASK
}

/// Actions taken from this generation, a clear included (it keeps the index: `position`).
pub(super) fn index(word: u64) -> u64 {
    word & FIELD_MASK
}

/// Actions taken since the last merge or clear (LeRobot's `last_index`: a clear resets it).
pub(super) fn taken(word: u64) -> u64 {
    if cleared(word) {
        0
    } else {
        index(word)
    }
}

pub(super) fn sealed(word: u64) -> bool {
    word & SEALED != 0
}

pub(super) fn cleared(word: u64) -> bool {
    word & CLEARED != 0
}

/// Words per provenance: session id (2), seq, episode, observation time, present flag, step.
const PROVENANCE_WORDS: usize = 7;

/// Sizes of one queue's words.
#[derive(Clone, Copy, Debug)]
pub(super) struct Layout {
    pub(super) dim: usize,
    pub(super) capacity: usize,
    /// Ring rows: twice the capacity, so a merge never overwrites a row that is still queued.
    pub(super) ring_rows: u64,
    /// Words per action (two f32 per word).
    half: usize,
    row_words: usize,
}

impl Layout {
    pub(super) fn new(dim: usize, capacity: usize) -> Self {
        let half = dim.div_ceil(2);
        Self {
            dim,
            capacity,
            ring_rows: 2 * capacity as u64,
            half,
            row_words: 2 * half + PROVENANCE_WORDS,
        }
    }

    pub(super) fn total_words(&self) -> usize {
        ROWS_AT + self.ring_rows as usize * self.row_words
    }

    pub(super) fn descriptor(&self, generation: u64) -> usize {
        DESCRIPTOR_AT + (generation % DESCRIPTORS) as usize * DESCRIPTOR_WORDS
    }

    /// First word of the row at ring position `pos` (an absolute, ever-growing position).
    pub(super) fn row(&self, pos: u64) -> usize {
        ROWS_AT + (pos % self.ring_rows) as usize * self.row_words
    }

    /// Words of a row's original values, processed values, provenance.
    pub(super) fn parts(&self, row: usize) -> (usize, usize, usize) {
        (row, row + self.half, row + 2 * self.half)
    }
}

/// Packs `values` two per word (low half first).
pub(super) fn pack_values(values: &[f32], mut put: impl FnMut(usize, u64)) {
    for (i, pair) in values.chunks(2).enumerate() {
        let low = u64::from(pair[0].to_bits());
        let high = pair.get(1).map_or(0, |v| u64::from(v.to_bits()));
        put(i, low | (high << 32));
    }
}

/// Unpacks `out.len()` values from words given by `get`.
pub(super) fn unpack_values(out: &mut [f32], mut get: impl FnMut(usize) -> u64) {
    for (i, pair) in out.chunks_mut(2).enumerate() {
        let word = get(i);
        pair[0] = f32::from_bits(word as u32);
        if let Some(high) = pair.get_mut(1) {
            *high = f32::from_bits((word >> 32) as u32);
        }
    }
}

pub(super) fn provenance_words(provenance: Option<Provenance>) -> [u64; PROVENANCE_WORDS] {
    match provenance {
        None => [0; PROVENANCE_WORDS],
        Some(p) => {
            let (low, high) = p.session_id.split_at(8);
            [
                u64::from_le_bytes(low.try_into().expect("8 bytes")),
                u64::from_le_bytes(high.try_into().expect("8 bytes")),
                p.seq_id,
                p.episode_id,
                p.obs_mono_ns as u64,
                1,
                p.step,
            ]
        }
    }
}

pub(super) fn provenance_from(words: [u64; PROVENANCE_WORDS]) -> Option<Provenance> {
    (words[5] == 1).then(|| {
        let mut session_id = [0u8; 16];
        session_id[..8].copy_from_slice(&words[0].to_le_bytes());
        session_id[8..].copy_from_slice(&words[1].to_le_bytes());
        Provenance {
            session_id,
            seq_id: words[2],
            episode_id: words[3],
            obs_mono_ns: words[4] as i64,
            step: words[6],
        }
    })
}

pub(super) const PROVENANCE_LEN: usize = PROVENANCE_WORDS;
