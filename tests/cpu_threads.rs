//! The worker pool: every chunk is run once, on every thread; and (ignored,
//! a measurement) the cost of one parallel region, which decode pays about
//! 240 times per token: `cargo test --release --test cpu_threads -- --ignored --nocapture`.

use hearth::backend::cpu::threads::Threads;

#[test]
fn every_chunk_runs_once_across_threads() {
    let pool = Threads::new(2);
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
#[ignore = "a measurement, not a check"]
fn region_overhead() {
    for threads in [1, 2] {
        let pool = Threads::new(threads);
        region_us(&pool, 2, 1000);
        for n in [2, 8, 64] {
            let us = region_us(&pool, n, 20_000);
            println!("threads {threads}, {n} chunks: {us:.2} us per region");
        }
    }
}
