use super::layout::{CURSOR, D_BASE};
use super::merge::{Prepared, Timing};
use super::plan::Plan;
use super::*;
use proptest::prelude::*;
use std::sync::atomic::AtomicU64;
use std::thread;

const DIM: usize = 2;

/// A `(t, DIM)` chunk whose row `r` is `[first + r, -(first + r)]`; processed = original + 0.5.
fn chunk(first: usize, t: usize) -> (Vec<f32>, Vec<f32>) {
    let original: Vec<f32> = (first..first + t)
        .flat_map(|v| [v as f32, -(v as f32)])
        .collect();
    let processed = original.iter().map(|v| v + 0.5).collect();
    (original, processed)
}

fn view(data: &[f32]) -> ChunkRef<'_> {
    ChunkRef {
        data,
        rows: data.len() / DIM,
        cols: DIM,
    }
}

fn merge(
    q: &ActionQueue,
    first: usize,
    t: usize,
    real_delay: i64,
    idx_before: Option<i64>,
    prov: Option<Provenance>,
) -> Result<usize, QueueError> {
    let (o, p) = chunk(first, t);
    q.merge(view(&o), view(&p), real_delay, idx_before, prov)
}

/// `prov(seq_id)` as its row `step` carries it.
fn at(seq_id: u64, step: u64) -> Provenance {
    Provenance {
        step,
        ..prov(seq_id)
    }
}

fn prov(seq_id: u64) -> Provenance {
    Provenance {
        session_id: [7; 16],
        seq_id,
        episode_id: 3,
        obs_mono_ns: 1_000 + seq_id as i64,
        step: 0,
    }
}

fn pop_with<R>(q: &ActionQueue, f: impl FnOnce(&[f32], Option<Provenance>) -> R) -> Option<R> {
    let mut row = vec![0.0; q.action_dim()];
    q.pop_into(&mut row).map(|p| f(&row, p))
}

/// First component of the next processed action, minus the 0.5 offset.
fn pop_value(q: &ActionQueue) -> Option<usize> {
    q.pop().map(|row| (row[0] - 0.5) as usize)
}

#[test]
fn empty_queue() {
    let q = ActionQueue::new(DIM, true, 16).unwrap();
    assert_eq!(q.pop(), None);
    assert_eq!(q.qsize(), 0);
    assert!(q.is_empty());
    assert_eq!(q.action_index(), 0);
    assert_eq!(q.left_over_original(), None);
    assert_eq!(q.left_over_processed(), None);
    assert_eq!(q.peek_provenance(), None);
}

#[test]
fn rejects_bad_config() {
    let message = |r: Result<ActionQueue, QueueError>| r.unwrap_err().to_string();
    assert_eq!(
        message(ActionQueue::new(0, true, 4)),
        "action_dim is 0, expected action_dim >= 1"
    );
    assert_eq!(
        message(ActionQueue::new(2, true, 0)),
        format!("capacity is 0, expected 1 <= capacity <= {MAX_CAPACITY}")
    );
    assert!(ActionQueue::new(2, true, MAX_CAPACITY + 1).is_err());
    assert!(ActionQueue::new(MAX_ACTION_DIM + 1, true, 1).is_err());
}

#[test]
fn rtc_replace_trims_delay_and_resets_index() {
    let q = ActionQueue::new(DIM, true, 64).unwrap();
    assert_eq!(merge(&q, 0, 10, 0, None, None), Ok(0));
    assert_eq!(pop_value(&q), Some(0));
    assert_eq!(pop_value(&q), Some(1));
    assert_eq!(q.action_index(), 2);
    assert_eq!(merge(&q, 100, 50, 5, None, None), Ok(5));
    assert_eq!(q.qsize(), 45);
    assert_eq!(q.action_index(), 0);
    assert_eq!(pop_value(&q), Some(105));
    let left = q.left_over_original().unwrap();
    assert_eq!(left.rows, 44);
    assert_eq!(&left.values[..2], &[106.0, -106.0]);
}

