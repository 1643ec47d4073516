//! Why a merge (or a construction) is rejected; messages name expected and actual values.

use std::fmt;

/// Why a merge (or construction) was rejected. Nothing in the queue changes on a rejection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum QueueError {
    /// `action_dim` or `capacity` out of range at construction.
    Config(String),
    /// A chunk whose second dimension is not `action_dim`.
    Shape {
        name: &'static str,
        rows: usize,
        cols: usize,
        expected_cols: usize,
    },
    /// A chunk with no time step.
    Empty { name: &'static str, cols: usize },
    /// `original` and `processed` disagree on `T`.
    RowMismatch {
        original_rows: usize,
        processed_rows: usize,
    },
    /// A chunk whose buffer length disagrees with its declared shape.
    BufferLength {
        name: &'static str,
        len: usize,
        rows: usize,
        cols: usize,
    },
    /// RTC: the chunk alone is longer than `capacity`.
    ChunkCapacity { rows: usize, capacity: usize },
    /// Append: the merge would make the queue hold more than `capacity` rows.
    Capacity {
        queued: usize,
        incoming: usize,
        capacity: usize,
    },
    /// `merge_since` / `left_over_since`: a position the actions taken since cannot be counted from.
    Position { position: u64, reason: &'static str },
}

impl fmt::Display for QueueError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Config(msg) => f.write_str(msg),
            Self::Shape {
                name,
                rows,
                cols,
                expected_cols,
            } => write!(
                f,
                "{name} has shape ({rows}, {cols}), expected (T, {expected_cols})"
            ),
            Self::Empty { name, cols } => {
                write!(f, "{name} has shape (0, {cols}), expected T >= 1 rows")
            }
            Self::RowMismatch {
                original_rows,
                processed_rows,
            } => write!(
                f,
                "processed has {processed_rows} rows, original has {original_rows}; \
                 expected the same T for both"
            ),
            Self::BufferLength {
                name,
                len,
                rows,
                cols,
            } => write!(
                f,
                "{name} buffer holds {len} values, expected {rows} * {cols} = {}",
                rows * cols
            ),
            Self::ChunkCapacity { rows, capacity } => write!(
                f,
                "chunk has {rows} rows, expected at most capacity={capacity}"
            ),
            Self::Capacity {
                queued,
                incoming,
                capacity,
            } => write!(
                f,
                "merge would hold {} rows ({queued} queued + {incoming} incoming), \
                 expected at most capacity={capacity}",
                queued + incoming
            ),
            Self::Position { position, reason } => write!(f, "position {position:#x} {reason}"),
        }
    }
}

impl std::error::Error for QueueError {}
