//! `merge_since` as a property: a control loop ticking over the real queue, observations stamped
//! with the consumer's position, chunks merged any number of ticks later (with the producer
//! stalled between its seal and its install, and clears, in any order proptest finds). Every
//! executed action is labelled with the step it is meant for (`Provenance::step`).

use proptest::prelude::*;

use super::merge::Timing;
use super::*;

const DIM: usize = 1;

/// A chunk whose row `r` holds `r` (the labels carry everything the checks need).
fn rows(t: usize) -> Vec<f32> {
    (0..t).map(|r| r as f32).collect()
}

fn view(data: &[f32]) -> ChunkRef<'_> {
    ChunkRef {
        data,
        rows: data.len(),
        cols: DIM,
    }
}

fn label(seq_id: u64, step: u64) -> Provenance {
    Provenance {
        session_id: [1; 16],
        seq_id,
        episode_id: 0,
        obs_mono_ns: seq_id as i64,
        step,
    }
}

#[derive(Clone, Debug)]
enum Op {
    /// The control loop: stamp an observation with the position, then take one action.
    Tick,
    /// The engine takes the newest observation (if none is in flight and it is current).
    Request,
    /// The chunk of the request in flight arrives: merged at once, or sealed and left stalled.
    Merge {
        t: usize,
        real_delay: i64,
        stall: bool,
    },
    /// A stalled merge installs its successor and finishes.
    Resume,
    /// The staleness bound drops the queue.
    Clear,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => Just(Op::Tick),
        3 => Just(Op::Request),
        3 => (1usize..24, -2i64..30, any::<bool>())
            .prop_map(|(t, real_delay, stall)| Op::Merge { t, real_delay, stall }),
        2 => Just(Op::Resume),
        1 => Just(Op::Clear),
    ]
}

/// An observation: the tick it was taken at and the position stamped with it.
#[derive(Clone, Copy, Debug)]
struct Observation {
    tick: u64,
    position: u64,
}

/// What the run saw, for the checks.
#[derive(Default)]
struct Run {
    tick: u64,
    latest: Option<Observation>,
    in_flight: Option<(u64, Observation)>,
    /// (tick, label) of every action taken.
    taken: Vec<(u64, Provenance)>,
    /// Per chunk: its observation, and whether a clear hit while its merge was stalled (append
    /// then leaves out the rows the clear dropped unexecuted: a skip with a reason).
    chunks: Vec<(u64, Observation, bool)>,
}

fn check(run: &Run) -> Result<(), TestCaseError> {
    let mut previous: Option<(u64, Provenance)> = None;
    for (i, &(tick, label)) in run.taken.iter().enumerate() {
        prop_assert!(
            label.step <= tick,
            "step {} executed early, at tick {tick}",
            label.step
        );
        if let Some((_, before)) = previous {
            prop_assert!(
                label.step > before.step,
                "step {} executed twice",
                label.step
            );
            if before.same_chunk(&label) {
                prop_assert_eq!(label.step, before.step + 1, "a step skipped inside a chunk");
            }
        }
        let first_of_chunk = previous.is_none_or(|(_, before)| !before.same_chunk(&label));
        if first_of_chunk {
            let &(_, obs, relaxed) = run
                .chunks
                .iter()
                .find(|(seq, ..)| *seq == label.seq_id)
                .expect("a chunk merged");
            // Exactly the actions taken since the observation were skipped (dry ticks skip nothing).
            let since = run.taken[..i]
                .iter()
                .filter(|(t, _)| *t >= obs.tick)
                .count() as u64;
            if !relaxed {
                prop_assert_eq!(
                    label.step,
                    obs.tick + since,
                    "chunk {} misplaced",
                    label.seq_id
                );
            }
        }
        previous = Some((tick, label));
    }
    Ok(())
}