#[test]
fn rtc_delay_clamped_to_chunk() {
    let q = ActionQueue::new(DIM, true, 64).unwrap();
    assert_eq!(merge(&q, 0, 10, 100, None, None), Ok(10));
    assert_eq!(q.qsize(), 0);
    // Something was merged, so leftovers are empty arrays, not None (LeRobot semantics).
    assert_eq!(
        q.left_over_original(),
        Some(LeftOver {
            values: vec![],
            rows: 0
        })
    );
}

#[test]
fn negative_real_delay_is_zero() {
    let q = ActionQueue::new(DIM, true, 64).unwrap();
    assert_eq!(merge(&q, 0, 10, -3, None, None), Ok(0));
    assert_eq!(q.qsize(), 10);
}

#[test]
fn idx_before_caps_delay_at_consumed() {
    let q = ActionQueue::new(DIM, true, 64).unwrap();
    merge(&q, 0, 10, 0, None, None).unwrap();
    for _ in 0..5 {
        q.pop().unwrap();
    }
    // Consumed 5 since index 0, latency says 3: mismatch, min(3, 5) = 3.
    assert_eq!(merge(&q, 100, 50, 3, Some(0), None), Ok(3));
    assert_eq!(q.statistics().delay_mismatches, 1);
    // Queue ran dry: consumed 0 since the snapshot, latency says 5 -> trim 0 (PR #4454).
    assert_eq!(merge(&q, 200, 50, 5, Some(0), None), Ok(0));
    assert_eq!(pop_value(&q), Some(200));
    assert_eq!(q.statistics().delay_mismatches, 2);
    // Matching delay: no mismatch.
    for _ in 0..3 {
        q.pop().unwrap();
    }
    assert_eq!(merge(&q, 300, 50, 4, Some(0), None), Ok(4));
    assert_eq!(q.statistics().delay_mismatches, 2);
}

#[test]
fn resolve_delay_table() {
    let r = |d, b, i| resolve_delay(d, b, i);
    let res = |delay, mismatch| DelayResolution { delay, mismatch };
    assert_eq!(r(5, None, 0), res(5, false));
    assert_eq!(r(-5, None, 0), res(0, false));
    assert_eq!(r(5, Some(3), 8), res(5, false));
    assert_eq!(r(5, Some(3), 4), res(1, true));
    assert_eq!(r(2, Some(3), 9), res(2, true));
    // idx_before ahead of the index (a merge reset it): nothing consumed.
    assert_eq!(r(2, Some(9), 3), res(0, true));
    assert_eq!(r(0, Some(9), 3), res(0, false));
    assert_eq!(r(-1, Some(i64::MIN), u64::MAX >> 1).delay, 0);
}

#[test]
fn plan_encoding_round_trips() {
    for plan in [
        Plan::Fixed,
        Plan::Skip { seen: 3, kept: 9 },
        Plan::Trim {
            real_delay: -4,
            idx_before: Some(-7),
        },
        Plan::Trim {
            real_delay: 5,
            idx_before: None,
        },
        Plan::Since { from: 11 },
    ] {
        assert_eq!(Plan::decode(plan.encode()), plan);
    }
}

#[test]
fn append_keeps_unconsumed_and_provenance() {
    let q = ActionQueue::new(DIM, false, 64).unwrap();
    assert_eq!(merge(&q, 0, 3, 10, None, Some(prov(1))), Ok(0));
    assert_eq!(q.qsize(), 3);
    assert_eq!(pop_with(&q, |_, p| p), Some(Some(at(1, 0))));
    merge(&q, 10, 2, 0, None, Some(prov(2))).unwrap();
    assert_eq!(q.action_index(), 0);
    assert_eq!(q.qsize(), 4);
    let got: Vec<_> = std::iter::from_fn(|| pop_with(&q, |row, p| (row[0] - 0.5, p))).collect();
    assert_eq!(
        got,
        vec![
            (1.0, Some(at(1, 1))),
            (2.0, Some(at(1, 2))),
            (10.0, Some(at(2, 0))),
            (11.0, Some(at(2, 1)))
        ]
    );
    assert_eq!(q.statistics().actions_consumed, 5);
}

