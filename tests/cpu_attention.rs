//! The fast paged attention (every ISA this CPU has, 1 and 2 threads)
//! against the scalar one and an f64 reference, on seeded random shapes:
//! GQA ratios, head widths with SIMD tails, sliding windows, softcap, f16
//! and f32 caches, block tables in random order with unused blocks between,
//! ragged batches mixing prefill and long-context decode (split-K).

#[path = "model_support/rng.rs"]
mod rng;

use half::f16;
use hearth::backend::cpu::attention::{
    attend_slots_scalar, attend_slots_with, AttnSeq, AttnShape, KvRef, LayerKv,
};
use hearth::backend::cpu::attn_kernels::AttnKernels;
use hearth::backend::cpu::kernels::Isa;
use hearth::backend::cpu::threads::Threads;
use rng::Rng;

/// One random attention call.
struct Case {
    shape: AttnShape,
    f16: bool,
    /// Per sequence: (start, len) and its slot list (`start + len` slots).
    seqs: Vec<(usize, usize)>,
    slots: Vec<Vec<usize>>,
    /// Cache contents as f32 (already rounded to f16 when `f16`).
    k: Vec<f32>,
    v: Vec<f32>,
    q: Vec<f32>,
}

fn pick<T: Copy>(rng: &mut Rng, xs: &[T]) -> T {
    xs[rng.below(xs.len())]
}

fn case(rng: &mut Rng) -> Case {
    let n_kv = pick(rng, &[1, 2, 3]);
    let group = pick(rng, &[1, 2, 3, 4]);
    let hk = pick(rng, &[20, 40, 64, 96, 256]);
    let hv = pick(rng, &[hk, hk, 24, 64]);
    let window = pick(rng, &[None, None, Some(5), Some(37), Some(300)]);
    let softcap = pick(rng, &[None, None, Some(10.0f32)]);
    let bs = pick(rng, &[4usize, 16, 32]);
    let n_seq = 1 + rng.below(3);
    let seqs: Vec<(usize, usize)> = (0..n_seq)
        .map(|_| match rng.below(3) {
            0 => (rng.below(600), 1),    // decode, long contexts split
            1 => (0, 1 + rng.below(45)), // prefill
            _ => (rng.below(40), 1 + rng.below(20)),
        })
        .collect();
    let blocks: usize = seqs.iter().map(|&(s, l)| (s + l).div_ceil(bs)).sum();
    // Random order, block 0 and others left unused (holes).
    let num_blocks = blocks * 2 + 1;
    let mut free: Vec<usize> = (1..num_blocks).collect();
    for i in (1..free.len()).rev() {
        free.swap(i, rng.below(i + 1));
    }
    let slots: Vec<Vec<usize>> = seqs
        .iter()
        .map(|&(s, l)| {
            let table: Vec<usize> = (0..(s + l).div_ceil(bs))
                .map(|_| free.pop().unwrap_or(0))
                .collect();
            (0..s + l).map(|p| table[p / bs] * bs + p % bs).collect()
        })
        .collect();
    let f16 = rng.below(2) == 0;
    let round = |x: Vec<f32>| -> Vec<f32> {
        if f16 {
            x.into_iter().map(|v| f16::from_f32(v).to_f32()).collect()
        } else {
            x
        }
    };
    let cells = num_blocks * bs;
    let k = round(rng.normals(cells * n_kv * hk, 1.0));
    let v = round(rng.normals(cells * n_kv * hv, 1.0));
    let tokens: usize = seqs.iter().map(|s| s.1).sum();
    let q = rng.normals(tokens * n_kv * group * hk, 1.0);
    Case {
        shape: AttnShape {
            n_head: n_kv * group,
            n_head_kv: n_kv,
            head_dim_k: hk,
            head_dim_v: hv,
            scale: 1.0 / (hk as f32).sqrt(),
            window,
            softcap,
        },
        f16,
        seqs,
        slots,
        k,
        v,
        q,
    }
}

