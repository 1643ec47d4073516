//! The action chunk buffer between the inference side and the control loop (no pyo3 here).
//!
//! Semantics follow LeRobot's RTC `ActionQueue`: `merge` either replaces the queue with the
//! new chunk minus the steps that went by during inference (RTC) or appends the new chunk
//! behind the unconsumed actions (non-RTC); `get` hands out one action per control tick.
//!
//! # Memory
//!
//! A queue is a fixed block of `AtomicU64` words (see `layout.rs`) in a [`Memory`]: private
//! heap memory, or a shared mapping that the edge's control process maps too (producer = the
//! inference side in the edge's main process, consumer = the control loop in its own process).
//! Nothing in the block is a pointer, everything is read and written with atomics, and nothing
//! in it is ever waited on by the consumer: a producer process that is stopped, swapped out or
//! killed in the middle of a merge cannot stall a `get`.
//!
//! # Design
//!
//! Rows live in a ring of `2 × capacity` rows addressed by ever-growing positions. A
//! *generation* is a run of ring rows described by a descriptor (`base`, `len`, `merged`, the
//! [`Plan`] its start is derived from); four descriptor slots are reused round robin. The
//! single *cursor* word names the live generation and holds its start row, the consumer index
//! (LeRobot's `last_index`) and two flags, `SEALED` and `CLEARED`.
//!
//! * Consumer `get`: load the cursor; CAS `index → index + 1` while rows remain; then copy the
//!   row. A sealed cursor has a successor whose descriptor was written *before* the seal, so
//!   the consumer installs the successor itself (the same CAS the producer would do, with the
//!   same deterministic start) instead of waiting for the producer to do it.
//! * Producer `merge` (producers serialise on a lock word the consumer never touches): write
//!   the new rows after the newest ones (append mode keeps the unconsumed rows where they are:
//!   the successor simply starts at the first of them), write the successor's descriptor, then
//!   seal with `fetch_or(SEALED)`. That atomic RMW returns the exact index `s1` the consumer
//!   reached in the old generation: it is the merge's linearization point. The successor's
//!   start follows from `s1` (append: skip the rows consumed since the producer looked; RTC:
//!   the delay resolved against `s1` and `idx_before`), then the successor is installed.
//! * `clear` (any side, no lock): CAS the live cursor to `CLEARED` with index 0. A merge whose
//!   seal finds `CLEARED` keeps none of the old rows and resolves the delay from index 0, exactly
//!   as if it had come after the clear. `discard_chunk` is the same CAS, done only while the
//!   next action still belongs to a given chunk (the staleness bound's "drop the rest").
//!
//! Why readers never see torn data: the ring is twice the capacity, so a merge never overwrites
//! a row that is still queued; it only overwrites rows older than the live ones. A reader that
//! copied a row checks `write_head` (announced, with a release fence, before rows are written)
//! afterwards: if it passed the row's position plus the ring size, the row may have been
//! overwritten and the read is redone (`get` then takes the current action; this needs two
//! merges during one copy and is counted in `superseded_reads`). Descriptor reads are validated
//! by the cursor: a slot is rewritten only after the cursor moved three generations on, which
//! the consumer's CAS (every cursor write is an RMW, so a successful CAS orders the reads before
//! any later rewrite) or a reader's re-check of the generation detects.
//!
//! Progress: `get`, `qsize`, `clear` and the other consumer-side calls never wait on anything;
//! they retry only when another party completed a step in between (a merge sealed or installed,
//! another consumer took an action), so with one producer a `get` finishes within a few
//! iterations per merge that completes during it. In append mode no action is lost or handed
//! out twice, and the index only moves forward between merges.

use std::fmt;
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use crate::shm::{Memory, WORD};

mod error;
mod layout;
mod plan;