#[test]
fn odd_dimensions_and_signs_round_trip() {
    let q = ActionQueue::new(3, true, 8).unwrap();
    let values = [1.5f32, -0.0, f32::MAX, f32::MIN_POSITIVE, -2.25, f32::NAN];
    let c = ChunkRef {
        data: &values,
        rows: 2,
        cols: 3,
    };
    q.merge(c, c, 0, None, None).unwrap();
    let first = q.pop().unwrap();
    assert_eq!(
        first.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        values[..3].iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    assert!(q.pop().unwrap()[2].is_nan());
}

#[test]
fn rejected_merges_change_nothing() {
    let q = ActionQueue::new(DIM, false, 8).unwrap();
    merge(&q, 0, 5, 0, None, Some(prov(1))).unwrap();
    q.pop().unwrap();
    let before = (q.qsize(), q.action_index(), q.left_over_original());
    let (o, p) = chunk(50, 5);
    let wide = vec![0.0; 15];
    let errors = [
        q.merge(view(&o), view(&p), 0, None, None).unwrap_err(),
        q.merge(
            ChunkRef {
                data: &wide,
                rows: 5,
                cols: 3,
            },
            view(&p),
            0,
            None,
            None,
        )
        .unwrap_err(),
        q.merge(view(&o), view(&p[..4]), 0, None, None).unwrap_err(),
        q.merge(view(&[]), view(&[]), 0, None, None).unwrap_err(),
        q.merge(
            ChunkRef {
                data: &o[..3],
                rows: 2,
                cols: 2,
            },
            view(&p),
            0,
            None,
            None,
        )
        .unwrap_err(),
    ];
    assert_eq!(
        errors[0].to_string(),
        "merge would hold 9 rows (4 queued + 5 incoming), expected at most capacity=8"
    );
    assert_eq!(
        errors[1].to_string(),
        "original has shape (5, 3), expected (T, 2)"
    );
    assert_eq!(
        errors[2].to_string(),
        "processed has 2 rows, original has 5; expected the same T for both"
    );
    assert_eq!(
        errors[3].to_string(),
        "original has shape (0, 2), expected T >= 1 rows"
    );
    assert_eq!(
        errors[4].to_string(),
        "original buffer holds 3 values, expected 2 * 2 = 4"
    );
    assert_eq!(
        before,
        (q.qsize(), q.action_index(), q.left_over_original())
    );
    let stats = q.statistics();
    assert_eq!((stats.merges, stats.rejected_merges), (1, 5));
    assert_eq!(pop_value(&q), Some(1));
}

#[test]
fn rtc_capacity_counts_chunk_rows() {
    let q = ActionQueue::new(DIM, true, 4).unwrap();
    assert_eq!(
        merge(&q, 0, 5, 3, None, None).unwrap_err().to_string(),
        "chunk has 5 rows, expected at most capacity=4"
    );
    assert_eq!(merge(&q, 0, 4, 0, None, None), Ok(0));
}

#[test]
fn clear_resets_everything() {
    let q = ActionQueue::new(DIM, false, 64).unwrap();
    merge(&q, 0, 5, 0, None, Some(prov(1))).unwrap();
    q.pop().unwrap();
    q.clear();
    assert_eq!(q.qsize(), 0);
    assert_eq!(q.action_index(), 0);
    assert_eq!(q.left_over_processed(), None);
    assert_eq!(q.peek_provenance(), None);
    assert_eq!(q.pop(), None);
    merge(&q, 10, 2, 0, None, None).unwrap();
    assert_eq!(pop_value(&q), Some(10));
}

#[test]
fn discard_chunk_spares_a_newer_chunk() {
    let q = ActionQueue::new(DIM, false, 64).unwrap();
    assert!(
        !q.discard_chunk(None),
        "a fresh queue has nothing to discard"
    );
    merge(&q, 0, 3, 0, None, Some(prov(1))).unwrap();
    // The head belongs to chunk 1: discarding chunk 2 does nothing.
    assert!(!q.discard_chunk(Some(prov(2))));
    assert_eq!(q.qsize(), 3);
    assert!(q.discard_chunk(Some(prov(1))));
    assert!(q.is_empty());
    assert_eq!(q.left_over_original(), None);
    // Unlabeled heads and empty queues are always discarded (the staleness rule).
    merge(&q, 5, 2, 0, None, None).unwrap();
    assert!(q.discard_chunk(Some(prov(9))));
    assert!(!q.discard_chunk(None), "already cleared");
    merge(&q, 7, 1, 0, None, Some(prov(3))).unwrap();
    assert!(!q.discard_chunk(None));
    assert_eq!(pop_value(&q), Some(7));
}

#[test]
fn set_rtc_switches_the_merge_mode() {
    let q = ActionQueue::new(DIM, false, 64).unwrap();
    merge(&q, 0, 3, 0, None, None).unwrap();
    merge(&q, 10, 3, 0, None, None).unwrap();
    assert_eq!(q.qsize(), 6);
    q.set_rtc(true);
    assert!(q.rtc());
    assert_eq!(merge(&q, 20, 4, 1, None, None), Ok(1));
    assert_eq!(q.qsize(), 3);
    assert_eq!(pop_value(&q), Some(21));
}

#[test]
fn ring_wraps_many_times() {
    let q = ActionQueue::new(DIM, false, 5).unwrap();
    let mut next = 0;
    let mut expected = 0;
    for i in 0..10_000 {
        let t = 1 + i % 3;
        if q.qsize() + t <= 5 {
            merge(&q, next, t, 0, None, Some(prov(i as u64))).unwrap();
            next += t;
        }
        if let Some(v) = pop_value(&q) {
            assert_eq!(v, expected);
            expected += 1;
        }
    }
    assert!(expected > 9_000);
}

#[test]
fn attach_sees_the_same_queue_and_checks_the_magic() {
    let memory = Arc::new(Memory::shared(ActionQueue::size_bytes(DIM, 8).unwrap() + 64).unwrap());
    let producer = ActionQueue::create(memory.clone(), 64, DIM, true, 8).unwrap();
    let other = Arc::new(Memory::attach(memory.fd().unwrap()).unwrap());
    let consumer = ActionQueue::attach(other.clone(), 64).unwrap();
    assert_eq!((consumer.action_dim(), consumer.capacity()), (DIM, 8));
    assert!(consumer.rtc());
    merge(&producer, 0, 4, 0, None, Some(prov(1))).unwrap();
    assert_eq!(pop_value(&consumer), Some(0));
    assert_eq!(producer.action_index(), 1);
    assert_eq!(
        ActionQueue::attach(other, 0).unwrap_err().to_string(),
        "no action queue at offset 0 of the shared memory (bad magic)"
    );
}

/// Sequential reference model: LeRobot's queue with PR #4454's delay rule and a capacity.
#[derive(Default)]
struct Model {
    rtc: bool,
    capacity: usize,
    queue: Option<Vec<(usize, Option<Provenance>)>>,
    last_index: usize,
}

impl Model {
    fn merge(
        &mut self,
        first: usize,
        t: usize,
        real_delay: i64,
        idx_before: Option<i64>,
        prov: Option<Provenance>,
    ) -> Option<usize> {
        let label = |r: usize| {
            prov.map(|p| Provenance {
                step: r as u64,
                ..p
            })
        };
        let rows: Vec<_> = (first..first + t)
            .enumerate()
            .map(|(r, v)| (v, label(r)))
            .collect();
        let delay = resolve_delay(real_delay, idx_before, self.last_index as u64).delay as usize;
        if self.rtc {
            if t > self.capacity {
                return None;
            }
            let trimmed = delay.min(t);
            self.queue = Some(rows[trimmed..].to_vec());
            self.last_index = 0;
            Some(trimmed)
        } else {
            let mut kept = match &self.queue {
                Some(queue) => queue[self.last_index..].to_vec(),
                None => Vec::new(),
            };
            if kept.len() + t > self.capacity {
                return None;
            }
            kept.extend(rows);
            self.queue = Some(kept);
            self.last_index = 0;
            Some(0)
        }
    }

    fn pop(&mut self) -> Option<(usize, Option<Provenance>)> {
        let queue = self.queue.as_ref()?;
        let item = *queue.get(self.last_index)?;
        self.last_index += 1;
        Some(item)
    }

    fn clear(&mut self) {
        self.queue = None;
        self.last_index = 0;
    }

    fn head(&self) -> Option<Option<Provenance>> {
        self.queue
            .as_ref()
            .and_then(|queue| queue.get(self.last_index))
            .map(|(_, p)| *p)
    }

    fn discard(&mut self, prov: Option<Provenance>) -> bool {
        let cleared = self.queue.is_some()
            && !matches!(self.head(), Some(Some(p)) if !prov.is_some_and(|q| p.same_chunk(&q)));
        if cleared {
            self.clear();
        }
        cleared
    }

    fn left_over(&self) -> Option<Vec<usize>> {
        self.queue
            .as_ref()
            .map(|q| q[self.last_index..].iter().map(|(v, _)| *v).collect())
    }
}

#[derive(Clone, Debug)]
enum Op {
    Merge {
        t: usize,
        real_delay: i64,
        idx_before: Option<i64>,
        labeled: bool,
    },
    Get,
    Clear,
    Discard {
        back: u64,
    },
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1usize..9, -2i64..12, proptest::option::of(-1i64..12), any::<bool>()).prop_map(
            |(t, real_delay, idx_before, labeled)| Op::Merge { t, real_delay, idx_before, labeled }
        ),
        6 => Just(Op::Get),
        1 => Just(Op::Clear),
        1 => (0u64..3).prop_map(|back| Op::Discard { back }),
    ]
}

