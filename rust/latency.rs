//! Sliding-window latency samples on the monotonic clock (no pyo3 here).

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// Why a tracker call was rejected.
#[derive(Clone, Debug, PartialEq)]
pub enum LatencyError {
    /// Window of zero samples.
    Window(usize),
    /// Negative sample.
    Negative(i64),
    /// Quantile outside `[0, 1]` (or NaN).
    Quantile(f64),
}

impl fmt::Display for LatencyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Window(w) => write!(f, "window is {w}, expected window >= 1"),
            Self::Negative(ns) => write!(f, "latency sample is {ns} ns, expected >= 0"),
            Self::Quantile(q) => write!(f, "quantile is {q}, expected 0 <= q <= 1"),
        }
    }
}

impl std::error::Error for LatencyError {}

/// The last `window` samples plus a monotonic deque for the sliding maximum.
#[derive(Debug)]
pub struct Window {
    window: usize,
    samples: VecDeque<u64>,
    /// `(sequence number, value)` with strictly decreasing values: the front is the maximum
    /// of the window; each sample enters and leaves once, so `add` is O(1) amortized.
    maxima: VecDeque<(u64, u64)>,
    added: u64,
}

impl Window {
    /// An empty window of `window >= 1` samples.
    pub fn new(window: usize) -> Result<Self, LatencyError> {
        if window == 0 {
            return Err(LatencyError::Window(window));
        }
        Ok(Self {
            window,
            samples: VecDeque::with_capacity(window),
            maxima: VecDeque::new(),
            added: 0,
        })
    }

    /// Adds one sample, evicting the oldest when the window is full.
    pub fn add(&mut self, ns: u64) {
        if self.samples.len() == self.window {
            self.samples.pop_front();
        }
        self.samples.push_back(ns);
        let seq = self.added;
        self.added += 1;
        while self.maxima.back().is_some_and(|&(_, v)| v <= ns) {
            self.maxima.pop_back();
        }
        self.maxima.push_back((seq, ns));
        // Sequence numbers `<= seq - window` have left the window.
        while self
            .maxima
            .front()
            .is_some_and(|&(s, _)| s + self.window as u64 <= seq)
        {
            self.maxima.pop_front();
        }
    }

    /// Maximum over the window.
    pub fn max(&self) -> Option<u64> {
        self.maxima.front().map(|&(_, v)| v)
    }

    /// Samples currently in the window.
    pub fn count(&self) -> usize {
        self.samples.len()
    }

    /// Window size.
    pub fn window(&self) -> usize {
        self.window
    }

    /// Forgets every sample.
    pub fn reset(&mut self) {
        self.samples.clear();
        self.maxima.clear();
    }

    /// Copies the samples (oldest first) into `out`.
    pub fn copy_into(&self, out: &mut Vec<u64>) {
        out.clear();
        out.extend(self.samples.iter().copied());
    }
}

/// Checks that `q` is a quantile in `[0, 1]`.
pub fn check_quantile(q: f64) -> Result<(), LatencyError> {
    if (0.0..=1.0).contains(&q) {
        Ok(())
    } else {
        Err(LatencyError::Quantile(q))
    }
}

/// Nearest-rank percentile of ascending `sorted` (non-empty): the smallest sample with at
/// least `q * n` samples at or below it, i.e. `sorted[max(ceil(q * n), 1) - 1]`.
/// `q = 0` gives the minimum, `q = 1` the maximum; the result is always a real sample.
pub fn nearest_rank(sorted: &[u64], q: f64) -> u64 {
    debug_assert!(!sorted.is_empty());
    let n = sorted.len();
    // `q * n` is in [0, n]; the float → int cast saturates and the clamp keeps it in range.
    let rank = ((q * n as f64).ceil() as usize).clamp(1, n);
    sorted[rank - 1]
}

/// Thread-safe tracker; its mutex is only ever held for O(1) work or an O(window) copy.
#[derive(Debug)]
pub struct LatencyTracker {
    window: usize,
    inner: Mutex<Window>,
}