pub use error::QueueError;
pub use layout::MAX_CAPACITY;
use layout::{
    cleared, generation, index, next_generation, pack, pack_values, provenance_from,
    provenance_words, sealed, start, unpack_values, Layout, CAPACITY, CLEARED, CONSUMED, CURSOR,
    DIM, D_BASE, D_LEN, D_MERGED, D_PLAN, LOCK, MAGIC, MAGIC_WORD, MERGES, MISMATCHES,
    PROVENANCE_LEN, REJECTED, RTC, SEALED, SUPERSEDED, WRITE_END, WRITE_HEAD,
};
use plan::Plan;
pub use plan::{resolve_delay, DelayResolution};

/// Largest accepted action dimension.
pub const MAX_ACTION_DIM: usize = 1 << 16;

/// Where an action chunk comes from; every action of a merged chunk carries its chunk's one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Provenance {
    /// Session the chunk was produced for (the wire's 16-byte session id).
    pub session_id: [u8; 16],
    /// Sequence number of the request the chunk answers.
    pub seq_id: u64,
    /// Episode the chunk belongs to.
    pub episode_id: u64,
    /// Monotonic time (ns) at which the answered observation was taken.
    pub obs_mono_ns: i64,
}

/// A borrowed row-major `(rows, cols)` block of `f32`.
#[derive(Clone, Copy, Debug)]
pub struct ChunkRef<'a> {
    /// Row-major values, `rows * cols` of them.
    pub data: &'a [f32],
    /// Number of time steps `T`.
    pub rows: usize,
    /// Action dimension.
    pub cols: usize,
}

/// Counters for [`ActionQueue::statistics`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Accepted merges since creation.
    pub merges: u64,
    /// Rejected merges since creation.
    pub rejected_merges: u64,
    /// Merges whose `idx_before` disagreed with `real_delay`.
    pub delay_mismatches: u64,
    /// Actions handed out by `get` since creation.
    pub actions_consumed: u64,
    /// Gets whose claimed row two later merges replaced during the copy (retried).
    pub superseded_reads: u64,
    /// Actions left at the time of the snapshot.
    pub qsize: usize,
    /// Consumer index at the time of the snapshot.
    pub action_index: u64,
}

/// Leftover rows copied out of the queue.
#[derive(Clone, Debug, PartialEq)]
pub struct LeftOver {
    /// Row-major values, `rows * action_dim` of them.
    pub values: Vec<f32>,
    /// Number of rows.
    pub rows: usize,
}

/// The live generation as of one cursor value.
#[derive(Clone, Copy, Debug)]
struct Live {
    word: u64,
    base: u64,
    len: u64,
    merged: bool,
}

impl Live {
    /// Ring position and row of the next action, if one is left.
    fn head(&self) -> Option<u64> {
        let row = start(self.word) + index(self.word);
        (!cleared(self.word) && row < self.len).then_some(self.base + row)
    }

    fn remaining(&self) -> u64 {
        if cleared(self.word) {
            0
        } else {
            self.len.saturating_sub(start(self.word) + index(self.word))
        }
    }
}

/// A merge between writing its rows and sealing (split so tests can interleave the steps).
#[derive(Clone, Copy, Debug)]
struct Prepared {
    rtc: bool,
    rows: u64,
    real_delay: i64,
    idx_before: Option<i64>,
}

/// Lock-free (for the consumer) action chunk queue; see the module docs for the design.
pub struct ActionQueue {
    memory: Arc<Memory>,
    first: usize,
    layout: Layout,
}

impl fmt::Debug for ActionQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ActionQueue")
            .field("action_dim", &self.layout.dim)
            .field("rtc", &self.rtc())
            .field("capacity", &self.layout.capacity)
            .field("qsize", &self.qsize())
            .field("action_index", &self.action_index())
            .finish()
    }
}

/// Releases the producer lock word on drop.
struct ProducerGuard<'a>(&'a AtomicU64);

impl Drop for ProducerGuard<'_> {
    fn drop(&mut self) {
        self.0.store(0, Ordering::Release);
    }
}

