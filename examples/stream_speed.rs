//! One-token matmul speed from memory, not cache: decode's case. Each
//! format's 2048x8192 weight is copied into enough weights to pass 384 MiB
//! (far beyond the last-level cache), in large-page memory as the backend
//! keeps weights, and one activation row runs through all of them in turn,
//! as a decode step runs through a model's layers.
//!
//! `cargo run --release --example stream_speed [threads] [type,type...] [MiB] [ROWS]`
//! prints each format's GB/s, the best of several passes (`MiB` 0 and a
//! few hundred `ROWS`: one small weight, read from cache, for the
//! kernel's arithmetic alone). `--target wasm32-wasip1` runs it in Node.

#[path = "common/mod.rs"]
mod common;

use std::time::Instant;

use hearth::backend::cpu::hostmem::LargePages;
use hearth::backend::cpu::kernels::KernelTable;
use hearth::backend::cpu::matmul::{matmul, Weight};
use hearth::backend::cpu::threads::Threads;
use hearth::quant::{reference, GgmlType};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let nt: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(1);
    let types: Vec<GgmlType> = match args.get(2) {
        Some(list) => list
            .split(',')
            .filter_map(|n| GgmlType::from_name(&n.to_uppercase()))
            .collect(),
        None => vec![
            GgmlType::Q4_0,
            GgmlType::Q8_0,
            GgmlType::Q4_K,
            GgmlType::Q6_K,
            GgmlType::IQ4_XS,
        ],
    };
    let total: usize = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(384) << 20;
    let table = KernelTable::detect();
    let threads = Threads::new(nt);
    println!(
        "ISA {}, {nt} thread(s), {} MiB per pass",
        table.isa(),
        total >> 20
    );
    let rows: usize = args.get(4).and_then(|a| a.parse().ok()).unwrap_or(8192);
    let cols = 2048;
    let mut next = common::uniform();
    let x: Vec<f32> = (0..cols).map(|_| next()).collect();
    let pages = LargePages::default();
    let mut y = vec![0.0f32; rows];
    for ty in types {
        let wf: Vec<f32> = (0..cols * rows).map(|_| next()).collect();
        let mut wq = Vec::new();
        reference::quantize(ty, &wf, &mut wq)?;
        let copies = total.div_ceil(wq.len()).max(1);
        let mut weights = Vec::with_capacity(copies);
        for _ in 0..copies {
            let mut words = pages.alloc(wq.len().div_ceil(4), "weights")?;
            bytemuck::cast_slice_mut::<u32, u8>(&mut words)[..wq.len()].copy_from_slice(&wq);
            weights.push(Weight::from_mem(
                &table,
                "w",
                ty,
                cols,
                rows,
                words,
                wq.len(),
            )?);
        }
        let mut best = f64::INFINITY;
        let passes = (8 * (384 << 20) / (copies * wq.len())).max(8);
        for _ in 0..passes {
            let t = Instant::now();
            for w in &weights {
                matmul(&threads, &table, w, 0..rows, &x, &mut y, false)?;
            }
            best = best.min(t.elapsed().as_secs_f64());
        }
        let bytes = (copies * wq.len()) as f64;
        println!(
            "{ty:>6} {:5.1} GB/s  ({copies} x {:.1} MiB, {:.2} ms per weight)",
            bytes / best / 1e9,
            wq.len() as f64 / (1 << 20) as f64,
            best * 1e3 / copies as f64
        );
    }
    Ok(())
}