impl Case {
    fn attn_seqs(&self) -> Vec<AttnSeq<'static>> {
        let mut row = 0;
        self.seqs
            .iter()
            .map(|&(start, len)| {
                let s = AttnSeq {
                    row,
                    len,
                    start,
                    block_table: &[],
                };
                row += len;
                s
            })
            .collect()
    }

    fn rows(&self) -> usize {
        self.seqs.iter().map(|s| s.1).sum()
    }

    /// Runs `f` on the cache as the case's type.
    fn with_kv<R>(&self, f: impl FnOnce(LayerKv<'_>) -> R) -> R {
        if self.f16 {
            let k: Vec<f16> = self.k.iter().map(|&x| f16::from_f32(x)).collect();
            let v: Vec<f16> = self.v.iter().map(|&x| f16::from_f32(x)).collect();
            f(LayerKv {
                k: KvRef::F16(&k),
                v: KvRef::F16(&v),
            })
        } else {
            f(LayerKv {
                k: KvRef::F32(&self.k),
                v: KvRef::F32(&self.v),
            })
        }
    }

    /// The f64 reference.
    fn reference(&self) -> Vec<f64> {
        let s = &self.shape;
        let (hk, hv, g) = (s.head_dim_k, s.head_dim_v, s.n_head / s.n_head_kv);
        let (kw, vw) = (s.n_head_kv * hk, s.n_head_kv * hv);
        let mut out = Vec::new();
        for (si, &(start, len)) in self.seqs.iter().enumerate() {
            let row0: usize = self.seqs[..si].iter().map(|s| s.1).sum();
            for i in 0..len {
                let p = start + i;
                let first = s.window.map_or(0, |w| (p + 1).saturating_sub(w));
                for h in 0..s.n_head {
                    let kvh = h / g;
                    let q = &self.q[((row0 + i) * s.n_head + h) * hk..][..hk];
                    let mut sc: Vec<f64> = (first..=p)
                        .map(|j| {
                            let at = self.slots[si][j] * kw + kvh * hk;
                            let d: f64 = (0..hk)
                                .map(|d| f64::from(q[d]) * f64::from(self.k[at + d]))
                                .sum();
                            let x = d * f64::from(s.scale);
                            s.softcap
                                .map_or(x, |c| f64::from(c) * (x / f64::from(c)).tanh())
                        })
                        .collect();
                    let mx = sc.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v));
                    sc.iter_mut().for_each(|v| *v = (*v - mx).exp());
                    let sum: f64 = sc.iter().sum();
                    for d in 0..hv {
                        out.push(
                            (first..=p)
                                .zip(&sc)
                                .map(|(j, &w)| {
                                    w / sum
                                        * f64::from(self.v[self.slots[si][j] * vw + kvh * hv + d])
                                })
                                .sum(),
                        );
                    }
                }
            }
        }
        out
    }
}

fn assert_close(ours: &[f32], want: &[f64], tol: f64, what: &str) {
    assert_eq!(ours.len(), want.len(), "{what}");
    for (i, (&a, &b)) in ours.iter().zip(want).enumerate() {
        assert!(
            (f64::from(a) - b).abs() <= tol * (1.0 + b.abs()),
            "{what} [{i}]: {a} vs {b}"
        );
    }
}

