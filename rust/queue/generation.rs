//! The immutable generations the queue is made of, and how a successor's start row is
//! resolved from its predecessor's final consumer index (see the design in `queue.rs`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use super::{ChunkRef, Provenance};

/// Bit of a generation's word that marks it as replaced by its `next` generation.
pub(super) const SEALED: u64 = 1 << 63;
/// Start offset of a generation whose [`Plan`] has not been resolved yet.
pub(super) const UNRESOLVED: u64 = u64::MAX;

/// Result of the delay reconciliation LeRobot calls `_check_and_resolve_delays`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DelayResolution {
    /// Steps to trim (before clamping to the chunk length).
    pub delay: u64,
    /// Whether `idx_before` disagreed with `real_delay`.
    pub mismatch: bool,
}

/// Reconciles the latency-derived `real_delay` with the actions really consumed since
/// `idx_before` (the index snapshotted when the observation was sent).
///
/// Trimming by `real_delay` alone over-trims when the queue ran dry during inference (the
/// robot did not move, yet the new chunk would start ahead of it: LeRobot PR #4223, fixed in
/// PR #4454), so on a mismatch the smaller of the two is used.
pub fn resolve_delay(real_delay: i64, idx_before: Option<i64>, index: u64) -> DelayResolution {
    let delay = u64::try_from(real_delay).unwrap_or(0);
    let Some(before) = idx_before else {
        return DelayResolution {
            delay,
            mismatch: false,
        };
    };
    let consumed = u64::try_from(i128::from(index) - i128::from(before)).unwrap_or(0);
    DelayResolution {
        delay: delay.min(consumed),
        mismatch: consumed != delay,
    }
}

/// How a generation's start row is derived from `s1`, its predecessor's final index.
#[derive(Clone, Copy, Debug)]
pub(super) enum Plan {
    /// Start known at construction (initial and cleared generations).
    Fixed,
    /// Append: rows were copied from predecessor index `s0`; skip those consumed since.
    SkipConsumed { s0: u64 },
    /// RTC replace: trim the resolved delay, clamped to the chunk length.
    Trim {
        real_delay: i64,
        idx_before: Option<i64>,
        rows: u64,
    },
}

impl Plan {
    pub(super) fn start(self, s1: u64) -> u64 {
        match self {
            Self::Fixed => 0,
            Self::SkipConsumed { s0 } => s1 - s0,
            Self::Trim {
                real_delay,
                idx_before,
                rows,
            } => resolve_delay(real_delay, idx_before, s1).delay.min(rows),
        }
    }
}

/// Immutable row storage of one generation.
pub(super) struct Rows {
    pub(super) dim: usize,
    pub(super) len: usize,
    pub(super) original: Vec<f32>,
    pub(super) processed: Vec<f32>,
    /// Per row, an index into `chunks` (provenance is stored once per chunk).
    pub(super) row_chunk: Vec<u32>,
    pub(super) chunks: Vec<Option<Provenance>>,
    /// False until something was merged (LeRobot: `original_queue is None`).
    pub(super) merged: bool,
}

impl Rows {
    pub(super) fn empty(dim: usize) -> Self {
        Self {
            dim,
            len: 0,
            original: Vec::new(),
            processed: Vec::new(),
            row_chunk: Vec::new(),
            chunks: Vec::new(),
            merged: false,
        }
    }

    pub(super) fn from_chunk(
        original: ChunkRef<'_>,
        processed: ChunkRef<'_>,
        prov: Option<Provenance>,
    ) -> Self {
        Self {
            dim: original.cols,
            len: original.rows,
            original: original.data.to_vec(),
            processed: processed.data.to_vec(),
            row_chunk: vec![0; original.rows],
            chunks: vec![prov],
            merged: true,
        }
    }