fn check_state(q: &ActionQueue, model: &Model) -> Result<(), TestCaseError> {
    let expected_left = model.left_over();
    prop_assert_eq!(q.action_index(), model.last_index as u64);
    prop_assert_eq!(q.qsize(), expected_left.as_ref().map_or(0, Vec::len));
    let left = q.left_over_original().map(|l| {
        assert_eq!(l.values.len(), l.rows * DIM);
        l.values.iter().step_by(DIM).map(|v| *v as usize).collect()
    });
    prop_assert_eq!(left, expected_left.clone());
    let left_processed = q.left_over_processed().map(|l| {
        l.values
            .iter()
            .step_by(DIM)
            .map(|v| (v - 0.5) as usize)
            .collect()
    });
    prop_assert_eq!(left_processed, expected_left);
    prop_assert_eq!(q.peek_provenance(), model.head().flatten());
    Ok(())
}

fn pop_checked(q: &ActionQueue) -> Option<(usize, Option<Provenance>)> {
    pop_with(q, |row, p| {
        assert_eq!(row[1], -row[0] + 1.0);
        ((row[0] - 0.5) as usize, p)
    })
}

fn check_against_model(rtc: bool, capacity: usize, ops: &[Op]) -> Result<(), TestCaseError> {
    let q = ActionQueue::new(DIM, rtc, capacity).unwrap();
    let mut model = Model {
        rtc,
        capacity,
        ..Model::default()
    };
    let mut next_value = 0;
    for (seq, op) in ops.iter().enumerate() {
        match *op {
            Op::Merge {
                t,
                real_delay,
                idx_before,
                labeled,
            } => {
                let p = labeled.then(|| prov(seq as u64));
                let got = merge(&q, next_value, t, real_delay, idx_before, p).ok();
                let want = model.merge(next_value, t, real_delay, idx_before, p);
                prop_assert_eq!(got, want);
                next_value += t;
            }
            Op::Get => prop_assert_eq!(pop_checked(&q), model.pop()),
            Op::Clear => {
                q.clear();
                model.clear();
            }
            Op::Discard { back } => {
                let p = Some(prov((seq as u64).saturating_sub(back)));
                prop_assert_eq!(q.discard_chunk(p), model.discard(p));
            }
        }
        check_state(&q, &model)?;
    }
    Ok(())
}