#[test]
fn fast_attention_matches_scalar_and_f64_on_random_shapes() {
    let isas: Vec<AttnKernels> = Isa::ALL
        .into_iter()
        .filter_map(AttnKernels::for_isa)
        .collect();
    assert!(!isas.is_empty());
    let pools = [Threads::new(1), Threads::new(2)];
    for seed in 0..60u64 {
        let mut rng = Rng::new(0xA77E + seed);
        let c = case(&mut rng);
        let what = |name: &str| {
            format!(
                "seed {seed}: {name} {:?} f16={} seqs {:?}",
                c.shape, c.f16, c.seqs
            )
        };
        let seqs = c.attn_seqs();
        let n_out = c.rows() * c.shape.n_head * c.shape.head_dim_v;
        let want = c.reference();
        let scalar = c.with_kv(|kv| {
            let mut out = vec![f32::NAN; n_out];
            attend_slots_scalar(&pools[0], kv, &c.shape, &seqs, &c.slots, &c.q, &mut out)
                .map(|()| out)
        });
        let scalar = scalar.unwrap_or_else(|e| panic!("{}: {e}", what("scalar")));
        assert_close(&scalar, &want, 2e-5, &what("scalar vs f64"));
        for k in &isas {
            for t in &pools {
                let fast = c.with_kv(|kv| {
                    let mut out = vec![f32::NAN; n_out];
                    attend_slots_with(k, t, kv, &c.shape, &seqs, &c.slots, &c.q, &mut out)
                        .map(|()| out)
                });
                let name = format!("{k:?} x{}", t.count());
                let fast = fast.unwrap_or_else(|e| panic!("{}: {e}", what(&name)));
                assert_close(&fast, &want, 2e-5, &what(&format!("{name} vs f64")));
                let s64: Vec<f64> = scalar.iter().map(|&x| f64::from(x)).collect();
                assert_close(&fast, &s64, 2e-5, &what(&format!("{name} vs scalar")));
            }
        }
    }
}

#[test]
fn gathers_widen_every_kind_of_half_as_the_scalar_one() {
    // f16 cache rows (widths with and without a tail of eight) holding
    // normal values and, at random places, zeros of both signs,
    // subnormals, infinities and NaNs: every ISA's gather gives the scalar
    // gather's bits (vector kernels may pick a conversion per chunk).
    let scalar = AttnKernels::scalar();
    let edges = [
        0x0000u16, 0x8000, 0x0001, 0x83FF, 0x0200, 0x7C00, 0xFC00, 0x7E00, 0x0400,
    ];
    for k in Isa::ALL.into_iter().filter_map(AttnKernels::for_isa) {
        for seed in 0..20u64 {
            let mut rng = Rng::new(0x6A7E + seed);
            let width = pick(&mut rng, &[8usize, 24, 64, 70]);
            let (stride, off) = (width + 16, pick(&mut rng, &[0usize, 16]));
            let n_slots = 1 + rng.below(12);
            let rows = n_slots + 3;
            let mut cache: Vec<f16> = rng
                .normals(rows * stride, 2.0)
                .into_iter()
                .map(f16::from_f32)
                .collect();
            // Some chunks of eight with an edge, some without.
            for _ in 0..rng.below(2 * rows) {
                let at = rng.below(cache.len());
                cache[at] = f16::from_bits(pick(&mut rng, &edges));
            }
            let slots: Vec<usize> = (0..n_slots).map(|_| rng.below(rows)).collect();
            let mut want = vec![0.0f32; n_slots * width];
            let mut got = vec![1.0f32; n_slots * width];
            (scalar.gather)(KvRef::F16(&cache), &slots, stride, off, &mut want);
            (k.gather)(KvRef::F16(&cache), &slots, stride, off, &mut got);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    w.to_bits(),
                    "{k:?} seed {seed} width {width} [{i}]: {g} vs {w}"
                );
            }
        }
    }
}

#[test]
fn attention_rejects_mismatched_shapes() {
    let mut rng = Rng::new(7);
    let c = case(&mut rng);
    let seqs = c.attn_seqs();
    let k = AttnKernels::best();
    let t = Threads::new(1);
    let n_out = c.rows() * c.shape.n_head * c.shape.head_dim_v;
    let r = c.with_kv(|kv| {
        let mut out = vec![0.0; n_out + 1];
        attend_slots_with(&k, &t, kv, &c.shape, &seqs, &c.slots, &c.q, &mut out)
    });
    assert!(r.is_err());
}
