//! The worker pool: every chunk is run once, on every thread; and (ignored,
//! a measurement) the cost of one parallel region, which decode pays about
//! 240 times per token: `cargo test --release --test cpu_threads -- --ignored --nocapture`.
//! Both pools: rayon's and the spinning one.

use hearth::backend::cpu::threads::Threads;

#[test]
fn every_chunk_runs_once_across_threads() {
    for pool in [Threads::new(2), Threads::spinning(2)] {
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
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        pool.for_chunks(&mut data, 4, |i, _| assert_ne!(i, 9, "chunk 9 fails"));
    }));
    assert!(r.is_err());
    pool.for_chunks(&mut data, 4, |i, c| c.fill(i as u32));
    assert!(data.iter().enumerate().all(|(j, &v)| v as usize == j / 4));
}

#[test]
#[ignore = "a measurement, not a check"]
fn region_overhead() {
    for (name, pool) in [
        ("one", Threads::new(1)),
        ("rayon", Threads::new(2)),
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