fn checked_layout(action_dim: usize, capacity: usize) -> Result<Layout, QueueError> {
    if action_dim == 0 {
        return Err(QueueError::Config(
            "action_dim is 0, expected action_dim >= 1".to_owned(),
        ));
    }
    if action_dim > MAX_ACTION_DIM {
        return Err(QueueError::Config(format!(
            "action_dim is {action_dim}, expected action_dim <= {MAX_ACTION_DIM}"
        )));
    }
    if capacity == 0 || capacity > MAX_CAPACITY {
        return Err(QueueError::Config(format!(
            "capacity is {capacity}, expected 1 <= capacity <= {MAX_CAPACITY}"
        )));
    }
    Ok(Layout::new(action_dim, capacity))
}

impl ActionQueue {
    /// Bytes a queue of `action_dim`-wide actions holding `capacity` rows occupies.
    pub fn size_bytes(action_dim: usize, capacity: usize) -> Result<usize, QueueError> {
        Ok(checked_layout(action_dim, capacity)?.total_words() * WORD)
    }

    /// An empty queue in private memory.
    pub fn new(action_dim: usize, rtc: bool, capacity: usize) -> Result<Self, QueueError> {
        let size = Self::size_bytes(action_dim, capacity)?;
        Self::create(
            Arc::new(Memory::private(size)),
            0,
            action_dim,
            rtc,
            capacity,
        )
    }

    /// An empty queue written into `memory` at byte `offset` (other processes `attach` it).
    pub fn create(
        memory: Arc<Memory>,
        offset: usize,
        action_dim: usize,
        rtc: bool,
        capacity: usize,
    ) -> Result<Self, QueueError> {
        let layout = checked_layout(action_dim, capacity)?;
        let words = memory
            .words(offset, layout.total_words())
            .map_err(|e| QueueError::Config(e.to_string()))?;
        // All zero is the empty initial state: generation 0, descriptor 0 of length 0.
        for word in words {
            word.store(0, Ordering::Relaxed);
        }
        words[DIM].store(action_dim as u64, Ordering::Relaxed);
        words[CAPACITY].store(capacity as u64, Ordering::Relaxed);
        words[RTC].store(u64::from(rtc), Ordering::Relaxed);
        // Last, with release: an `attach` that sees the magic sees a complete, empty queue.
        words[MAGIC_WORD].store(MAGIC, Ordering::Release);
        Ok(Self {
            memory,
            first: offset / WORD,
            layout,
        })
    }

    /// The queue another handle created in `memory` at byte `offset`.
    pub fn attach(memory: Arc<Memory>, offset: usize) -> Result<Self, QueueError> {
        let header = memory
            .words(offset, CAPACITY + 1)
            .map_err(|e| QueueError::Config(e.to_string()))?;
        if header[MAGIC_WORD].load(Ordering::Acquire) != MAGIC {
            return Err(QueueError::Config(format!(
                "no action queue at offset {offset} of the shared memory (bad magic)"
            )));
        }
        let dim = usize::try_from(header[DIM].load(Ordering::Relaxed)).unwrap_or(0);
        let capacity = usize::try_from(header[CAPACITY].load(Ordering::Relaxed)).unwrap_or(0);
        let layout = checked_layout(dim, capacity)?;
        memory
            .words(offset, layout.total_words())
            .map_err(|e| QueueError::Config(e.to_string()))?;
        Ok(Self {
            memory,
            first: offset / WORD,
            layout,
        })
    }

    fn words(&self) -> &[AtomicU64] {
        &self.memory.all()[self.first..self.first + self.layout.total_words()]
    }

    /// The memory the queue lives in.
    pub fn memory(&self) -> &Arc<Memory> {
        &self.memory
    }

    /// Width of one action.
    pub fn action_dim(&self) -> usize {
        self.layout.dim
    }

    /// Whether merges replace the queue (RTC) rather than append.
    pub fn rtc(&self) -> bool {
        self.words()[RTC].load(Ordering::Relaxed) != 0
    }

