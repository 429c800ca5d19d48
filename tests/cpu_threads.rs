//! The worker pool: every chunk is run once, on every thread; results equal
//! one thread's; zero and one chunk; many regions in a row; panics reach the
//! caller; nested regions; and (ignored, a measurement) the cost of one
//! parallel region, which decode pays about 240 times per token:
//! `cargo test --release --test cpu_threads -- --ignored --nocapture`.
//! Both pools: rayon's and the purpose-built one (the default).

use hearth::backend::cpu::threads::Threads;

#[test]
fn every_chunk_runs_once_across_threads() {
    for pool in [Threads::rayon(2), Threads::spinning(2), Threads::new(2)] {
        chunks_once_on_every_thread(&pool);
    }
}

fn chunks_once_on_every_thread(pool: &Threads) {
    assert_eq!(pool.count(), 2);
    let ids = std::sync::Mutex::new(std::collections::HashSet::new());
    for round in 0..50usize {
        let mut data = vec![usize::MAX; 1000 + round];
        pool.for_chunks(&mut data, 7, |i, c| {
            if let Ok(mut s) = ids.lock() {
                s.insert(std::thread::current().id());
            }
            // A little work so both threads take chunks.
            std::thread::sleep(std::time::Duration::from_micros(50));
            c.iter_mut().for_each(|v| *v = i);
        });
        assert!(
            data.iter().enumerate().all(|(j, &v)| v == j / 7),
            "round {round}"
        );
    }
    assert_eq!(ids.lock().map(|s| s.len()).unwrap_or(0), 2);
}

/// Microseconds per region of `for_chunks` over `n` chunks of trivial work.
fn region_us(pool: &Threads, n: usize, regions: usize) -> f64 {
    let mut data = vec![0u64; n * 16];
    let start = std::time::Instant::now();
    for r in 0..regions {
        pool.for_chunks(&mut data, 16, |i, c| {
            c.iter_mut()
                .for_each(|v| *v = v.wrapping_add((i + r) as u64));
        });
    }
    std::hint::black_box(&data);
    start.elapsed().as_secs_f64() * 1e6 / regions as f64
}

#[test]
fn a_panicking_chunk_reaches_the_caller_and_the_pool_survives() {
    let pool = Threads::spinning(2);
    let mut data = vec![0u32; 64];
    // Every chunk index fails once in turn, so both the caller and the
    // worker get to run a failing chunk.
    for bad in 0..16 {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.for_chunks(&mut data, 4, |i, _| {
                std::thread::sleep(std::time::Duration::from_micros(20));
                assert_ne!(i, bad, "chunk {bad} fails");
            });
        }));
        let msg = r.expect_err("the panic reaches the caller");
        let text = msg.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(text.contains(&format!("chunk {bad} fails")), "{text}");
        pool.for_chunks(&mut data, 4, |i, c| c.fill(i as u32 + 1));
        assert!(data
            .iter()
            .enumerate()
            .all(|(j, &v)| v as usize == j / 4 + 1));
    }
}

/// A seeded xorshift value stream (the tests print the seed on failure).
fn values(seed: u64, n: usize) -> Vec<u64> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        })
        .collect()
}

#[test]
fn results_equal_one_thread_over_many_regions_of_every_size() {
    let one = Threads::new(1);
    for pool in [Threads::spinning(2), Threads::rayon(2)] {
        for seed in 1..400u64 {
            // Sizes from empty and one element up; chunk sizes from one up.
            let n = (seed as usize * 37) % 300;
            let chunk = 1 + (seed as usize * 11) % 40;
            let src = values(seed, n);
            let f = |i: usize, c: &mut [u64]| {
                for (k, v) in c.iter_mut().enumerate() {
                    *v = v.rotate_left((i + k) as u32 % 64) ^ (i as u64);
                }
            };
            let mut a = src.clone();
            let mut b = src.clone();
            one.for_chunks(&mut a, chunk, f);
            pool.for_chunks(&mut b, chunk, f);
            assert_eq!(a, b, "seed {seed}: n {n}, chunk {chunk}");
        }
    }
}

#[test]
fn zero_and_one_chunk_run_on_the_caller() {
    let pool = Threads::spinning(2);
    let calls = std::sync::atomic::AtomicUsize::new(0);
    let mut empty: Vec<u8> = Vec::new();
    pool.for_chunks(&mut empty, 8, |_, _| {
        calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    });
    assert_eq!(calls.into_inner(), 0);
    let me = std::thread::current().id();
    let mut one = vec![3u8; 5];
    pool.for_chunks(&mut one, 8, |i, c| {
        assert_eq!(std::thread::current().id(), me);
        assert_eq!((i, c.len()), (0, 5));
        c.fill(9);
    });
    assert_eq!(one, [9; 5]);
}

#[test]
fn many_short_regions_in_a_row_count_every_chunk() {
    let pool = Threads::spinning(2);
    let total = std::sync::atomic::AtomicUsize::new(0);
    let mut data = vec![0u32; 24];
    for r in 0..20_000u32 {
        pool.for_chunks(&mut data, 3, |_, c| {
            c.iter_mut().for_each(|v| *v += 1);
            total.fetch_add(c.len(), std::sync::atomic::Ordering::Relaxed);
        });
        // Occasional gaps long enough for the worker to park.
        if r % 4000 == 0 {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
    assert!(data.iter().all(|&v| v == 20_000));
    assert_eq!(total.into_inner(), 24 * 20_000);
}

#[test]
fn a_nested_region_runs_on_its_thread() {
    let pool = Threads::spinning(2);
    let mut outer = vec![0u64; 8];
    pool.for_chunks(&mut outer, 2, |i, c| {
        let mut inner = vec![0u64; 10];
        pool.for_chunks(&mut inner, 3, |j, d| d.fill(j as u64 + 1));
        c.fill(inner.iter().sum::<u64>() + i as u64);
    });
    // inner: 3 chunks of 3 (1, 2, 3) and one of 1 (4): 3 + 6 + 9 + 4.
    assert!(outer
        .iter()
        .enumerate()
        .all(|(j, &v)| v == 22 + j as u64 / 2));
}

#[test]
fn a_worker_that_starts_late_does_not_hold_the_caller() {
    // The worker parks after a gap; a region of quick chunks then ends as
    // soon as the caller has run them, joined by the worker or not, and
    // the next region still gets both threads.
    let pool = Threads::spinning(2);
    let mut data = vec![0u32; 64];
    for _ in 0..50 {
        std::thread::sleep(std::time::Duration::from_millis(2));
        pool.for_chunks(&mut data, 8, |i, c| c.fill(i as u32));
        assert!(data.iter().enumerate().all(|(j, &v)| v as usize == j / 8));
    }
    chunks_once_on_every_thread(&pool);
}

#[test]
#[ignore = "a measurement, not a check"]
fn region_overhead() {
    for (name, pool) in [
        ("one", Threads::new(1)),
        ("rayon", Threads::rayon(2)),
        ("spinning", Threads::spinning(2)),
    ] {
        region_us(&pool, 2, 1000);
        for n in [2, 8, 64] {
            let us = region_us(&pool, n, 20_000);
            println!(
                "{name} x{}, {n} chunks: {us:.2} us per region",
                pool.count()
            );
        }
    }
}
