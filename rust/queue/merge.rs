//! The producer side of the queue: a merge writes its rows, seals the live generation (the
//! linearization point) and installs the successor (see the design in `queue.rs`).

use std::sync::atomic::{fence, AtomicU64, Ordering};

use super::layout::{
    cleared, generation, index, next_generation, pack, pack_values, provenance_words, taken,
    CURSOR, D_BASE, D_LEN, D_MERGED, D_PLAN, MERGES, MISMATCHES, RTC, SEALED, WRITE_END,
    WRITE_HEAD,
};
use super::plan::{resolve_delay, Plan};
use super::{ActionQueue, ChunkRef, Provenance, QueueError};

/// What a merge measures the steps that went by while its chunk was computed from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Timing {
    /// LeRobot's rule: the latency-derived `real_delay`, reconciled with `idx_before`.
    Latency {
        real_delay: i64,
        idx_before: Option<i64>,
    },
    /// Exact: the consumer's [`ActionQueue::position`] when the observation was taken
    /// (`real_delay` only feeds the mismatch counter).
    Since { position: u64, real_delay: i64 },
}

/// A merge between writing its rows and sealing (split so tests can interleave the steps).
#[derive(Clone, Copy, Debug)]
pub(super) struct Prepared {
    rtc: bool,
    rows: u64,
    /// Leading rows of the chunk left out (exact append: their steps went by or are queued).
    skipped: u64,
    timing: Timing,
}

/// The index `position` names in the generation of `live` (a cursor word).
///
/// Errors when it is not a position, was read in an earlier generation (a merge came after it:
/// the actions taken since cannot be counted) or is ahead of the consumer.
pub(super) fn position_index(live: u64, position: u64) -> Result<u64, QueueError> {
    let reason = if position != pack(generation(position), 0, index(position)) {
        "is not a queue position"
    } else if generation(position) != generation(live) {
        "was read before the last merge: measure from an observation taken since"
    } else if index(position) > index(live) {
        "is ahead of the consumer"
    } else {
        return Ok(index(position));
    };
    Err(QueueError::Position { position, reason })
}

impl ActionQueue {
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
    /// LeRobot's rule: `real_delay < 0` counts as 0. With `idx_before`, the delay is reconciled
    /// against the actions consumed since that index (see [`resolve_delay`]). On error nothing
    /// changes. [`ActionQueue::merge_since`] is the exact merge.
    pub fn merge(
        &self,
        original: ChunkRef<'_>,
        processed: ChunkRef<'_>,
        real_delay: i64,
        idx_before: Option<i64>,
        provenance: Option<Provenance>,
    ) -> Result<usize, QueueError> {
        let timing = Timing::Latency {
            real_delay,
            idx_before,
        };
        self.merge_timed(original, processed, timing, provenance)
    }

    /// Merges a chunk computed from an observation taken at the consumer's `position`
    /// ([`ActionQueue::position`], read with the observation); returns the chunk's leading
    /// rows left out.
    ///
    /// Row `r` of the chunk is meant for the step `r` steps after the observation's, so the
    /// chunk continues exactly where the queue's own actions end. RTC: it replaces the queue
    /// minus exactly the actions taken since `position`, counted at the merge's linearization
    /// point. Append: the queue keeps its actions and the chunk follows them minus the rows
    /// whose steps were taken or are still queued. A queue that ran dry meanwhile skips
    /// nothing for the ticks without an action: the chunk starts where the actions stopped.
    /// `real_delay` (from the latency) only counts a mismatch. On error nothing changes.
    pub fn merge_since(
        &self,
        original: ChunkRef<'_>,
        processed: ChunkRef<'_>,
        position: u64,
        real_delay: i64,
        provenance: Option<Provenance>,
    ) -> Result<usize, QueueError> {
        let timing = Timing::Since {
            position,
            real_delay,
        };
        self.merge_timed(original, processed, timing, provenance)
    }