impl LatencyTracker {
    /// A tracker over the last `window >= 1` samples.
    pub fn new(window: usize) -> Result<Self, LatencyError> {
        Ok(Self {
            window,
            inner: Mutex::new(Window::new(window)?),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Window> {
        // Every `Window` method leaves it consistent before it can panic, so a poisoned
        // lock holds valid data.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds one sample in nanoseconds; negative samples are rejected.
    pub fn add(&self, ns: i64) -> Result<(), LatencyError> {
        let ns = u64::try_from(ns).map_err(|_| LatencyError::Negative(ns))?;
        self.lock().add(ns);
        Ok(())
    }

    /// Sliding-window maximum.
    pub fn max(&self) -> Option<u64> {
        self.lock().max()
    }

    /// Samples currently in the window.
    pub fn count(&self) -> usize {
        self.lock().count()
    }

    /// Window size.
    pub fn window(&self) -> usize {
        self.window
    }

    /// Forgets every sample.
    pub fn reset(&self) {
        self.lock().reset();
    }

    /// Nearest-rank percentiles for every `q` from one sort; `None` if there is no sample.
    ///
    /// The samples are copied under the lock and sorted after releasing it.
    pub fn percentiles(&self, qs: &[f64]) -> Result<Option<Vec<u64>>, LatencyError> {
        for &q in qs {
            check_quantile(q)?;
        }
        let mut samples = Vec::new();
        self.lock().copy_into(&mut samples);
        if samples.is_empty() {
            return Ok(None);
        }
        samples.sort_unstable();
        Ok(Some(
            qs.iter().map(|&q| nearest_rank(&samples, q)).collect(),
        ))
    }

    /// Nearest-rank percentile; `None` if there is no sample.
    pub fn percentile(&self, q: f64) -> Result<Option<u64>, LatencyError> {
        Ok(self.percentiles(&[q])?.map(|v| v[0]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn empty_and_errors() {
        assert_eq!(LatencyTracker::new(0).unwrap_err(), LatencyError::Window(0));
        let t = LatencyTracker::new(3).unwrap();
        assert_eq!(t.max(), None);
        assert_eq!(t.percentile(0.5), Ok(None));
        assert_eq!(t.count(), 0);
        assert_eq!(t.add(-1), Err(LatencyError::Negative(-1)));
        assert_eq!(
            t.percentile(1.5).unwrap_err().to_string(),
            "quantile is 1.5, expected 0 <= q <= 1"
        );
        assert!(t.percentile(f64::NAN).is_err());
        assert!(t.percentiles(&[0.5, -0.1]).is_err());
    }

    #[test]
    fn sliding_max_forgets_old_samples() {
        let t = LatencyTracker::new(3).unwrap();
        for ns in [10, 50, 20] {
            t.add(ns).unwrap();
        }
        assert_eq!(t.max(), Some(50));
        t.add(5).unwrap();
        assert_eq!(t.max(), Some(50));
        t.add(6).unwrap();
        assert_eq!(t.max(), Some(20));
        t.add(7).unwrap();
        assert_eq!(t.max(), Some(7));
        assert_eq!(t.count(), 3);
        t.reset();
        assert_eq!((t.count(), t.max()), (0, None));
        t.add(1).unwrap();
        assert_eq!(t.max(), Some(1));
    }

    #[test]
    fn nearest_rank_definition() {
        let sorted: Vec<u64> = (1..=10).map(|v| v * 10).collect();
        assert_eq!(nearest_rank(&sorted, 0.0), 10);
        assert_eq!(nearest_rank(&sorted, 0.1), 10);
        assert_eq!(nearest_rank(&sorted, 0.11), 20);
        assert_eq!(nearest_rank(&sorted, 0.5), 50);
        assert_eq!(nearest_rank(&sorted, 0.99), 100);
        assert_eq!(nearest_rank(&sorted, 1.0), 100);
        assert_eq!(nearest_rank(&[7], 0.3), 7);
    }

    proptest! {
        #[test]
        fn matches_brute_force(
            window in 1usize..12,
            samples in proptest::collection::vec(0i64..1_000, 1..80),
            q in 0.0f64..=1.0,
        ) {
            let t = LatencyTracker::new(window).unwrap();
            for (i, &ns) in samples.iter().enumerate() {
                t.add(ns).unwrap();
                let lo = (i + 1).saturating_sub(window);
                let mut live: Vec<u64> = samples[lo..=i].iter().map(|&v| v as u64).collect();
                prop_assert_eq!(t.max(), live.iter().copied().max());
                prop_assert_eq!(t.count(), live.len());
                live.sort_unstable();
                let rank = ((q * live.len() as f64).ceil() as usize).max(1);
                prop_assert_eq!(t.percentile(q).unwrap(), Some(live[rank - 1]));
            }
        }
    }
}
