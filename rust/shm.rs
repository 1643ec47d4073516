//! Memory shared between processes, and the two lock-free views of it the edge needs besides
//! the action queue (no pyo3 here).
//!
//! [`Memory`] is either private heap memory or a Linux memfd mapping (`MAP_SHARED`) that another
//! process maps by receiving the file descriptor (e.g. `subprocess.Popen(pass_fds=…)`): no name
//! in a file system, nothing left behind when both processes are gone. Every access goes
//! through atomics ([`Memory::words`] hands out `&[AtomicU64]`), so two processes touching the
//! same words is never a data race, and the orderings below are what the Rust/C++ memory model
//! promises on every architecture (not only x86's).
//!
//! * [`Seqlock`] — a newest-wins record: one writer never waits; a reader gets a consistent copy
//!   or `None` (a write was in progress) and decides itself whether to try again. The control
//!   process publishes the newest observation through one, the edge its park command through
//!   another.
//! * [`Ring`] — a single-producer single-consumer ring of fixed-size records; a full ring drops
//!   the record (and counts it) instead of waiting. The control process feeds the recorder
//!   through one.
//!
//! Counters and flags are plain [`AtomicU64`] words of a [`Memory`].

use std::fmt;
use std::io;
use std::sync::atomic::{fence, AtomicU64, Ordering};

mod mapping;

pub use mapping::Memory;

/// Bytes per word: every view is made of `AtomicU64` words.
pub const WORD: usize = 8;

/// Why a view could not be made (bounds or alignment), or a mapping failed.
#[derive(Debug)]
pub enum ShmError {
    /// An offset or size outside the memory, or not a multiple of 8.
    Layout(String),
    /// The operating system refused (memfd, mmap, fstat).
    Os(io::Error),
}

impl fmt::Display for ShmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Layout(msg) => f.write_str(msg),
            Self::Os(err) => write!(f, "{err}"),
        }
    }
}

impl std::error::Error for ShmError {}

impl From<io::Error> for ShmError {
    fn from(err: io::Error) -> Self {
        Self::Os(err)
    }
}

/// Words needed for `bytes` bytes.
pub fn words_for(bytes: usize) -> usize {
    bytes.div_ceil(WORD)
}

/// A newest-wins record over `1 + payload` words: a sequence word, then the payload.
///
/// One writer at a time (the caller serialises writers); any number of readers, in any
/// process. The writer never waits; a reader never blocks the writer.
pub struct Seqlock<'a> {
    seq: &'a AtomicU64,
    data: &'a [AtomicU64],
}

impl<'a> Seqlock<'a> {
    /// Words a seqlock with `payload_words` words of payload occupies.
    pub fn words(payload_words: usize) -> usize {
        1 + payload_words
    }

    /// A view of `words` (`1 + payload` words).
    pub fn new(words: &'a [AtomicU64]) -> Self {
        let (seq, data) = words.split_first().expect("a seqlock has a sequence word");
        Self { seq, data }
    }

    /// Payload capacity in words.
    pub fn payload_words(&self) -> usize {
        self.data.len()
    }

    /// Replaces the record (`payload` shorter than the capacity leaves the rest as it was).
    pub fn write(&self, payload: &[u64]) {
        let seq = self.seq.load(Ordering::Relaxed);
        // Odd: a write is in progress. The release fence orders it before the payload stores,
        // so a reader that sees any new payload word also sees the odd (or a later) sequence.
        self.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        for (word, value) in self.data.iter().zip(payload) {
            word.store(*value, Ordering::Relaxed);
        }
        self.seq.store(seq.wrapping_add(2), Ordering::Release);
    }

    /// One attempt at a consistent copy into `out`; the record's version on success.
    ///
    /// `None` while a write is in progress (or raced this read). Version 0 means never written.
    pub fn read(&self, out: &mut [u64]) -> Option<u64> {
        let before = self.seq.load(Ordering::Acquire);
        if before & 1 == 1 {
            return None;
        }
        for (slot, word) in out.iter_mut().zip(self.data) {
            *slot = word.load(Ordering::Relaxed);
        }
        // Orders the payload loads before the second sequence load (seqlock reader fence).
        fence(Ordering::Acquire);
        let after = self.seq.load(Ordering::Relaxed);
        (before == after).then_some(before / 2)
    }

    /// Number of completed writes (a cheap "anything new?" check).
    pub fn version(&self) -> u64 {
        self.seq.load(Ordering::Acquire) / 2
    }
}

/// Header words of a [`Ring`]: head, tail, dropped.
const RING_HEADER: usize = 4;

/// A single-producer single-consumer ring of fixed-size records.
///
/// Layout: `head` (records pushed), `tail` (records popped), `dropped`, one spare word, then
/// `capacity` slots of `record_words` words. The producer never waits: a push into a full ring
/// is dropped and counted.
pub struct Ring<'a> {
    head: &'a AtomicU64,
    tail: &'a AtomicU64,
    dropped: &'a AtomicU64,
    slots: &'a [AtomicU64],
    record_words: usize,
    capacity: u64,
}

impl<'a> Ring<'a> {
    /// Words a ring of `capacity` records of `record_words` words occupies.
    pub fn words(record_words: usize, capacity: usize) -> usize {
        RING_HEADER + record_words * capacity
    }

    /// A view of `words`, which must be exactly [`Ring::words`]`(record_words, capacity)` long.
    pub fn new(words: &'a [AtomicU64], record_words: usize, capacity: usize) -> Self {
        assert!(
            record_words > 0 && capacity > 0,
            "a ring needs records and slots"
        );
        assert_eq!(words.len(), Self::words(record_words, capacity));
        Self {
            head: &words[0],
            tail: &words[1],
            dropped: &words[2],
            slots: &words[RING_HEADER..],
            record_words,
            capacity: capacity as u64,
        }
    }

    fn slot(&self, index: u64) -> &[AtomicU64] {
        let at = (index % self.capacity) as usize * self.record_words;
        &self.slots[at..at + self.record_words]
    }

    /// Producer: appends `record`; false (and counted) when the ring is full.
    pub fn push(&self, record: &[u64]) -> bool {
        let head = self.head.load(Ordering::Relaxed);
        // Acquire: the consumer's reads of the slot we are about to reuse happened before.
        let tail = self.tail.load(Ordering::Acquire);
        if head.wrapping_sub(tail) >= self.capacity {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let slot = self.slot(head);
        for (i, word) in slot.iter().enumerate() {
            word.store(record.get(i).copied().unwrap_or(0), Ordering::Relaxed);
        }
        self.head.store(head.wrapping_add(1), Ordering::Release);
        true
    }

    /// Consumer: takes the oldest record into `out`; false when the ring is empty.
    pub fn pop(&self, out: &mut [u64]) -> bool {
        let tail = self.tail.load(Ordering::Relaxed);
        let head = self.head.load(Ordering::Acquire);
        if tail == head {
            return false;
        }
        for (slot, word) in out.iter_mut().zip(self.slot(tail)) {
            *slot = word.load(Ordering::Relaxed);
        }
        self.tail.store(tail.wrapping_add(1), Ordering::Release);
        true
    }

    /// Records waiting to be popped.
    pub fn len(&self) -> usize {
        let tail = self.tail.load(Ordering::Acquire);
        self.head.load(Ordering::Acquire).wrapping_sub(tail) as usize
    }

    /// Whether no record waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Records dropped because the ring was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Words per record.
    pub fn record_words(&self) -> usize {
        self.record_words
    }
}

#[cfg(test)]
mod tests;