    fn merge_timed(
        &self,
        original: ChunkRef<'_>,
        processed: ChunkRef<'_>,
        timing: Timing,
        provenance: Option<Provenance>,
    ) -> Result<usize, QueueError> {
        let words = self.words();
        let _producers = self.lock_producers(words);
        let result = self
            .validate(&original, &processed)
            .and_then(|()| self.prepare(words, original, processed, timing, provenance))
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
    pub(super) fn prepare(
        &self,
        words: &[AtomicU64],
        original: ChunkRef<'_>,
        processed: ChunkRef<'_>,
        timing: Timing,
        provenance: Option<Provenance>,
    ) -> Result<Prepared, QueueError> {
        let layout = &self.layout;
        let seen = words[CURSOR].load(Ordering::Acquire);
        debug_assert!(seen & SEALED == 0, "sealed cursor under the producer lock");
        let since = match timing {
            Timing::Since { position, .. } => Some(position_index(seen, position)?),
            Timing::Latency { .. } => None,
        };
        let rtc = words[RTC].load(Ordering::Relaxed) != 0;
        let end = words[WRITE_END].load(Ordering::Relaxed);
        let rows = original.rows as u64;
        let (base, kept, skipped, plan) = if rtc {
            if original.rows > layout.capacity {
                return Err(QueueError::ChunkCapacity {
                    rows: original.rows,
                    capacity: layout.capacity,
                });
            }
            let plan = match (timing, since) {
                (
                    Timing::Latency {
                        real_delay,
                        idx_before,
                    },
                    _,
                ) => Plan::Trim {
                    real_delay,
                    idx_before,
                },
                (Timing::Since { .. }, from) => Plan::Since {
                    from: from.unwrap_or(0),
                },
            };
            (end, 0, 0, plan)
        } else {
            let d = layout.descriptor(generation(seen));
            let merged = words[d + D_MERGED].load(Ordering::Relaxed) != 0;
            let (base, kept) = if cleared(seen) || !merged {
                (end, 0)
            } else {
                // Only producers write descriptors and the live one ends at `end`.
                let row = super::layout::start(seen) + index(seen);
                let len = words[d + D_LEN].load(Ordering::Relaxed);
                (
                    words[d + D_BASE].load(Ordering::Relaxed) + row,
                    len.saturating_sub(row),
                )
            };
            // Exact: the steps taken since the observation and those still queued come before
            // this chunk's; a clear dropped the queued ones unexecuted, so they do not count.
            let skipped = since
                .map_or(0, |from| (index(seen) - from) + kept)
                .min(rows);
            if (kept + rows - skipped) as usize > layout.capacity {
                return Err(QueueError::Capacity {
                    queued: kept as usize,
                    incoming: (rows - skipped) as usize,
                    capacity: layout.capacity,
                });
            }
            let plan = Plan::Skip {
                seen: index(seen),
                kept,
            };
            (base, kept, skipped, plan)
        };
        debug_assert_eq!(base + kept, end, "the live generation ends at write_end");
        let written = rows - skipped;
        // Announce the ring positions about to be overwritten, then (after the fence, which
        // also orders the cursor load above before every write below) write them.
        words[WRITE_HEAD].store(end + written, Ordering::Relaxed);
        fence(Ordering::Release);
        let dim = layout.dim;
        for r in skipped as usize..original.rows {
            let (orig, proc, prov) = layout.parts(layout.row(end + r as u64 - skipped));
            let values = r * dim..(r + 1) * dim;
            pack_values(&original.data[values.clone()], |i, v| {
                words[orig + i].store(v, Ordering::Relaxed)
            });
            pack_values(&processed.data[values], |i, v| {
                words[proc + i].store(v, Ordering::Relaxed)
            });
            // Each row is labelled with its own step: the chunk's plus its index in the chunk.
            let label = provenance.map(|p| Provenance {
                step: p.step + r as u64,
                ..p
            });
            for (i, v) in provenance_words(label).iter().enumerate() {
                words[prov + i].store(*v, Ordering::Relaxed);
            }
        }
        words[WRITE_END].store(end + written, Ordering::Relaxed);
        let d = layout.descriptor(next_generation(seen));
        words[d + D_BASE].store(base, Ordering::Relaxed);
        words[d + D_LEN].store(kept + written, Ordering::Relaxed);
        words[d + D_MERGED].store(1, Ordering::Relaxed);
        for (i, v) in plan.encode().iter().enumerate() {
            words[d + D_PLAN + i].store(*v, Ordering::Relaxed);
        }
        Ok(Prepared {
            rtc,
            rows,
            skipped,
            timing,
        })
    }

    /// Seals the live generation (the merge's linearization point); returns the sealed word.
    pub(super) fn seal(&self, words: &[AtomicU64]) -> u64 {
        // Counted before the seal so that an observer who sees the index reset also sees it.
        words[MERGES].fetch_add(1, Ordering::Relaxed);
        words[CURSOR].fetch_or(SEALED, Ordering::AcqRel) | SEALED
    }

    /// Installs the successor of the generation sealed at `sealed_word` (producer or helper).
    ///
    /// Its descriptor was written before the seal; if it was rewritten since (this caller is
    /// stale), the cursor has moved on and the CAS fails: nothing is written but the cursor.
    pub(super) fn install(&self, words: &[AtomicU64], sealed_word: u64) {
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

    /// The merge's result: the chunk's leading rows left out (trimmed or skipped).
    pub(super) fn finish(
        &self,
        words: &[AtomicU64],
        prepared: Prepared,
        sealed_word: u64,
    ) -> usize {
        let (delay, mismatch) = match prepared.timing {
            Timing::Latency {
                real_delay,
                idx_before,
            } => {
                let resolution = resolve_delay(real_delay, idx_before, taken(sealed_word));
                (resolution.delay, resolution.mismatch)
            }
            Timing::Since {
                position,
                real_delay,
            } => {
                let taken_since = index(sealed_word) - index(position);
                (
                    taken_since,
                    taken_since != u64::try_from(real_delay).unwrap_or(0),
                )
            }
        };
        if mismatch {
            words[MISMATCHES].fetch_add(1, Ordering::Relaxed);
        }
        match (prepared.rtc, prepared.timing) {
            (true, _) => delay.min(prepared.rows) as usize,
            (false, Timing::Since { .. }) => prepared.skipped as usize,
            (false, Timing::Latency { .. }) => 0,
        }
    }
}