/// Steps of a merge that a stalled producer may be caught between, plus consumer actions.
#[derive(Clone, Debug)]
enum Step {
    /// Producer: write rows and descriptor, then seal (the linearization point), and stall.
    MergeAndStall {
        t: usize,
        real_delay: i64,
    },
    /// Producer: install the successor (if nobody did) and finish the stalled merge.
    Resume,
    Get,
    Clear,
}

fn step_strategy() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (1usize..6, 0i64..6).prop_map(|(t, real_delay)| Step::MergeAndStall { t, real_delay }),
        2 => Just(Step::Resume),
        5 => Just(Step::Get),
        1 => Just(Step::Clear),
    ]
}

/// Interleaves consumer calls between a merge's seal and its install: the consumer installs the
/// successor itself, and the result equals the sequential model with the merge applied at the
/// seal. This runs the real implementation's steps in every order proptest finds.
fn check_stalled_producer(rtc: bool, steps: &[Step]) -> Result<(), TestCaseError> {
    const CAPACITY: usize = 12;
    let q = ActionQueue::new(DIM, rtc, CAPACITY).unwrap();
    let words = q.words();
    let mut model = Model {
        rtc,
        capacity: CAPACITY,
        ..Model::default()
    };
    let mut stalled: Option<(Prepared, u64)> = None;
    let mut next_value = 0;
    for (seq, step) in steps.iter().enumerate() {
        match *step {
            Step::MergeAndStall { t, real_delay } => {
                if stalled.is_some() {
                    continue; // producers serialise: one merge at a time
                }
                let p = Some(prov(seq as u64));
                let idx_before = Some(q.action_index() as i64);
                let (o, pr) = chunk(next_value, t);
                let want = model.merge(next_value, t, real_delay, idx_before, p);
                let timing = Timing::Latency {
                    real_delay,
                    idx_before,
                };
                match q.prepare(words, view(&o), view(&pr), timing, p) {
                    Ok(prepared) => {
                        prop_assert!(want.is_some());
                        stalled = Some((prepared, q.seal(words)));
                    }
                    Err(_) => prop_assert!(want.is_none()),
                }
                next_value += t;
            }
            Step::Resume => {
                if let Some((prepared, sealed_word)) = stalled.take() {
                    q.install(words, sealed_word);
                    q.finish(words, prepared, sealed_word);
                }
            }
            Step::Get => prop_assert_eq!(pop_checked(&q), model.pop()),
            Step::Clear => {
                q.clear();
                model.clear();
            }
        }
        // Reading the state helps a stalled merge along; leave it stalled for the next step.
        if stalled.is_none() {
            check_state(&q, &model)?;
        }
    }
    Ok(())
}

