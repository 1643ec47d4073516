//! The consumer side of the queue: `pop_into` (one action per control tick), the reads of the
//! live generation and `clear` (see the design in `queue.rs`). Nothing here waits on a producer.

use std::sync::atomic::{fence, Ordering};

use super::layout::{
    cleared, generation, index, pack, sealed, start, taken, CLEARED, CONSUMED, CURSOR, D_BASE,
    D_LEN, MERGES, MISMATCHES, REJECTED, SUPERSEDED,
};
use super::merge::position_index;
use super::{ActionQueue, LeftOver, Provenance, QueueError, QueueStats};

impl ActionQueue {
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
        taken(self.live(self.words()).word)
    }

    /// Where the consumer stands: the live generation and the actions taken from it (a clear
    /// keeps the count), packed into one opaque word.
    ///
    /// The control loop reads it with each observation; [`ActionQueue::merge_since`] counts
    /// the actions taken since it and [`ActionQueue::left_over_since`] reads the queue as it
    /// stood then. Only a position read since the last merge can be measured from
    /// ([`ActionQueue::is_current`]).
    pub fn position(&self) -> u64 {
        let word = self.live(self.words()).word;
        pack(generation(word), 0, index(word))
    }

    /// Whether `position` was read in the live generation (no merge since), so a merge can
    /// count exactly the actions taken after it.
    pub fn is_current(&self, position: u64) -> bool {
        position_index(self.live(self.words()).word, position).is_ok()
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

    /// The live generation's rows from the consumer's index, or from `position`'s.
    fn left_over(
        &self,
        original: bool,
        position: Option<u64>,
    ) -> Result<Option<LeftOver>, QueueError> {
        let words = self.words();
        let dim = self.layout.dim;
        loop {
            let live = self.live(words);
            let from = match position {
                Some(position) => position_index(live.word, position)?,
                None => index(live.word),
            };
            if cleared(live.word) || !live.merged {
                return Ok(None);
            }
            let row = start(live.word) + from;
            let rows = live.len.saturating_sub(row) as usize;
            let first = live.base + row;
            let mut values = vec![0.0; rows * dim];
            for (r, out) in values.chunks_mut(dim).enumerate() {
                self.read_values(words, first + r as u64, original, out);
            }
            if !self.overwritten(words, first) {
                return Ok(Some(LeftOver { values, rows }));
            }
        }
    }

    /// Unconsumed original (model-space) rows; `None` if nothing was merged since clear.
    pub fn left_over_original(&self) -> Option<LeftOver> {
        self.left_over(true, None).unwrap_or(None)
    }

    /// Unconsumed processed (robot-space) rows; `None` if nothing was merged since clear.
    pub fn left_over_processed(&self) -> Option<LeftOver> {
        self.left_over(false, None).unwrap_or(None)
    }

    /// The queue's rows as they stood at `position` (those taken since included): the plan
    /// an observation taken there was made under. Original (model-space) rows with
    /// `original`, else processed ones; `None` if nothing was merged since clear.
    ///
    /// Errors when `position` was not read in the live generation ([`ActionQueue::is_current`]).
    pub fn left_over_since(
        &self,
        position: u64,
        original: bool,
    ) -> Result<Option<LeftOver>, QueueError> {
        self.left_over(original, Some(position))
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
            // The index survives (flagged cleared): a merge measured from a position read
            // before the clear still counts the actions taken then.
            let clear = live.word | CLEARED;
            let word = live.word;
            if words[CURSOR]
                .compare_exchange(word, clear, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return true;
            }
        }
    }

    /// Drops every queued action and resets `action_index`; `get_left_over` returns `None` after.
    ///
    /// Lock-free: a consumer may call it (it never waits on a producer).
    pub fn clear(&self) {
        self.clear_unless(|_| false);
    }

    /// Clears the queue only while its next action belongs to `provenance`'s chunk (or is
    /// unlabeled, or the queue is empty): a chunk merged since survives. True if it cleared.
    pub fn discard_chunk(&self, provenance: Option<Provenance>) -> bool {
        self.clear_unless(
            |head| matches!(head, Some(Some(p)) if !provenance.is_some_and(|q| p.same_chunk(&q))),
        )
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
            action_index: taken(live.word),
        }
    }
}
