//! Each CPU op against a naive f64 implementation on seeded random inputs:
//! RMS norm, RoPE (NORM and NEOX, partial rotation), softmax, GELU/SiLU
//! gating, and paged attention (GQA, causal, sliding window, softcap, block
//! tables in random non-contiguous order, f32 and f16 cache).

mod model_support;

use hearth::backend::cpu::attention::{AttnSeq, AttnShape, KvCache};
use hearth::backend::cpu::threads::Threads;
use hearth::graph::reference as ops;
use hearth::graph::RopeMode;
use hearth::graph::{KvCacheConfig, KvType};
use hearth::kv::{BlockId, Slot};

use model_support::rng::Rng;

fn close(ours: &[f32], want: &[f64], tol: f64, what: &str) {
    assert_eq!(ours.len(), want.len(), "{what}");
    for (i, (&a, &b)) in ours.iter().zip(want).enumerate() {
        assert!(
            (f64::from(a) - b).abs() <= tol * (1.0 + b.abs()),
            "{what} [{i}]: {a} vs {b}"
        );
    }
}

#[test]
fn rms_norm_matches_f64() {
    let seed = 11;
    let mut rng = Rng::new(seed);
    for width in [64, 576] {
        let (x, w) = (rng.normals(3 * width, 2.0), rng.normals(width, 1.0));
        let mut ours = x.clone();
        ops::rms_norm(&mut ours, &w, 1e-6);
        let mut want = Vec::new();
        for row in x.chunks(width) {
            let ms = row.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / width as f64;
            let s = 1.0 / (ms + 1e-6).sqrt();
            want.extend(
                row.iter()
                    .zip(&w)
                    .map(|(&v, &g)| f64::from(v) * s * f64::from(g)),
            );
        }
        close(
            &ours,
            &want,
            1e-5,
            &format!("rms_norm width {width} seed {seed}"),
        );
    }
}

fn rope_f64(x: &[f32], pos: &[usize], hd: usize, n_rot: usize, base: f64, neox: bool) -> Vec<f64> {
    let mut out: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
    let width = x.len() / pos.len();
    for (r, &p) in pos.iter().enumerate() {
        for h in 0..width / hd {
            let o = r * width + h * hd;
            for i in 0..n_rot / 2 {
                let theta = p as f64 * base.powf(-2.0 * i as f64 / n_rot as f64);
                let (a, b) = if neox {
                    (o + i, o + i + n_rot / 2)
                } else {
                    (o + 2 * i, o + 2 * i + 1)
                };
                let (x0, x1) = (f64::from(x[a]), f64::from(x[b]));
                out[a] = x0 * theta.cos() - x1 * theta.sin();
                out[b] = x0 * theta.sin() + x1 * theta.cos();
            }
        }
    }
    out
}

#[test]
fn rope_matches_f64_in_both_modes() {
    let seed = 12;
    let mut rng = Rng::new(seed);
    let pos = [0usize, 1, 7, 100, 317];
    for (mode, neox) in [(RopeMode::Norm, false), (RopeMode::Neox, true)] {
        for (hd, n_rot) in [(64, 64), (128, 64)] {
            let x = rng.normals(pos.len() * 2 * hd, 1.0);
            let mut ours = x.clone();
            ops::rope(&mut ours, &pos, hd, n_rot, 10_000.0, mode);
            let want = rope_f64(&x, &pos, hd, n_rot, 10_000.0, neox);
            // f32 angles at position 317: |error| ~ 317 * 2^-24 per radian.
            close(
                &ours,
                &want,
                1e-4,
                &format!("rope {mode:?} hd {hd} rot {n_rot} seed {seed}"),
            );
        }
    }
}