proptest! {
    #[test]
    fn append_matches_model(ops in proptest::collection::vec(op_strategy(), 1..160)) {
        check_against_model(false, 24, &ops)?;
    }

    #[test]
    fn replace_matches_model(ops in proptest::collection::vec(op_strategy(), 1..160)) {
        check_against_model(true, 6, &ops)?;
    }

    #[test]
    fn stalled_producer_append(steps in proptest::collection::vec(step_strategy(), 1..120)) {
        check_stalled_producer(false, &steps)?;
    }

    #[test]
    fn stalled_producer_replace(steps in proptest::collection::vec(step_strategy(), 1..120)) {
        check_stalled_producer(true, &steps)?;
    }
}

/// A get claims a row, then stalls before copying it while two merges replace the ring under it:
/// the copy is detected as overwritten and the get takes the current action instead.
#[test]
fn a_row_overwritten_during_its_copy_is_not_returned() {
    let q = ActionQueue::new(DIM, true, 4).unwrap();
    let words = q.words();
    merge(&q, 0, 4, 0, None, None).unwrap();
    // The claim, as `pop_into` does it.
    let word = words[CURSOR].load(Ordering::Acquire);
    let d = q.layout.descriptor(generation(word));
    let pos = words[d + D_BASE].load(Ordering::Relaxed) + start(word) + index(word);
    assert!(words[CURSOR]
        .compare_exchange(word, word + 1, Ordering::AcqRel, Ordering::Acquire)
        .is_ok());
    assert!(!q.overwritten(words, pos));
    merge(&q, 100, 4, 0, None, None).unwrap(); // ring positions 4..8
    assert!(
        !q.overwritten(words, pos),
        "one merge never reaches a live row"
    );
    merge(&q, 200, 4, 0, None, None).unwrap(); // positions 8..12 overwrite 0..4
    assert!(q.overwritten(words, pos));
    // The real path: a stale claim is redone against the live generation.
    assert_eq!(pop_value(&q), Some(200));
}