fn exact_run(rtc: bool, ops: &[Op]) -> Result<(), TestCaseError> {
    let q = ActionQueue::new(DIM, rtc, 64).unwrap();
    let words = q.words();
    let mut run = Run::default();
    let mut stalled = None;
    let mut seq = 0u64;
    for op in ops {
        match *op {
            Op::Tick => {
                let position = q.position();
                run.latest = Some(Observation {
                    tick: run.tick,
                    position,
                });
                let mut row = [0f32];
                if let Some(label) = q.pop_into(&mut row) {
                    let label = label.expect("labelled");
                    prop_assert_eq!(
                        row[0] as u64,
                        label.step - run.chunks[label.seq_id as usize - 1].1.tick
                    );
                    run.taken.push((run.tick, label));
                }
                run.tick += 1;
            }
            Op::Request => {
                if let (None, Some(obs)) = (run.in_flight, run.latest) {
                    if q.is_current(obs.position) {
                        seq += 1;
                        run.in_flight = Some((seq, obs));
                    }
                }
            }
            Op::Merge {
                t,
                real_delay,
                stall,
            } => {
                if stalled.is_some() {
                    continue; // one request in flight: its merge is the one stalled
                }
                let Some((seq_id, obs)) = run.in_flight.take() else {
                    continue;
                };
                let data = rows(t);
                let provenance = Some(label(seq_id, obs.tick));
                run.chunks.push((seq_id, obs, false));
                if stall {
                    let timing = Timing::Since {
                        position: obs.position,
                        real_delay,
                    };
                    match q.prepare(words, view(&data), view(&data), timing, provenance) {
                        Ok(prepared) => stalled = Some((prepared, q.seal(words))),
                        Err(e) => prop_assert!(matches!(e, QueueError::Capacity { .. }), "{e}"),
                    }
                } else {
                    let merged = q.merge_since(
                        view(&data),
                        view(&data),
                        obs.position,
                        real_delay,
                        provenance,
                    );
                    let refused = matches!(merged, Err(QueueError::Capacity { .. }));
                    prop_assert!(merged.is_ok() || refused, "{:?}", merged);
                }
            }
            Op::Resume => {
                if let Some((prepared, sealed_word)) = stalled.take() {
                    q.install(words, sealed_word);
                    q.finish(words, prepared, sealed_word);
                }
            }
            Op::Clear => {
                if stalled.is_some() && !rtc {
                    if let Some(chunk) = run.chunks.last_mut() {
                        chunk.2 = true;
                    }
                }
                q.clear();
            }
        }
    }
    check(&run)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn replace_executes_every_step_once(ops in proptest::collection::vec(op(), 1..200)) {
        exact_run(true, &ops)?;
    }

    #[test]
    fn append_executes_every_step_once(ops in proptest::collection::vec(op(), 1..200)) {
        exact_run(false, &ops)?;
    }
}

/// The run issue 30 traced: chunk 4 (observation at tick 1148) runs one step behind; chunk 5's
/// observation is taken at tick 1152, the engine gets to it at tick 1154, and it is merged
/// before tick 1155 with a real delay of 3. LeRobot's rule, measuring from the index the engine
/// read, trims 1 step and executes step 1153 twice; `merge_since` trims the 3 actions taken.
#[test]
fn the_traced_late_merge_executes_no_step_twice() {
    for exact in [false, true] {
        let q = ActionQueue::new(DIM, true, 64).unwrap();
        let data = rows(20);
        // Chunk 4's rows from step 1150 on, as queued at tick 1151.
        q.merge_since(
            view(&data[2..]),
            view(&data[2..]),
            q.position(),
            0,
            Some(label(4, 1150)),
        )
        .unwrap();
        let mut executed = vec![];
        let mut take = |tick: u64| {
            let label = q.pop_into(&mut [0f32]).unwrap().unwrap();
            executed.push((tick, label.step));
        };
        take(1151);
        let at_observation = q.position(); // tick 1152's observation
        let index_at_observation = q.action_index();
        take(1152);
        take(1153);
        let index_read_late = q.action_index() as i64; // the engine gets to it now
        take(1154);
        let chunk5 = Some(label(5, 1152));
        let trimmed = if exact {
            q.merge_since(view(&data), view(&data), at_observation, 3, chunk5)
        } else {
            q.merge(view(&data), view(&data), 3, Some(index_read_late), chunk5)
        }
        .unwrap();
        take(1155);
        let steps: Vec<u64> = executed.iter().map(|(_, step)| *step).collect();
        if exact {
            assert_eq!(trimmed, 3);
            assert_eq!(steps, [1150, 1151, 1152, 1153, 1155]);
        } else {
            assert_eq!((trimmed, index_at_observation), (1, 1));
            assert_eq!(
                steps,
                [1150, 1151, 1152, 1153, 1153],
                "LeRobot's rule repeats step 1153"
            );
        }
    }
}

