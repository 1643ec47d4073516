//! The action chunk buffer between the inference side and the control loop (no pyo3 here).
//!
//! Semantics follow LeRobot's RTC `ActionQueue`: `merge` either replaces the queue with the
//! new chunk minus the steps that went by during inference (RTC) or appends the new chunk
//! behind the unconsumed actions (non-RTC); `get` hands out one action per control tick.
//!
//! # Concurrency design
//!
//! The consumer (the control loop) must never wait for a producer (the inference side), so
//! there is no lock shared between them. The queue is an [`ArcSwap`] of immutable
//! [`Generation`]s. A generation owns its rows (never mutated after publication) and one
//! atomic *word*: the consumer index (LeRobot's `last_index`) plus a [`SEALED`] bit.
//!
//! * Consumer `get`: load the current generation, CAS `word -> word + 1` while the word is
//!   not sealed and rows remain. A sealed generation has a successor (`next`, set by the
//!   producer *before* sealing), so the consumer follows it instead of waiting for the
//!   producer to publish it: the consumer never blocks, whatever the producer is doing.
//! * Producer `merge` (producers serialise on a mutex the consumer never touches): snapshot
//!   the index `s0`, build the successor from that snapshot (the O(chunk) copy happens while
//!   the consumer keeps running), link it as `next`, then seal the old generation with
//!   `fetch_or(SEALED)`. That atomic RMW returns the exact number `s1 >= s0` of actions the
//!   consumer took from the old generation: it is the merge's linearization point.
//! * The successor's start row depends on `s1` (append: skip the `s1 - s0` rows that were
//!   consumed after the snapshot; RTC: the delay is resolved against `s1` and `idx_before`).
//!   It is stored as a [`Plan`] and resolved by whoever needs it first — the producer right
//!   after sealing or a consumer that followed `next` — from the sealed (hence frozen) word
//!   of the predecessor. The computation is deterministic, so both get the same value.
//!
//! Consequences: in append mode no action is lost or handed out twice (the successor starts
//! exactly at old row `s1`), the index is monotonic between merges, and the consumer path
//! allocates nothing.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use arc_swap::ArcSwap;

mod error;
mod generation;

pub use error::QueueError;
pub use generation::{resolve_delay, DelayResolution};
use generation::{Generation, Plan, Rows, SEALED};

/// Largest accepted capacity: row → chunk indices are `u32`.
pub const MAX_CAPACITY: usize = u32::MAX as usize;

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
    /// Accepted merges since construction.
    pub merges: u64,
    /// Rejected merges since construction.
    pub rejected_merges: u64,
    /// Merges whose `idx_before` disagreed with `real_delay`.
    pub delay_mismatches: u64,
    /// Actions handed out by `get` since construction.
    pub actions_consumed: u64,
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

/// Lock-free (for the consumer) action chunk queue; see the module docs for the design.
pub struct ActionQueue {
    dim: usize,
    rtc: bool,
    capacity: usize,
    current: ArcSwap<Generation>,
    /// Serialises producers (merge, clear). Never taken by the consumer path.
    producer: Mutex<()>,
    merges: AtomicU64,
    rejected_merges: AtomicU64,
    delay_mismatches: AtomicU64,
    actions_consumed: AtomicU64,
}

impl fmt::Debug for ActionQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ActionQueue")
            .field("action_dim", &self.dim)
            .field("rtc", &self.rtc)
            .field("capacity", &self.capacity)
            .field("qsize", &self.qsize())
            .field("action_index", &self.action_index())
            .finish()
    }
}

impl ActionQueue {
    /// Creates an empty queue of `action_dim`-wide actions holding at most `capacity` rows.
    pub fn new(action_dim: usize, rtc: bool, capacity: usize) -> Result<Self, QueueError> {
        if action_dim == 0 {
            return Err(QueueError::Config(
                "action_dim is 0, expected action_dim >= 1".to_owned(),
            ));
        }
        if capacity == 0 || capacity > MAX_CAPACITY {
            return Err(QueueError::Config(format!(
                "capacity is {capacity}, expected 1 <= capacity <= {MAX_CAPACITY}"
            )));
        }
        Ok(Self {
            dim: action_dim,
            rtc,
            capacity,
            current: ArcSwap::from_pointee(Generation::fixed(Rows::empty(action_dim))),
            producer: Mutex::new(()),
            merges: AtomicU64::new(0),
            rejected_merges: AtomicU64::new(0),
            delay_mismatches: AtomicU64::new(0),
            actions_consumed: AtomicU64::new(0),
        })
    }

