use super::generation::UNRESOLVED;
use super::*;
use proptest::prelude::*;
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

fn prov(seq_id: u64) -> Provenance {
    Provenance {
        session_id: [7; 16],
        seq_id,
        episode_id: 3,
        obs_mono_ns: 1_000 + seq_id as i64,
    }
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
    assert!(matches!(
        ActionQueue::new(0, true, 4),
        Err(QueueError::Config(_))
    ));
    assert!(matches!(
        ActionQueue::new(2, true, 0),
        Err(QueueError::Config(_))
    ));
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
    assert_eq!(
        r(5, None, 0),
        DelayResolution {
            delay: 5,
            mismatch: false
        }
    );
    assert_eq!(
        r(-5, None, 0),
        DelayResolution {
            delay: 0,
            mismatch: false
        }
    );
    assert_eq!(
        r(5, Some(3), 8),
        DelayResolution {
            delay: 5,
            mismatch: false
        }
    );
    assert_eq!(
        r(5, Some(3), 4),
        DelayResolution {
            delay: 1,
            mismatch: true
        }
    );
    assert_eq!(
        r(2, Some(3), 9),
        DelayResolution {
            delay: 2,
            mismatch: true
        }
    );
    // idx_before ahead of the index (a merge reset it): nothing consumed.
    assert_eq!(
        r(2, Some(9), 3),
        DelayResolution {
            delay: 0,
            mismatch: true
        }
    );
    assert_eq!(
        r(0, Some(9), 3),
        DelayResolution {
            delay: 0,
            mismatch: false
        }
    );
    assert_eq!(r(-1, Some(i64::MIN), u64::MAX >> 1).delay, 0);
}

#[test]
fn append_keeps_unconsumed_and_provenance() {
    let q = ActionQueue::new(DIM, false, 64).unwrap();
    assert_eq!(merge(&q, 0, 3, 10, None, Some(prov(1))), Ok(0));
    assert_eq!(q.qsize(), 3);
    assert_eq!(q.pop_with(|_, p| p), Some(Some(prov(1))));
    merge(&q, 10, 2, 0, None, Some(prov(2))).unwrap();
    assert_eq!(q.action_index(), 0);
    assert_eq!(q.qsize(), 4);
    let got: Vec<_> = std::iter::from_fn(|| q.pop_with(|row, p| (row[0] - 0.5, p))).collect();
    assert_eq!(
        got,
        vec![
            (1.0, Some(prov(1))),
            (2.0, Some(prov(1))),
            (10.0, Some(prov(2))),
            (11.0, Some(prov(2)))
        ]
    );
    assert_eq!(q.statistics().actions_consumed, 5);
}

#[test]
fn chunk_table_stays_bounded() {
    let q = ActionQueue::new(DIM, false, 64).unwrap();
    for i in 0..1000 {
        merge(&q, i, 2, 0, None, Some(prov(i as u64))).unwrap();
        q.pop().unwrap();
        q.pop().unwrap();
    }
    let generation = q.current.load_full();
    assert!(generation.rows.chunks.len() <= 2);
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
    assert_eq!(q.pop(), None);
    merge(&q, 10, 2, 0, None, None).unwrap();
    assert_eq!(pop_value(&q), Some(10));
}

#[test]
fn long_successor_chain_drops_without_recursion() {
    let q = ActionQueue::new(1, true, 4).unwrap();
    let held = q.current.load_full();
    for i in 0..100_000 {
        let row = [i as f32];
        let c = ChunkRef {
            data: &row,
            rows: 1,
            cols: 1,
        };
        q.merge(c, c, 0, None, None).unwrap();
    }
    drop(q);
    drop(held);
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
        let rows: Vec<_> = (first..first + t).map(|v| (v, prov)).collect();
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
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1usize..9, -2i64..12, proptest::option::of(-1i64..12), any::<bool>()).prop_map(
            |(t, real_delay, idx_before, labeled)| Op::Merge { t, real_delay, idx_before, labeled }
        ),
        6 => Just(Op::Get),
        1 => Just(Op::Clear),
    ]
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
            Op::Get => {
                let got = q.pop_with(|row, p| {
                    assert_eq!(row[1], -row[0] + 1.0);
                    ((row[0] - 0.5) as usize, p)
                });
                prop_assert_eq!(got, model.pop());
            }
            Op::Clear => {
                q.clear();
                model.queue = None;
                model.last_index = 0;
            }
        }
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
        let peek = model
            .queue
            .as_ref()
            .and_then(|queue| queue.get(model.last_index))
            .and_then(|(_, p)| *p);
        prop_assert_eq!(q.peek_provenance(), peek);
    }
    Ok(())
}

proptest! {
    #[test]
    fn append_matches_model(ops in proptest::collection::vec(op_strategy(), 1..120)) {
        check_against_model(false, 24, &ops)?;
    }

    #[test]
    fn replace_matches_model(ops in proptest::collection::vec(op_strategy(), 1..120)) {
        check_against_model(true, 6, &ops)?;
    }
}

/// Producer merges tagged chunks while the consumer drains at full speed: every action is
/// seen exactly once and in order, and the index only drops when a merge happened.
#[test]
fn concurrent_append_loses_and_duplicates_nothing() {
    const CHUNKS: usize = 3_000;
    let q = Arc::new(ActionQueue::new(1, false, 1 << 20).unwrap());
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
                q.merge(c, c, 3, Some(0), Some(prov(i as u64))).unwrap();
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
        match q.pop_with(|row, p| (row[0] as usize, p.unwrap().seq_id)) {
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
    let q = Arc::new(ActionQueue::new(1, false, 1 << 20).unwrap());
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

/// A producer stalled right after sealing (successor linked, unresolved, not yet current):
/// the consumer follows the link, resolves the start itself and loses nothing.
#[test]
fn consumer_follows_unpublished_successor() {
    let q = ActionQueue::new(DIM, false, 64).unwrap();
    merge(&q, 0, 5, 0, None, None).unwrap();
    assert_eq!(pop_value(&q), Some(0));
    // Producer: snapshot s0 = 1 and build the successor from it.
    let old = q.current.load_full();
    let s0 = old.word.load(Ordering::Acquire);
    let (o, p) = chunk(100, 3);
    let rows = Rows::appended(&old.rows, old.row(s0), view(&o), view(&p), None);
    let next = Arc::new(Generation::pending(rows, Plan::SkipConsumed { s0 }));
    // Consumer keeps going meanwhile.
    assert_eq!(pop_value(&q), Some(1));
    assert_eq!(pop_value(&q), Some(2));
    // Producer links and seals, then stalls before resolving and storing.
    assert!(old.next.set(next.clone()).is_ok());
    assert_eq!(old.word.fetch_or(SEALED, Ordering::AcqRel), 3);
    assert_eq!(next.start.load(Ordering::Acquire), UNRESOLVED);
    assert_eq!(q.qsize(), 5);
    assert_eq!(q.action_index(), 0);
    assert_eq!(pop_value(&q), Some(3));
    assert_eq!(next.start.load(Ordering::Acquire), 2);
    // Producer resumes: resolving again is a no-op, then it publishes.
    next.resolve(3);
    q.current.store(next);
    let rest: Vec<_> = std::iter::from_fn(|| pop_value(&q)).collect();
    assert_eq!(rest, vec![4, 100, 101, 102]);
    assert_eq!(q.action_index(), 5);
}
