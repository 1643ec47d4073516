//! The action chunk buffer between the inference side and the control loop (no pyo3 here).
//!
//! Semantics follow LeRobot's RTC `ActionQueue`: `merge` either replaces the queue with the
//! new chunk minus the steps that went by during inference (RTC) or appends the new chunk
//! behind the unconsumed actions (non-RTC); `get` hands out one action per control tick.
//! `merge_since` is the exact merge the edge uses: it counts the steps that went by from the
//! consumer's [`ActionQueue::position`] read with the observation, so no step is executed twice.
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
//! * Consumer `get` (`consume.rs`): load the cursor; CAS `index → index + 1` while rows
//!   remain; then copy the row. A sealed cursor has a successor whose descriptor was written
//!   *before* the seal, so the consumer installs the successor itself (the same CAS the
//!   producer would do, with the same deterministic start) instead of waiting for it.
//! * Producer `merge` (`merge.rs`; producers serialise on a lock word the consumer never
//!   touches): write the new rows after the newest ones (append mode keeps the unconsumed rows
//!   where they are: the successor simply starts at the first of them), write the successor's
//!   descriptor, then seal with `fetch_or(SEALED)`. That atomic RMW returns the exact index `s1`
//!   the consumer reached in the old generation: it is the merge's linearization point. The
//!   successor's start follows from `s1` (append: skip the rows consumed since the producer
//!   looked; RTC: the delay resolved against `s1` and `idx_before`, or, for `merge_since`,
//!   exactly the actions taken since the position), then the successor is installed.
//! * `clear` (any side, no lock): CAS the live cursor to `CLEARED`, keeping its index. A merge
//!   whose seal finds `CLEARED` keeps none of the old rows; LeRobot's `merge` resolves the delay
//!   from index 0, as if it had come after the clear, and `merge_since` still counts the
//!   actions taken before the clear. `discard_chunk` is the same CAS, done only while the next
//!   action still belongs to a given chunk (the staleness bound's "drop the rest").
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

mod consume;
mod error;
mod layout;
mod merge;
mod plan;

pub use error::QueueError;
pub use layout::MAX_CAPACITY;
use layout::{
    cleared, generation, index, provenance_from, sealed, start, unpack_values, Layout, CAPACITY,
    CURSOR, DIM, D_BASE, D_LEN, D_MERGED, LOCK, MAGIC, MAGIC_WORD, PROVENANCE_LEN, REJECTED, RTC,
    WRITE_HEAD,
};
pub use plan::{resolve_delay, DelayResolution};

/// Largest accepted action dimension.
pub const MAX_ACTION_DIM: usize = 1 << 16;

/// Where an action comes from: its chunk, and the control step it is meant for.
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
    /// The control step (tick) the action is meant for. Given to a merge: the observation's
    /// tick; each merged row carries it plus the row's index in the chunk.
    pub step: u64,
}

impl Provenance {
    /// Whether both label actions of one chunk (every field but `step`).
    pub fn same_chunk(&self, other: &Self) -> bool {
        Self { step: 0, ..*self } == Self { step: 0, ..*other }
    }
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
    /// Merges whose actions taken (since `idx_before` or the position) disagreed with `real_delay`.
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
}

#[cfg(test)]
mod exact_tests;
#[cfg(test)]
mod tests;
