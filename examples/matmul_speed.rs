//! Times the CPU matmul on model-shaped weights against the pair-by-pair
//! dot loop it replaced (`vec_dot` per row and token), in one process:
//! the best of many short trials, so a busy machine disturbs it little.
//!
//! `cargo run --release --example matmul_speed [threads]`

use std::time::Instant;

use hearth::backend::cpu::kernels::KernelTable;
use hearth::backend::cpu::matmul::{matmul, quantize_acts, Weight};
use hearth::backend::cpu::threads::Threads;
use hearth::quant::{reference, GgmlType};

/// Best wall time of `f` over `trials` runs, in seconds.
fn best(trials: usize, mut f: impl FnMut()) -> f64 {
    (0..trials)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let nt: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1);
    let table = KernelTable::detect();
    let threads = Threads::new(nt);
    println!("ISA {}, {nt} thread(s)", table.isa());
    let shapes = [
        (GgmlType::Q4_1, 576, 1536),
        (GgmlType::Q8_0, 576, 8192),
        (GgmlType::Q5_0, 640, 2048),
        (GgmlType::Q4_0, 2048, 8192),
        (GgmlType::Q8_0, 2048, 2048),
        (GgmlType::Q4_K, 2048, 8192),
        (GgmlType::Q6_K, 2048, 2048),
        (GgmlType::IQ4_XS, 2048, 2048),
    ];
    let mut seed = 1u64;
    let mut next = move || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    };
    for (ty, cols, rows) in shapes {
        let wf: Vec<f32> = (0..cols * rows).map(|_| next()).collect();
        let mut wq = Vec::new();
        reference::quantize(ty, &wf, &mut wq)?;
        let words: Vec<u32> = wq
            .chunks(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let w = Weight::new(&table, "w", ty, cols, rows, words, wq.len())?;
        let k = table.weight(ty).ok_or("no kernel")?;
        for n in [1usize, 64] {
            let x: Vec<f32> = (0..n * cols).map(|_| next()).collect();
            let mut y = vec![0.0f32; n * rows];
            let trials = if n == 1 { 40 } else { 6 };
            let new = best(trials, || {
                let _ = matmul(&threads, &table, &w, 0..rows, &x, &mut y, false);
            });
            let old = best(trials, || {
                if let Ok(acts) = quantize_acts(&table, &w, &x) {
                    for t in 0..n {
                        for r in 0..rows {
                            y[t * rows + r] = (k.vec_dot)(w.row(r), acts.row(t));
                        }
                    }
                }
            });
            let gb = wq.len() as f64 / 1e9;
            let gmac = (n * rows * cols) as f64 / 1e9;
            println!(
                "{ty:>6} {cols:>5}x{rows:<5} n={n:<3} matmul {:7.3} ms ({:5.1} GB/s, {:6.1} GMAC/s)   per-pair dots (1 thread) {:7.3} ms   x{:.2}",
                new * 1e3,
                gb / new,
                gmac / new,
                old * 1e3,
                old / new
            );
        }
    }
    Ok(())
}