/// Producer merges tagged chunks while the consumer drains at full speed: every action is
/// seen exactly once and in order, and the index only drops when a merge happened.
#[test]
fn concurrent_append_loses_and_duplicates_nothing() {
    const CHUNKS: usize = 3_000;
    let q = Arc::new(ActionQueue::new(1, false, 1 << 16).unwrap());
    // Merges started (bumped before `merge`) and finished (bumped after it returns): a merge
    // that resets the index between two index reads was started before the second read
    // and not finished before the first one.
    let started = Arc::new(AtomicU64::new(0));
    let finished = Arc::new(AtomicU64::new(0));
    let producer = {
        let (q, started, finished) = (q.clone(), started.clone(), finished.clone());
        thread::spawn(move || {
            let mut next = 0usize;
            for i in 0..CHUNKS {
                let t = 1 + i % 7;
                let rows: Vec<f32> = (next..next + t).map(|v| v as f32).collect();
                let c = ChunkRef {
                    data: &rows,
                    rows: t,
                    cols: 1,
                };
                started.fetch_add(1, Ordering::SeqCst);
                while q.merge(c, c, 3, Some(0), Some(prov(i as u64))).is_err() {
                    thread::yield_now(); // full: wait for the consumer
                }
                finished.fetch_add(1, Ordering::SeqCst);
                next += t;
            }
            next
        })
    };
    let mut seen = Vec::new();
    let (mut last_index, mut last_finished) = (0u64, 0u64);
    loop {
        let finished_before = finished.load(Ordering::SeqCst);
        let index = q.action_index();
        let started_after = started.load(Ordering::SeqCst);
        if index < last_index {
            assert!(
                started_after > last_finished,
                "index went back without a merge"
            );
        }
        (last_index, last_finished) = (index, finished_before);
        match pop_with(&q, |row, p| (row[0] as usize, p.unwrap().seq_id)) {
            Some(item) => seen.push(item),
            None if finished_before == CHUNKS as u64 => break,
            None => std::hint::spin_loop(),
        }
    }
    let total = producer.join().unwrap();
    assert_eq!(seen.len(), total);
    assert!(seen.iter().enumerate().all(|(i, (v, _))| *v == i));
    assert!(seen.windows(2).all(|w| w[0].1 <= w[1].1));
    assert_eq!(q.statistics().actions_consumed as usize, total);
}

/// Several consumers and producers at once (append): the union of what consumers saw is
/// exactly what was produced, with no duplicates.
#[test]
fn concurrent_many_consumers() {
    const PER_PRODUCER: usize = 500;
    let q = Arc::new(ActionQueue::new(1, false, 1 << 12).unwrap());
    let producers: Vec<_> = (0..2)
        .map(|p| {
            let q = Arc::clone(&q);
            thread::spawn(move || {
                for i in 0..PER_PRODUCER {
                    let v = [(p * PER_PRODUCER + i) as f32];
                    let c = ChunkRef {
                        data: &v,
                        rows: 1,
                        cols: 1,
                    };
                    q.merge(c, c, 0, None, None).unwrap();
                }
            })
        })
        .collect();
    let consumed = Arc::new(AtomicU64::new(0));
    let consumers: Vec<_> = (0..3)
        .map(|_| {
            let q = Arc::clone(&q);
            let consumed = Arc::clone(&consumed);
            thread::spawn(move || {
                let mut mine = Vec::new();
                while consumed.load(Ordering::Acquire) < (2 * PER_PRODUCER) as u64 {
                    if let Some(row) = q.pop() {
                        mine.push(row[0] as usize);
                        consumed.fetch_add(1, Ordering::AcqRel);
                    } else {
                        std::hint::spin_loop();
                    }
                }
                mine
            })
        })
        .collect();
    for p in producers {
        p.join().unwrap();
    }
    let mut all: Vec<usize> = consumers
        .into_iter()
        .flat_map(|c| c.join().unwrap())
        .collect();
    all.sort_unstable();
    assert_eq!(all, (0..2 * PER_PRODUCER).collect::<Vec<_>>());
}