    /// Switches between replace (RTC) and append merging; takes effect from the next merge.
    pub fn set_rtc(&self, rtc: bool) {
        let words = self.words();
        let _producers = self.lock_producers(words);
        words[RTC].store(u64::from(rtc), Ordering::Relaxed);
    }

    /// Maximum number of rows the queue may hold.
    pub fn capacity(&self) -> usize {
        self.layout.capacity
    }

    fn lock_producers<'a>(&self, words: &'a [AtomicU64]) -> ProducerGuard<'a> {
        let lock = &words[LOCK];
        let mut attempt = 0u32;
        while lock
            .compare_exchange_weak(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            // Producers hold the lock for one merge's copy; spin briefly, then give the CPU up.
            attempt = attempt.saturating_add(1);
            if attempt < 64 {
                std::hint::spin_loop();
            } else if attempt < 1_000 {
                thread::yield_now();
            } else {
                thread::sleep(Duration::from_micros(50));
            }
        }
        ProducerGuard(lock)
    }

    /// Counts a merge rejected before reaching [`ActionQueue::merge`] (e.g. a wrong dtype).
    pub fn note_rejected(&self) {
        self.words()[REJECTED].fetch_add(1, Ordering::Relaxed);
    }

    fn validate(
        &self,
        original: &ChunkRef<'_>,
        processed: &ChunkRef<'_>,
    ) -> Result<(), QueueError> {
        let dim = self.layout.dim;
        for (name, chunk) in [("original", original), ("processed", processed)] {
            if chunk.cols != dim {
                return Err(QueueError::Shape {
                    name,
                    rows: chunk.rows,
                    cols: chunk.cols,
                    expected_cols: dim,
                });
            }
            if chunk.rows == 0 {
                return Err(QueueError::Empty {
                    name,
                    cols: chunk.cols,
                });
            }
            if chunk.rows.checked_mul(chunk.cols) != Some(chunk.data.len()) {
                return Err(QueueError::BufferLength {
                    name,
                    len: chunk.data.len(),
                    rows: chunk.rows,
                    cols: chunk.cols,
                });
            }
        }
        if original.rows != processed.rows {
            return Err(QueueError::RowMismatch {
                original_rows: original.rows,
                processed_rows: processed.rows,
            });
        }
        Ok(())
    }

    /// Merges a chunk; returns the number of leading steps trimmed (always 0 in append mode).
    ///
    /// `real_delay < 0` counts as 0. With `idx_before`, the delay is reconciled against the
    /// actions consumed since that index (see [`resolve_delay`]). On error nothing changes.
    pub fn merge(
        &self,
        original: ChunkRef<'_>,
        processed: ChunkRef<'_>,
        real_delay: i64,
        idx_before: Option<i64>,
        provenance: Option<Provenance>,
    ) -> Result<usize, QueueError> {
        let words = self.words();
        let _producers = self.lock_producers(words);
        let result = self
            .validate(&original, &processed)
            .and_then(|()| {
                self.prepare(
                    words, original, processed, real_delay, idx_before, provenance,
                )
            })
            .map(|prepared| {
                let sealed_word = self.seal(words);
                self.install(words, sealed_word);
                self.finish(words, prepared, sealed_word)
            });
        if result.is_err() {
            self.note_rejected();
        }
        result
    }

    /// Writes the chunk's rows and the successor's descriptor (producer lock held).
    fn prepare(
        &self,
        words: &[AtomicU64],
        original: ChunkRef<'_>,
        processed: ChunkRef<'_>,
        real_delay: i64,
        idx_before: Option<i64>,
        provenance: Option<Provenance>,
    ) -> Result<Prepared, QueueError> {
        let layout = &self.layout;
        let seen = words[CURSOR].load(Ordering::Acquire);
        debug_assert!(!sealed(seen), "sealed cursor under the producer lock");
        let rtc = words[RTC].load(Ordering::Relaxed) != 0;
        let end = words[WRITE_END].load(Ordering::Relaxed);
        let rows = original.rows as u64;
        let (base, kept, plan) = if rtc {
            if original.rows > layout.capacity {
                return Err(QueueError::ChunkCapacity {
                    rows: original.rows,
                    capacity: layout.capacity,
                });
            }
            let plan = Plan::Trim {
                real_delay,
                idx_before,
            };
            (end, 0, plan)
        } else {
            let d = layout.descriptor(generation(seen));
            let merged = words[d + D_MERGED].load(Ordering::Relaxed) != 0;
            let (base, kept) = if cleared(seen) || !merged {
                (end, 0)
            } else {
                // Only producers write descriptors and the live one ends at `end`.
                let row = start(seen) + index(seen);
                let len = words[d + D_LEN].load(Ordering::Relaxed);
                (
                    words[d + D_BASE].load(Ordering::Relaxed) + row,
                    len.saturating_sub(row),
                )
            };
            if kept as usize + original.rows > layout.capacity {
                return Err(QueueError::Capacity {
                    queued: kept as usize,
                    incoming: original.rows,
                    capacity: layout.capacity,
                });
            }
            let plan = Plan::Skip {
                seen: index(seen),
                kept,
            };
            (base, kept, plan)
        };
        debug_assert_eq!(base + kept, end, "the live generation ends at write_end");
        // Announce the ring positions about to be overwritten, then (after the fence, which
        // also orders the cursor load above before every write below) write them.
        words[WRITE_HEAD].store(end + rows, Ordering::Relaxed);
        fence(Ordering::Release);
        let provenance = provenance_words(provenance);
        let dim = layout.dim;
        for r in 0..original.rows {
            let (orig, proc, prov) = layout.parts(layout.row(end + r as u64));
            let values = r * dim..(r + 1) * dim;
            pack_values(&original.data[values.clone()], |i, v| {
                words[orig + i].store(v, Ordering::Relaxed)
            });
            pack_values(&processed.data[values], |i, v| {
                words[proc + i].store(v, Ordering::Relaxed)
            });
            for (i, v) in provenance.iter().enumerate() {
                words[prov + i].store(*v, Ordering::Relaxed);
            }
        }
        words[WRITE_END].store(end + rows, Ordering::Relaxed);
        let d = layout.descriptor(next_generation(seen));
        words[d + D_BASE].store(base, Ordering::Relaxed);
        words[d + D_LEN].store(kept + rows, Ordering::Relaxed);
        words[d + D_MERGED].store(1, Ordering::Relaxed);
        for (i, v) in plan.encode().iter().enumerate() {
            words[d + D_PLAN + i].store(*v, Ordering::Relaxed);
        }
        Ok(Prepared {
            rtc,
            rows,
            real_delay,
            idx_before,
        })
    }

    /// Seals the live generation (the merge's linearization point); returns the sealed word.
    fn seal(&self, words: &[AtomicU64]) -> u64 {
        // Counted before the seal so that an observer who sees the index reset also sees it.
        words[MERGES].fetch_add(1, Ordering::Relaxed);
        words[CURSOR].fetch_or(SEALED, Ordering::AcqRel) | SEALED
    }

    /// Installs the successor of the generation sealed at `sealed_word` (producer or helper).
    ///
    /// Its descriptor was written before the seal; if it was rewritten since (this caller is
    /// stale), the cursor has moved on and the CAS fails: nothing is written but the cursor.
    fn install(&self, words: &[AtomicU64], sealed_word: u64) {
        let next = next_generation(sealed_word);
        let d = self.layout.descriptor(next);
        let len = words[d + D_LEN].load(Ordering::Relaxed);
        let plan = Plan::decode(std::array::from_fn(|i| {
            words[d + D_PLAN + i].load(Ordering::Relaxed)
        }));
        let start = plan.start(sealed_word, len);
        // Losing the race is fine: the winner installed the same deterministic value.
        let _ = words[CURSOR].compare_exchange(
            sealed_word,
            pack(next, start, 0),
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    fn finish(&self, words: &[AtomicU64], prepared: Prepared, sealed_word: u64) -> usize {
        let resolution =
            resolve_delay(prepared.real_delay, prepared.idx_before, index(sealed_word));
        if resolution.mismatch {
            words[MISMATCHES].fetch_add(1, Ordering::Relaxed);
        }
        if prepared.rtc {
            resolution.delay.min(prepared.rows) as usize
        } else {
            0
        }
    }

    /// The live generation, its descriptor validated against the cursor.
    fn live(&self, words: &[AtomicU64]) -> Live {
        let cursor = &words[CURSOR];
        loop {
            let word = cursor.load(Ordering::Acquire);
            if sealed(word) {
                self.install(words, word);
                continue;
            }
            let d = self.layout.descriptor(generation(word));
            let live = Live {
                word,
                base: words[d + D_BASE].load(Ordering::Relaxed),
                len: words[d + D_LEN].load(Ordering::Relaxed),
                merged: words[d + D_MERGED].load(Ordering::Relaxed) != 0,
            };
            fence(Ordering::Acquire);
            if generation(cursor.load(Ordering::Relaxed)) == generation(word) {
                return live;
            }
        }
    }

    /// Whether rows read from ring positions `>= first` may have been overwritten meanwhile.
    fn overwritten(&self, words: &[AtomicU64], first: u64) -> bool {
        fence(Ordering::Acquire);
        words[WRITE_HEAD].load(Ordering::Relaxed) > first + self.layout.ring_rows
    }

    fn read_provenance(&self, words: &[AtomicU64], pos: u64) -> Option<Provenance> {
        let (_, _, prov) = self.layout.parts(self.layout.row(pos));
        provenance_from(std::array::from_fn::<u64, PROVENANCE_LEN, _>(|i| {
            words[prov + i].load(Ordering::Relaxed)
        }))
    }

    fn read_values(&self, words: &[AtomicU64], pos: u64, original: bool, out: &mut [f32]) {
        let (orig, proc, _) = self.layout.parts(self.layout.row(pos));
        let from = if original { orig } else { proc };
        unpack_values(out, |i| words[from + i].load(Ordering::Relaxed));
    }

    /// Takes the next action: copies its processed row into `out` (`action_dim` long) and
    /// returns its provenance; `None` when the queue is empty.
    ///
    /// Never waits on a producer; allocates nothing.
    pub fn pop_into(&self, out: &mut [f32]) -> Option<Option<Provenance>> {
        assert_eq!(out.len(), self.layout.dim, "output row width");
        let words = self.words();
        let cursor = &words[CURSOR];
        let mut word = cursor.load(Ordering::Acquire);
        loop {
            if sealed(word) {
                self.install(words, word);
                word = cursor.load(Ordering::Acquire);
                continue;
            }
            if cleared(word) {
                return None;
            }
            let d = self.layout.descriptor(generation(word));
            let len = words[d + D_LEN].load(Ordering::Relaxed);
            let row = start(word) + index(word);
            if row >= len {
                // Empty as of `word`, unless the length came from a rewritten descriptor.
                fence(Ordering::Acquire);
                let now = cursor.load(Ordering::Relaxed);
                if generation(now) == generation(word) {
                    return None;
                }
                word = now;
                continue;
            }
            let base = words[d + D_BASE].load(Ordering::Relaxed);
            if let Err(actual) =
                cursor.compare_exchange_weak(word, word + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                word = actual;
                continue;
            }
            let pos = base + row;
            self.read_values(words, pos, false, out);
            let provenance = self.read_provenance(words, pos);
            if self.overwritten(words, pos) {
                // Two merges replaced this row while it was copied: take the current action.
                words[SUPERSEDED].fetch_add(1, Ordering::Relaxed);
                word = cursor.load(Ordering::Acquire);
                continue;
            }
            words[CONSUMED].fetch_add(1, Ordering::Relaxed);
            return Some(provenance);
        }
    }

    /// Takes the next processed action as an owned row.
    pub fn pop(&self) -> Option<Vec<f32>> {
        let mut row = vec![0.0; self.layout.dim];
        self.pop_into(&mut row).map(|_| row)
    }

    /// Number of actions left.
    pub fn qsize(&self) -> usize {
        self.live(self.words()).remaining() as usize
    }

    /// Whether no action is left.
    pub fn is_empty(&self) -> bool {
        self.qsize() == 0
    }

    /// Actions consumed since the last merge or clear (LeRobot's `last_index`).
    pub fn action_index(&self) -> u64 {
        index(self.live(self.words()).word)
    }

    /// Provenance of the next action, without consuming it. `None` if empty or unlabeled.
    pub fn peek_provenance(&self) -> Option<Provenance> {
        let words = self.words();
        loop {
            let live = self.live(words);
            let pos = live.head()?;
            let provenance = self.read_provenance(words, pos);
            if !self.overwritten(words, pos) {
                return provenance;
            }
        }
    }

    fn left_over(&self, original: bool) -> Option<LeftOver> {
        let words = self.words();
        let dim = self.layout.dim;
        loop {
            let live = self.live(words);
            if cleared(live.word) || !live.merged {
                return None;
            }
            let rows = live.remaining() as usize;
            let first = live.base + start(live.word) + index(live.word);
            let mut values = vec![0.0; rows * dim];
            for (r, out) in values.chunks_mut(dim).enumerate() {
                self.read_values(words, first + r as u64, original, out);
            }
            if !self.overwritten(words, first) {
                return Some(LeftOver { values, rows });
            }
        }
    }

    /// Unconsumed original (model-space) rows; `None` if nothing was merged since clear.
    pub fn left_over_original(&self) -> Option<LeftOver> {
        self.left_over(true)
    }

    /// Unconsumed processed (robot-space) rows; `None` if nothing was merged since clear.
    pub fn left_over_processed(&self) -> Option<LeftOver> {
        self.left_over(false)
    }

    /// Clears the queue if `keep(head provenance)` is false; true if this call cleared it.
    fn clear_unless(&self, keep: impl Fn(Option<Option<Provenance>>) -> bool) -> bool {
        let words = self.words();
        loop {
            let live = self.live(words);
            if cleared(live.word) || !live.merged {
                return false; // nothing to clear: no rows, no leftovers
            }
            let head = match live.head() {
                None => None,
                Some(pos) => {
                    let provenance = self.read_provenance(words, pos);
                    if self.overwritten(words, pos) {
                        continue;
                    }
                    Some(provenance)
                }
            };
            if keep(head) {
                return false;
            }
            let word = live.word;
            let clear = pack(generation(word), start(word), 0) | CLEARED;
            if words[CURSOR]
                .compare_exchange(word, clear, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return true;
            }
        }
    }

    /// Drops every queued action and resets the index; `get_left_over` returns `None` after.
    ///
    /// Lock-free: a consumer may call it (it never waits on a producer).
    pub fn clear(&self) {
        self.clear_unless(|_| false);
    }

    /// Clears the queue only while its next action belongs to `provenance`'s chunk (or is
    /// unlabeled, or the queue is empty): a chunk merged since survives. True if it cleared.
    pub fn discard_chunk(&self, provenance: Option<Provenance>) -> bool {
        self.clear_unless(|head| matches!(head, Some(Some(p)) if Some(p) != provenance))
    }

    /// A snapshot of the counters and the queue state.
    pub fn statistics(&self) -> QueueStats {
        let words = self.words();
        let live = self.live(words);
        let load = |i: usize| words[i].load(Ordering::Acquire);
        QueueStats {
            merges: load(MERGES),
            rejected_merges: load(REJECTED),
            delay_mismatches: load(MISMATCHES),
            actions_consumed: load(CONSUMED),
            superseded_reads: load(SUPERSEDED),
            qsize: live.remaining() as usize,
            action_index: index(live.word),
        }
    }
}

#[cfg(test)]
mod tests;