#[test]
fn softmax_and_gates_match_f64() {
    let seed = 13;
    let mut rng = Rng::new(seed);
    let x = rng.normals(100, 5.0);
    let mut ours = x.clone();
    ops::softmax(&mut ours);
    let max = x.iter().fold(f64::MIN, |m, &v| m.max(f64::from(v)));
    let sum: f64 = x.iter().map(|&v| (f64::from(v) - max).exp()).sum();
    let want: Vec<f64> = x
        .iter()
        .map(|&v| (f64::from(v) - max).exp() / sum)
        .collect();
    close(&ours, &want, 1e-6, "softmax");
    let (g, u) = (rng.normals(64, 3.0), rng.normals(64, 1.0));
    let mut silu = g.clone();
    ops::silu_mul(&mut silu, &u);
    let want: Vec<f64> = g
        .iter()
        .zip(&u)
        .map(|(&a, &b)| f64::from(a) / (1.0 + (-f64::from(a)).exp()) * f64::from(b))
        .collect();
    close(&silu, &want, 1e-6, "silu_mul");
    let mut gelu = g.clone();
    ops::gelu_mul(&mut gelu, &u);
    let want: Vec<f64> = g
        .iter()
        .zip(&u)
        .map(|(&a, &b)| {
            let a = f64::from(a);
            0.5 * a
                * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (a + 0.044715 * a.powi(3))).tanh())
                * f64::from(b)
        })
        .collect();
    // ggml rounds the GELU input and output to fp16: relative error ~1e-3.
    close(&gelu, &want, 4e-3, "gelu_mul");
}

struct Case {
    n_head: usize,
    n_kv: usize,
    hd: usize,
    window: Option<usize>,
    softcap: Option<f32>,
}

/// Naive attention of one sequence: q [len, H*hd] at positions start..,
/// keys/values [start+len, KV*hd] by position.
fn attention_f64(c: &Case, q: &[f32], k: &[f32], v: &[f32], start: usize, len: usize) -> Vec<f64> {
    let (hd, kvw) = (c.hd, c.n_kv * c.hd);
    let mut out = Vec::new();
    for i in 0..len {
        let p = start + i;
        for h in 0..c.n_head {
            let kvh = h / (c.n_head / c.n_kv);
            let visible: Vec<usize> = (0..=p)
                .filter(|&j| c.window.is_none_or(|w| p - j < w))
                .collect();
            let mut s: Vec<f64> = visible
                .iter()
                .map(|&j| {
                    let dot: f64 = (0..hd)
                        .map(|d| {
                            f64::from(q[(i * c.n_head + h) * hd + d])
                                * f64::from(k[j * kvw + kvh * hd + d])
                        })
                        .sum();
                    let s = dot / (hd as f64).sqrt();
                    c.softcap
                        .map_or(s, |cap| f64::from(cap) * (s / f64::from(cap)).tanh())
                })
                .collect();
            let max = s.iter().cloned().fold(f64::MIN, f64::max);
            let sum: f64 = s
                .iter_mut()
                .map(|x| {
                    *x = (*x - max).exp();
                    *x
                })
                .sum();
            for d in 0..hd {
                out.push(
                    visible
                        .iter()
                        .zip(&s)
                        .map(|(&j, &w)| w / sum * f64::from(v[j * kvw + kvh * hd + d]))
                        .sum(),
                );
            }
        }
    }
    out
}

/// Two sequences' K/V written into a fresh cache through random,
/// non-contiguous block tables (positions 0..11 and 0..12).
struct Filled {
    cache: KvCache,
    tables: Vec<Vec<BlockId>>,
    keys: Vec<Vec<f32>>,
    vals: Vec<Vec<f32>>,
}

const STARTS: [usize; 2] = [0, 9];
const LENS: [usize; 2] = [11, 3];

fn fill(c: &Case, dtype: KvType, rng: &mut Rng) -> Filled {
    let (bs, num_blocks) = (4usize, 24usize);
    let kvw = c.n_kv * c.hd;
    let mut cache = KvCache::new(
        KvCacheConfig {
            num_blocks,
            block_size: bs,
            dtype,
        },
        1,
        kvw,
        kvw,
    );
    let mut free: Vec<u32> = (1..num_blocks as u32).collect();
    for i in (1..free.len()).rev() {
        free.swap(i, rng.below(i + 1));
    }
    let n = |s: usize| STARTS[s] + LENS[s];
    let tables: Vec<Vec<BlockId>> = (0..2)
        .map(|s| {
            (0..n(s).div_ceil(bs))
                .map(|_| BlockId(free.pop().unwrap_or(1)))
                .collect()
        })
        .collect();
    let keys: Vec<Vec<f32>> = (0..2).map(|s| rng.normals(n(s) * kvw, 1.0)).collect();
    let vals: Vec<Vec<f32>> = (0..2).map(|s| rng.normals(n(s) * kvw, 1.0)).collect();
    for s in 0..2 {
        let slots: Vec<Slot> = (0..n(s))
            .map(|p| Slot {
                block: tables[s][p / bs],
                offset: (p % bs) as u32,
            })
            .collect();
        cache.write(0, &slots, &keys[s], &vals[s]).expect("write");
    }
    Filled {
        cache,
        tables,
        keys,
        vals,
    }
}

