use super::*;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::thread;

#[test]
fn private_memory_is_zeroed_and_bounds_checked() {
    let memory = Memory::private(20);
    assert_eq!(memory.len(), 24);
    assert!(memory.fd().is_none());
    let words = memory.words(8, 2).unwrap();
    assert!(words.iter().all(|w| w.load(Ordering::Relaxed) == 0));
    assert_eq!(
        memory.words(4, 1).unwrap_err().to_string(),
        "offset 4 is not a multiple of 8"
    );
    assert_eq!(
        memory.words(16, 2).unwrap_err().to_string(),
        "16 bytes at offset 16 do not fit in 24 bytes of shared memory"
    );
}

#[test]
fn shared_memory_is_seen_through_a_second_mapping() {
    let first = Memory::shared(64).unwrap();
    let second = Memory::attach(first.fd().unwrap()).unwrap();
    assert_eq!(second.len(), 64);
    first.words(8, 1).unwrap()[0].store(42, Ordering::Release);
    assert_eq!(second.words(8, 1).unwrap()[0].load(Ordering::Acquire), 42);
    // The second mapping owns its own descriptor: it outlives the first.
    drop(first);
    assert_eq!(second.words(8, 1).unwrap()[0].load(Ordering::Acquire), 42);
}

#[test]
fn attach_refuses_a_bad_descriptor() {
    assert!(matches!(Memory::attach(-1), Err(ShmError::Os(_))));
}

#[test]
fn seqlock_round_trip_and_versions() {
    let memory = Memory::private(Seqlock::words(3) * WORD);
    let lock = Seqlock::new(memory.words(0, Seqlock::words(3)).unwrap());
    let mut out = [9u64; 3];
    assert_eq!(lock.read(&mut out), Some(0));
    assert_eq!(out, [0, 0, 0]);
    lock.write(&[1, 2, 3]);
    lock.write(&[4, 5]);
    assert_eq!(lock.version(), 2);
    assert_eq!(lock.read(&mut out), Some(2));
    assert_eq!(out, [4, 5, 3]);
}

#[test]
fn seqlock_reader_never_sees_a_torn_record() {
    const WORDS: usize = 16;
    let memory = Arc::new(Memory::private(Seqlock::words(WORDS) * WORD));
    let done = Arc::new(AtomicBool::new(false));
    let writer = {
        let (memory, done) = (memory.clone(), done.clone());
        thread::spawn(move || {
            let lock = Seqlock::new(memory.words(0, Seqlock::words(WORDS)).unwrap());
            for value in 1..200_000u64 {
                lock.write(&[value; WORDS]);
            }
            done.store(true, Ordering::Release);
        })
    };
    let lock = Seqlock::new(memory.words(0, Seqlock::words(WORDS)).unwrap());
    let (mut consistent, mut last) = (0u64, 0u64);
    let mut out = [0u64; WORDS];
    while !done.load(Ordering::Acquire) {
        if lock.read(&mut out).is_some() {
            assert!(out.iter().all(|v| *v == out[0]), "torn read {out:?}");
            assert!(out[0] >= last, "went back in time");
            last = out[0];
            consistent += 1;
        }
    }
    writer.join().unwrap();
    assert!(consistent > 0);
}

#[test]
fn ring_is_fifo_and_drops_when_full() {
    let words = Ring::words(2, 3);
    let memory = Memory::private(words * WORD);
    let ring = Ring::new(memory.words(0, words).unwrap(), 2, 3);
    let mut out = [0u64; 2];
    assert!(!ring.pop(&mut out));
    for i in 0..3 {
        assert!(ring.push(&[i, i + 100]));
    }
    assert!(!ring.push(&[7, 7]));
    assert_eq!((ring.len(), ring.dropped()), (3, 1));
    assert!(ring.pop(&mut out));
    assert_eq!(out, [0, 100]);
    assert!(ring.push(&[3]));
    let mut seen = Vec::new();
    while ring.pop(&mut out) {
        seen.push(out);
    }
    assert_eq!(seen, vec![[1, 101], [2, 102], [3, 0]]);
    assert!(ring.is_empty());
}

#[test]
fn ring_across_threads_loses_nothing_it_accepted() {
    const RECORDS: u64 = 100_000;
    let words = Ring::words(4, 64);
    let memory = Arc::new(Memory::private(words * WORD));
    let producer = {
        let memory = memory.clone();
        thread::spawn(move || {
            let ring = Ring::new(memory.words(0, words).unwrap(), 4, 64);
            let mut accepted = Vec::new();
            for i in 0..RECORDS {
                if ring.push(&[i, i * 2, i * 3, !i]) {
                    accepted.push(i);
                }
            }
            accepted
        })
    };
    let ring = Ring::new(memory.words(0, words).unwrap(), 4, 64);
    let mut seen = Vec::new();
    let mut out = [0u64; 4];
    loop {
        if ring.pop(&mut out) {
            assert_eq!(
                out,
                [out[0], out[0] * 2, out[0] * 3, !out[0]],
                "torn record"
            );
            seen.push(out[0]);
        } else if producer.is_finished() && ring.is_empty() {
            break;
        }
    }
    let accepted = producer.join().unwrap();
    assert_eq!(seen, accepted);
    assert_eq!(ring.dropped() as usize + accepted.len(), RECORDS as usize);
}