/// RTC replace under a full-speed consumer: every action taken belongs to the newest chunk or
/// the one before it, rows of a chunk come out in order, and a merge never trims more than the
/// consumer took since the producer's snapshot.
#[test]
fn concurrent_replace_hands_out_whole_rows_in_order() {
    const CHUNKS: u64 = 2_000;
    let q = Arc::new(ActionQueue::new(4, true, 64).unwrap());
    let producer = {
        let q = q.clone();
        thread::spawn(move || {
            for seq in 1..=CHUNKS {
                // Row r of chunk seq: [seq, r, -seq, -r].
                let data: Vec<f32> = (0..50)
                    .flat_map(|r| [seq as f32, r as f32, -(seq as f32), -(r as f32)])
                    .collect();
                let c = ChunkRef {
                    data: &data,
                    rows: 50,
                    cols: 4,
                };
                let before = q.action_index() as i64;
                let mut p = prov(seq);
                p.obs_mono_ns = seq as i64;
                let trimmed = q.merge(c, c, 3, Some(before), Some(p)).unwrap();
                assert!(trimmed <= 3);
            }
        })
    };
    let (mut last_seq, mut last_row) = (0u64, -1i64);
    let mut taken = 0;
    loop {
        // Read before the pop: an empty queue after the producer finished stays empty.
        let done = producer.is_finished();
        let mut row = [0f32; 4];
        match q.pop_into(&mut row) {
            Some(p) => {
                let (seq, r) = (row[0] as u64, row[1] as i64);
                assert_eq!(row, [seq as f32, r as f32, -(seq as f32), -(r as f32)]);
                assert_eq!(p.unwrap().seq_id, seq, "provenance travels with its row");
                assert!(seq >= last_seq);
                if seq == last_seq {
                    assert!(r > last_row, "rows of one chunk in order");
                }
                (last_seq, last_row) = (seq, r);
                taken += 1;
            }
            None if done => break,
            None => std::hint::spin_loop(),
        }
    }
    producer.join().unwrap();
    assert!(taken >= 47, "at least the last chunk is taken");
    assert_eq!(q.statistics().merges, CHUNKS);
}

/// The consumer in another process: this test binary re-runs itself as the child.
#[test]
fn a_second_process_consumes_what_this_one_merges() {
    const ROWS: usize = 20_000;
    if let Ok(fd) = std::env::var("SERVO_QUEUE_TEST_FD") {
        return child_consumer(fd.parse().unwrap(), ROWS);
    }
    let memory = Arc::new(Memory::shared(ActionQueue::size_bytes(1, 256).unwrap()).unwrap());
    let q = ActionQueue::create(memory.clone(), 0, 1, false, 256).unwrap();
    let fd = memory.fd().unwrap();
    // SAFETY: clears close-on-exec on a descriptor this test owns, so the child inherits it.
    assert_eq!(unsafe { libc::fcntl(fd, libc::F_SETFD, 0) }, 0);
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "queue::tests::a_second_process_consumes_what_this_one_merges",
            "--nocapture",
        ])
        .env("SERVO_QUEUE_TEST_FD", fd.to_string())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut next = 0usize;
    while next < ROWS {
        let t = (1 + next % 5).min(ROWS - next);
        let rows: Vec<f32> = (next..next + t).map(|v| v as f32).collect();
        let c = ChunkRef {
            data: &rows,
            rows: t,
            cols: 1,
        };
        if q.merge(c, c, 0, None, Some(prov(next as u64))).is_ok() {
            next += t;
        } else {
            thread::yield_now(); // full until the child catches up
        }
    }
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "child failed:\n{stdout}");
    assert!(
        stdout.contains(&format!("consumed {ROWS} in order")),
        "{stdout}"
    );
    assert_eq!(q.statistics().actions_consumed as usize, ROWS);
}

fn child_consumer(fd: i32, rows: usize) {
    let memory = Arc::new(Memory::attach(fd).unwrap());
    let q = ActionQueue::attach(memory, 0).unwrap();
    let mut expected = 0usize;
    let mut row = [0f32];
    while expected < rows {
        if let Some(p) = q.pop_into(&mut row) {
            assert_eq!(row[0] as usize, expected);
            assert!(p.unwrap().seq_id as usize <= expected);
            expected += 1;
        } else {
            std::hint::spin_loop();
        }
    }
    println!("consumed {rows} in order");
}