#[test]
fn a_position_is_measured_from_only_in_its_generation() {
    let q = ActionQueue::new(DIM, true, 64).unwrap();
    let data = rows(6);
    let before = q.position();
    q.merge_since(view(&data), view(&data), before, 0, None)
        .unwrap();
    let at = q.position();
    assert!(q.is_current(at) && !q.is_current(before));
    let refused = q.merge_since(view(&data), view(&data), before, 0, None);
    assert_eq!(
        refused.unwrap_err().to_string(),
        format!("position {before:#x} was read before the last merge: measure from an observation taken since")
    );
    assert!(q.left_over_since(before, true).is_err());
    q.pop().unwrap();
    let ahead = q.position();
    let fresh = ActionQueue::new(DIM, true, 64).unwrap();
    fresh
        .merge_since(view(&data), view(&data), fresh.position(), 0, None)
        .unwrap();
    let message = fresh.left_over_since(ahead, true).unwrap_err().to_string();
    assert!(message.ends_with("is ahead of the consumer"), "{message}");
    let message = q
        .left_over_since(at | 1 << 62, true)
        .unwrap_err()
        .to_string();
    assert!(message.ends_with("is not a queue position"), "{message}");
    assert_eq!(q.statistics().rejected_merges, 1);
}

#[test]
fn left_over_since_reads_the_queue_as_it_stood_at_the_position() {
    let q = ActionQueue::new(DIM, true, 64).unwrap();
    let data = rows(6);
    q.merge_since(view(&data), view(&data), q.position(), 0, None)
        .unwrap();
    q.pop().unwrap();
    let at = q.position();
    q.pop().unwrap();
    q.pop().unwrap();
    let since = q.left_over_since(at, false).unwrap().unwrap();
    assert_eq!(since.values, [1.0, 2.0, 3.0, 4.0, 5.0]);
    assert_eq!(q.left_over_processed().unwrap().values, [3.0, 4.0, 5.0]);
}

/// A clear keeps the index a position counts from: the actions taken before it went by, so a
/// merge measured from an observation taken before the clear still skips them.
#[test]
fn a_clear_keeps_the_actions_taken_before_it() {
    for rtc in [true, false] {
        let q = ActionQueue::new(DIM, rtc, 64).unwrap();
        let data = rows(10);
        q.merge_since(view(&data), view(&data), q.position(), 0, None)
            .unwrap();
        let at = q.position();
        q.pop().unwrap();
        q.pop().unwrap();
        q.clear();
        assert_eq!((q.action_index(), q.statistics().action_index), (0, 0));
        assert_eq!(q.pop(), None);
        assert!(q.is_current(at));
        assert_eq!(q.merge_since(view(&data), view(&data), at, 5, None), Ok(2));
        assert_eq!(q.pop(), Some(vec![2.0]));
        // LeRobot's rule still resolves against index 0 after a clear.
        q.clear();
        assert_eq!(q.merge(view(&data), view(&data), 5, Some(0), None), Ok(0));
    }
}

#[test]
fn append_since_follows_the_queued_actions() {
    let q = ActionQueue::new(DIM, false, 64).unwrap();
    let data = rows(10);
    q.merge_since(view(&data), view(&data), q.position(), 0, Some(label(1, 0)))
        .unwrap();
    q.pop().unwrap();
    let at = q.position(); // observation at tick 1: 9 actions queued (steps 1..=9)
    q.pop().unwrap();
    // Steps 1..=9 are taken or queued: the chunk of the observation at tick 1 starts at step 10.
    assert_eq!(
        q.merge_since(view(&data), view(&data), at, 1, Some(label(2, 1))),
        Ok(9)
    );
    let steps: Vec<u64> =
        std::iter::from_fn(|| q.pop_into(&mut [0f32]).map(|p| p.unwrap().step)).collect();
    assert_eq!(steps, (2..=10).collect::<Vec<_>>());
    // A chunk that only covers queued steps adds nothing.
    q.merge_since(view(&data), view(&data), q.position(), 0, None)
        .unwrap();
    let at = q.position();
    assert_eq!(
        q.merge_since(view(&data[..3]), view(&data[..3]), at, 4, None),
        Ok(3)
    );
    assert_eq!(q.qsize(), 10);
    assert_eq!(q.statistics().delay_mismatches, 1);
}