    /// `old[keep_from..]` followed by the new chunk.
    pub(super) fn appended(
        old: &Rows,
        keep_from: usize,
        original: ChunkRef<'_>,
        processed: ChunkRef<'_>,
        prov: Option<Provenance>,
    ) -> Self {
        let dim = old.dim;
        let kept = old.len - keep_from;
        let len = kept + original.rows;
        let concat = |old_values: &[f32], new_values: &[f32]| {
            let mut values = Vec::with_capacity(len * dim);
            values.extend_from_slice(&old_values[keep_from * dim..]);
            values.extend_from_slice(new_values);
            values
        };
        // Chunk table compaction: only chunks referenced by kept rows survive, so the table
        // stays bounded by the number of queued rows however many merges happen.
        let base = old.row_chunk.get(keep_from).copied().unwrap_or(0);
        let mut chunks: Vec<Option<Provenance>> = if kept > 0 {
            old.chunks[base as usize..].to_vec()
        } else {
            Vec::new()
        };
        let new_chunk = chunks.len() as u32;
        chunks.push(prov);
        let mut row_chunk = Vec::with_capacity(len);
        row_chunk.extend(old.row_chunk[keep_from..].iter().map(|c| c - base));
        row_chunk.resize(len, new_chunk);
        Self {
            dim,
            len,
            original: concat(&old.original, original.data),
            processed: concat(&old.processed, processed.data),
            row_chunk,
            chunks,
            merged: true,
        }
    }

    pub(super) fn processed_row(&self, row: usize) -> &[f32] {
        &self.processed[row * self.dim..(row + 1) * self.dim]
    }

    pub(super) fn provenance(&self, row: usize) -> Option<Provenance> {
        self.chunks[self.row_chunk[row] as usize]
    }
}

/// One immutable state of the queue plus its consumer index.
pub(super) struct Generation {
    pub(super) rows: Rows,
    pub(super) plan: Plan,
    /// First row of the queue (rows before it were trimmed or consumed), or [`UNRESOLVED`].
    pub(super) start: AtomicU64,
    /// Consumer index relative to `start`, plus the [`SEALED`] bit.
    pub(super) word: AtomicU64,
    /// Successor; always set before `word` gets the [`SEALED`] bit.
    pub(super) next: OnceLock<Arc<Generation>>,
}

impl Generation {
    pub(super) fn fixed(rows: Rows) -> Self {
        Self {
            rows,
            plan: Plan::Fixed,
            start: AtomicU64::new(0),
            word: AtomicU64::new(0),
            next: OnceLock::new(),
        }
    }

    pub(super) fn pending(rows: Rows, plan: Plan) -> Self {
        Self {
            rows,
            plan,
            start: AtomicU64::new(UNRESOLVED),
            word: AtomicU64::new(0),
            next: OnceLock::new(),
        }
    }

    /// Start row; only called on resolved generations (current, or reached via `successor`).
    pub(super) fn start(&self) -> usize {
        let start = self.start.load(Ordering::Acquire);
        debug_assert_ne!(
            start, UNRESOLVED,
            "generation used before its start was resolved"
        );
        // Saturation keeps an impossible unresolved start harmless: it reads as empty.
        usize::try_from(start).unwrap_or(usize::MAX)
    }

    /// Resolves this generation's start from its sealed predecessor's final index `s1`.
    pub(super) fn resolve(&self, s1: u64) {
        if self.start.load(Ordering::Acquire) == UNRESOLVED {
            let start = self.plan.start(s1);
            // Losing the race is fine: the winner stored the same deterministic value.
            let _ =
                self.start
                    .compare_exchange(UNRESOLVED, start, Ordering::AcqRel, Ordering::Acquire);
        }
    }

    /// The successor of a sealed generation, resolved.
    pub(super) fn successor(&self) -> &Generation {
        let next = self
            .next
            .get()
            .expect("a sealed generation always has a successor");
        let s1 = self.word.load(Ordering::Acquire) & !SEALED;
        next.resolve(s1);
        next
    }

    /// Walks sealed generations to the live one; returns it with its unsealed word.
    pub(super) fn live(&self) -> (&Generation, u64) {
        let mut generation = self;
        loop {
            let word = generation.word.load(Ordering::Acquire);
            if word & SEALED == 0 {
                return (generation, word);
            }
            generation = generation.successor();
        }
    }

    /// Row index of the next action, given the unsealed word.
    pub(super) fn row(&self, word: u64) -> usize {
        self.start()
            .saturating_add(usize::try_from(word).unwrap_or(usize::MAX))
    }

    pub(super) fn remaining(&self, word: u64) -> usize {
        self.rows.len.saturating_sub(self.row(word))
    }
}

impl Drop for Generation {
    /// Drops a chain of successors iteratively: a consumer stalled on an old generation
    /// while many merges happen must not turn into a deep recursive drop.
    fn drop(&mut self) {
        let mut next = self.next.take();
        while let Some(generation) = next.and_then(Arc::into_inner) {
            let mut generation = generation;
            next = generation.next.take();
        }
    }
}