    /// Width of one action.
    pub fn action_dim(&self) -> usize {
        self.dim
    }

    /// Whether merges replace the queue (RTC) rather than append.
    pub fn rtc(&self) -> bool {
        self.rtc
    }

    /// Maximum number of rows the queue may hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    fn lock_producers(&self) -> MutexGuard<'_, ()> {
        // The mutex guards no data, so a poisoned lock carries no broken invariant.
        self.producer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Counts a merge rejected before reaching [`ActionQueue::merge`] (e.g. a wrong dtype).
    pub fn note_rejected(&self) {
        self.rejected_merges.fetch_add(1, Ordering::Relaxed);
    }

    fn validate(
        &self,
        original: &ChunkRef<'_>,
        processed: &ChunkRef<'_>,
    ) -> Result<(), QueueError> {
        for (name, chunk) in [("original", original), ("processed", processed)] {
            if chunk.cols != self.dim {
                return Err(QueueError::Shape {
                    name,
                    rows: chunk.rows,
                    cols: chunk.cols,
                    expected_cols: self.dim,
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
        let _producers = self.lock_producers();
        let result = self.merge_locked(original, processed, real_delay, idx_before, provenance);
        if result.is_err() {
            self.note_rejected();
        }
        result
    }

    fn merge_locked(
        &self,
        original: ChunkRef<'_>,
        processed: ChunkRef<'_>,
        real_delay: i64,
        idx_before: Option<i64>,
        provenance: Option<Provenance>,
    ) -> Result<usize, QueueError> {
        self.validate(&original, &processed)?;
        // Producers hold the lock and only they seal, so the current generation is live
        // and resolved.
        let old = self.current.load_full();
        let s0 = old.word.load(Ordering::Acquire);
        debug_assert_eq!(
            s0 & SEALED,
            0,
            "current generation sealed under the producer lock"
        );
        let t = original.rows;
        let next = if self.rtc {
            if t > self.capacity {
                return Err(QueueError::ChunkCapacity {
                    rows: t,
                    capacity: self.capacity,
                });
            }
            let plan = Plan::Trim {
                real_delay,
                idx_before,
                rows: t as u64,
            };
            Generation::pending(Rows::from_chunk(original, processed, provenance), plan)
        } else {
            let keep_from = old.row(s0).min(old.rows.len);
            let queued = old.rows.len - keep_from;
            if queued + t > self.capacity {
                return Err(QueueError::Capacity {
                    queued,
                    incoming: t,
                    capacity: self.capacity,
                });
            }
            let rows = Rows::appended(&old.rows, keep_from, original, processed, provenance);
            Generation::pending(rows, Plan::SkipConsumed { s0 })
        };
        let next = Arc::new(next);
        // Counted before the seal so that an observer who sees the index reset also sees it.
        self.merges.fetch_add(1, Ordering::AcqRel);
        let s1 = self.publish(&old, next.clone());
        let resolution = resolve_delay(real_delay, idx_before, s1);
        if resolution.mismatch {
            self.delay_mismatches.fetch_add(1, Ordering::Relaxed);
        }
        self.current.store(next);
        Ok(if self.rtc {
            resolution.delay.min(t as u64) as usize
        } else {
            0
        })
    }

    /// Links `next` after `old`, seals `old` (the linearization point) and resolves `next`.
    ///
    /// Returns `s1`, the number of actions the consumer took from `old`. The caller then
    /// stores `next` as current; consumers that see the seal earlier follow the link.
    fn publish(&self, old: &Generation, next: Arc<Generation>) -> u64 {
        let linked = old.next.set(next).is_ok();
        debug_assert!(linked, "a live generation has no successor yet");
        let s1 = old.word.fetch_or(SEALED, Ordering::AcqRel) & !SEALED;
        if let Some(next) = old.next.get() {
            next.resolve(s1);
        }
        s1
    }

    /// Drops every queued action and resets the index; `get_left_over` returns `None` after.
    pub fn clear(&self) {
        let _producers = self.lock_producers();
        let old = self.current.load_full();
        let next = Arc::new(Generation::fixed(Rows::empty(self.dim)));
        self.publish(&old, next.clone());
        self.current.store(next);
    }

    /// Takes the next action: calls `f` with its processed row and provenance.
    ///
    /// Never waits on a producer; allocates nothing (besides what `f` does).
    pub fn pop_with<R>(&self, f: impl FnOnce(&[f32], Option<Provenance>) -> R) -> Option<R> {
        let guard = self.current.load();
        let mut generation: &Generation = &guard;
        let mut word = generation.word.load(Ordering::Acquire);
        loop {
            if word & SEALED != 0 {
                generation = generation.successor();
                word = generation.word.load(Ordering::Acquire);
                continue;
            }
            let row = generation.row(word);
            if row >= generation.rows.len {
                return None;
            }
            match generation.word.compare_exchange_weak(
                word,
                word + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    self.actions_consumed.fetch_add(1, Ordering::Relaxed);
                    let rows = &generation.rows;
                    return Some(f(rows.processed_row(row), rows.provenance(row)));
                }
                Err(actual) => word = actual,
            }
        }
    }

    /// Takes the next processed action as an owned row.
    pub fn pop(&self) -> Option<Vec<f32>> {
        self.pop_with(|row, _| row.to_vec())
    }

    /// Calls `f` with the live generation and its unsealed word.
    fn with_live<R>(&self, f: impl FnOnce(&Generation, u64) -> R) -> R {
        let guard = self.current.load();
        let (generation, word) = guard.live();
        f(generation, word)
    }

    /// Number of actions left.
    pub fn qsize(&self) -> usize {
        self.with_live(|generation, word| generation.remaining(word))
    }

    /// Whether no action is left.
    pub fn is_empty(&self) -> bool {
        self.qsize() == 0
    }

    /// Actions consumed since the last merge or clear (LeRobot's `last_index`).
    pub fn action_index(&self) -> u64 {
        self.with_live(|_, word| word)
    }

    /// Provenance of the next action, without consuming it. `None` if empty or unlabeled.
    pub fn peek_provenance(&self) -> Option<Provenance> {
        self.with_live(|generation, word| {
            let row = generation.row(word);
            (row < generation.rows.len)
                .then(|| generation.rows.provenance(row))
                .flatten()
        })
    }

    fn left_over(&self, original: bool) -> Option<LeftOver> {
        self.with_live(|generation, word| {
            let rows = &generation.rows;
            if !rows.merged {
                return None;
            }
            let from = generation.row(word).min(rows.len);
            let values = if original {
                &rows.original
            } else {
                &rows.processed
            };
            Some(LeftOver {
                values: values[from * rows.dim..].to_vec(),
                rows: rows.len - from,
            })
        })
    }

    /// Unconsumed original (model-space) rows; `None` if nothing was merged since clear.
    pub fn left_over_original(&self) -> Option<LeftOver> {
        self.left_over(true)
    }

    /// Unconsumed processed (robot-space) rows; `None` if nothing was merged since clear.
    pub fn left_over_processed(&self) -> Option<LeftOver> {
        self.left_over(false)
    }

    /// A snapshot of the counters and the queue state.
    pub fn statistics(&self) -> QueueStats {
        let (qsize, action_index) =
            self.with_live(|generation, word| (generation.remaining(word), word));
        QueueStats {
            merges: self.merges.load(Ordering::Acquire),
            rejected_merges: self.rejected_merges.load(Ordering::Relaxed),
            delay_mismatches: self.delay_mismatches.load(Ordering::Relaxed),
            actions_consumed: self.actions_consumed.load(Ordering::Relaxed),
            qsize,
            action_index,
        }
    }
}

#[cfg(test)]
mod tests;
