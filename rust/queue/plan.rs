//! How a successor generation's start row follows from its predecessor's sealed cursor, and the
//! delay reconciliation it uses (LeRobot's `_check_and_resolve_delays` with PR #4454's rule).

use super::layout::{cleared, index, taken};

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

/// How a generation's start row is derived from its predecessor's sealed cursor word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Plan {
    /// Start 0 (the initial, empty generation).
    Fixed,
    /// Append: the generation begins with the `kept` rows that were unconsumed when the
    /// producer looked (index `seen`); skip those consumed since, or all of them if the
    /// predecessor was cleared meanwhile.
    Skip { seen: u64, kept: u64 },
    /// RTC replace: trim the resolved delay.
    Trim {
        real_delay: i64,
        idx_before: Option<i64>,
    },
    /// RTC replace: trim exactly the actions taken since index `from` of the sealed generation
    /// (a clear keeps the index, so actions taken before it count).
    Since { from: u64 },
}

impl Plan {
    /// Start row for a generation of `len` rows whose predecessor was sealed at `sealed_word`.
    pub(super) fn start(self, sealed_word: u64, len: u64) -> u64 {
        let start = match self {
            Self::Fixed => 0,
            Self::Skip { seen, kept } => {
                if cleared(sealed_word) {
                    kept
                } else {
                    index(sealed_word).saturating_sub(seen)
                }
            }
            // A cleared cursor counts as index 0: as if the merge came right after `clear`.
            Self::Trim {
                real_delay,
                idx_before,
            } => resolve_delay(real_delay, idx_before, taken(sealed_word)).delay,
            Self::Since { from } => index(sealed_word).saturating_sub(from),
        };
        start.min(len)
    }

    pub(super) fn encode(self) -> [u64; 4] {
        match self {
            Self::Fixed => [0, 0, 0, 0],
            Self::Skip { seen, kept } => [1, seen, kept, 0],
            Self::Trim {
                real_delay,
                idx_before,
            } => [
                2,
                real_delay as u64,
                idx_before.unwrap_or(0) as u64,
                u64::from(idx_before.is_some()),
            ],
            Self::Since { from } => [3, from, 0, 0],
        }
    }

    /// Decodes what `encode` wrote; a torn read decodes to something harmless, which the
    /// caller's cursor CAS then rejects.
    pub(super) fn decode(words: [u64; 4]) -> Self {
        match words[0] {
            1 => Self::Skip {
                seen: words[1],
                kept: words[2],
            },
            2 => Self::Trim {
                real_delay: words[1] as i64,
                idx_before: (words[3] == 1).then_some(words[2] as i64),
            },
            3 => Self::Since { from: words[1] },
            _ => Self::Fixed,
        }
    }
}
