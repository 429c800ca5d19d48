//! Times the CPU matmul on model-shaped weights against the pair-by-pair
//! dot loop it replaced (`vec_dot` per row and token), in one process:
//! the best of many short trials, so a busy machine disturbs it little.
//!
//! `cargo run --release --example matmul_speed [threads] [type,type...] [COLSxROWS] [N,N...]`
//! (a shape given replaces the built-in ones, for each type named; `N`:
//! the activation rows, tokens, of each timing, 1 and 64 by default).
//!
//! Shapes are the real models' (`cols x rows`): SmolLM2-135M (Q4_1, Q8_0),
//! Gemma-3-270M (Q4_K, Q6_K, Q5_0, Q8_0 where rows are whole blocks; the
//! 262144-row output matrix as a 16384-row slice) and a 1B-shaped 2048x8192 for every tiled format.

#[path = "common/mod.rs"]
mod common;

use std::time::Instant;

use hearth::backend::cpu::kernels::KernelTable;
use hearth::backend::cpu::matmul::{matmul, quantize_acts, Weight};
use hearth::backend::cpu::threads::Threads;
use hearth::quant::{reference, GgmlType};

/// Best wall times of `a` and `b` over `trials` interleaved runs each, in
/// seconds: alternating them lets a busy machine slow both alike.
fn best2(trials: usize, mut a: impl FnMut(), mut b: impl FnMut()) -> (f64, f64) {
    let (mut ba, mut bb) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..trials {
        let t = Instant::now();
        a();
        ba = ba.min(t.elapsed().as_secs_f64());
        let t = Instant::now();
        b();
        bb = bb.min(t.elapsed().as_secs_f64());
    }
    (ba, bb)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let nt: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1);
    let table = KernelTable::detect();
    let threads = Threads::new(nt);
    println!("ISA {}, {nt} thread(s)", table.isa());
    let only: Option<String> = std::env::args().nth(2);
    let mut shapes = Vec::new();
    for ty in [GgmlType::Q4_1, GgmlType::Q8_0] {
        shapes.extend([(ty, 576, 1536), (ty, 1536, 576), (ty, 576, 49152)]);
    }
    for ty in [
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::Q5_0,
        GgmlType::Q8_0,
    ] {
        shapes.extend([(ty, 640, 2048), (ty, 2048, 640), (ty, 640, 16384)]);
    }
    for ty in hearth::quant::WEIGHT_TYPES {
        shapes.push((ty, 2048, 8192));
    }
    // Gemma's k-quant tensors are those whose rows are whole 256-blocks.
    shapes.retain(|(ty, cols, _)| cols % ty.block_elems() == 0);
    if let Some((cols, rows)) = std::env::args().nth(3).and_then(|s| {
        let (c, r) = s.split_once('x')?;
        Some((c.parse::<usize>().ok()?, r.parse::<usize>().ok()?))
    }) {
        let mut types: Vec<GgmlType> = Vec::new();
        for (ty, _, _) in &shapes {
            if !types.contains(ty) {
                types.push(*ty);
            }
        }
        shapes = types.into_iter().map(|ty| (ty, cols, rows)).collect();
    }
    if let Some(only) = &only {
        let names: Vec<&str> = only.split(',').collect();
        shapes.retain(|(ty, _, _)| names.iter().any(|n| n.eq_ignore_ascii_case(ty.name())));
    }
    let tokens: Vec<usize> = std::env::args()
        .nth(4)
        .map(|s| s.split(',').filter_map(|n| n.parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 64]);
    let mut next = common::uniform();
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
        let rb = wq.len() / rows;
        for &n in &tokens {
            let x: Vec<f32> = (0..n * cols).map(|_| next()).collect();
            let mut y = vec![0.0f32; n * rows];
            let trials = if n == 1 { 40 } else { (384 / n).clamp(2, 6) };
            let mut y2 = y.clone();
            let (new, old) = best2(
                trials,
                || {
                    let _ = matmul(&threads, &table, &w, 0..rows, &x, &mut y, false);
                },
                || {
                    if let Ok(acts) = quantize_acts(&table, &w, &x) {
                        for t in 0..n {
                            for r in 0..rows {
                                y2[t * rows + r] =
                                    (k.vec_dot)(&wq[r * rb..(r + 1) * rb], acts.row(t));
                            }
                        }
                    }
                },
            );
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
    // The activation quantizers: this ISA's against the scalar ones.
    let scalar = KernelTable::scalar();
    for ty in [GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q8_K] {
        let (Some(fast), Some(slow)) = (table.quantizer(ty), scalar.quantizer(ty)) else {
            continue;
        };
        let x: Vec<f32> = (0..64 * 2048).map(|_| next()).collect();
        let mut out = vec![0u8; x.len() / ty.block_elems() * ty.block_bytes()];
        let mut out2 = out.clone();
        let (f, s) = best2(20, || fast(&x, &mut out), || slow(&x, &mut out2));
        println!(
            "quantize {ty:>5} 64x2048: {} {:7.3} ms   scalar {:7.3} ms   x{:.2}   same bytes: {}",
            table.isa(),
            f * 1e3,
            s * 1e3,
            s / f,
            out == out2
        );
    }
    Ok(())
}