#[test]
fn paged_attention_matches_f64() {
    let cases = [
        Case {
            n_head: 4,
            n_kv: 2,
            hd: 64,
            window: None,
            softcap: None,
        },
        Case {
            n_head: 4,
            n_kv: 1,
            hd: 32,
            window: Some(5),
            softcap: None,
        },
        Case {
            n_head: 2,
            n_kv: 2,
            hd: 16,
            window: None,
            softcap: Some(20.0),
        },
    ];
    let threads = Threads::new(2);
    for (ci, c) in cases.iter().enumerate() {
        for dtype in [KvType::F32, KvType::F16] {
            let seed = 100 + ci as u64;
            let mut rng = Rng::new(seed);
            let f = fill(c, dtype, &mut rng);
            let q: Vec<Vec<f32>> = (0..2)
                .map(|s| rng.normals(LENS[s] * c.n_head * c.hd, 1.0))
                .collect();
            let shape = AttnShape {
                n_head: c.n_head,
                n_head_kv: c.n_kv,
                head_dim_k: c.hd,
                head_dim_v: c.hd,
                scale: 1.0 / (c.hd as f32).sqrt(),
                window: c.window,
                softcap: c.softcap,
            };
            let seqs = [
                AttnSeq {
                    row: 0,
                    len: LENS[0],
                    start: STARTS[0],
                    block_table: &f.tables[0],
                },
                AttnSeq {
                    row: LENS[0],
                    len: LENS[1],
                    start: STARTS[1],
                    block_table: &f.tables[1],
                },
            ];
            let mut out = vec![0.0f32; (LENS[0] + LENS[1]) * c.n_head * c.hd];
            f.cache
                .attend(&threads, 0, &shape, &seqs, &q.concat(), &mut out)
                .expect("attend");
            let want: Vec<f64> = (0..2)
                .flat_map(|s| attention_f64(c, &q[s], &f.keys[s], &f.vals[s], STARTS[s], LENS[s]))
                .collect();
            let tol = if dtype == KvType::F16 { 3e-3 } else { 1e-5 };
            close(
                &out,
                &want,
                tol,
                &format!("attention case {ci} {dtype:?} seed {seed}"),
            );
        }
    }
}

#[test]
fn rope_freq_factors_and_linear_scaling_match_f64() {
    let seed = 14;
    let mut rng = Rng::new(seed);
    let (hd, pos) = (32usize, [3usize, 40, 200]);
    let x = rng.normals(pos.len() * hd, 1.0);
    let factors: Vec<f32> = (0..hd / 2).map(|i| 1.0 + i as f32 * 0.5).collect();
    let mut ours = x.clone();
    let p = ops::RopeParams {
        head_dim: hd,
        n_rot: hd,
        base: 500_000.0,
        freq_scale: 0.25,
        freq_factors: Some(&factors),
        mode: RopeMode::Norm,
    };
    ops::rope_with(&mut ours, &pos, &p);
    let mut want: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
    for (r, &p) in pos.iter().enumerate() {
        for (i, &ff) in factors.iter().enumerate() {
            let theta =
                0.25 * p as f64 * 500_000f64.powf(-2.0 * i as f64 / hd as f64) / f64::from(ff);
            let (a, b) = (r * hd + 2 * i, r * hd + 2 * i + 1);
            let (x0, x1) = (f64::from(x[a]), f64::from(x[b]));
            want[a] = x0 * theta.cos() - x1 * theta.sin();
            want[b] = x0 * theta.sin() + x1 * theta.cos();
        }
    }
    close(
        &ours,
        &want,
        1e-4,
        &format!("rope with factors seed {seed}"),
    );
}
