//! The settings of the one-token passes that differ by micro-architecture:
//! which CPU this is ([`Microarch`]), how many streams a pass reads
//! ([`one_token_groups`]) and how far ahead it prefetches
//! ([`bands_ahead`], [`PASS_AHEAD`]). Each doc states the rule; the
//! measurements behind it are in `docs/perf.md` ("x86 one-token passes").

#[cfg(test)]
use super::{available, layout};
#[cfg(test)]
use crate::backend::cpu::kernels::Isa;
#[cfg(test)]
use crate::quant::GgmlType;

/// The micro-architectures whose kernels are tuned apart from the rest
/// (where a measured setting differs from the one measured elsewhere).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Microarch {
    /// AMD Zen 5 (family 1Ah).
    Zen5,
    /// Any other x86-64 CPU: the settings measured on Intel Ice Lake.
    Other,
}

/// This CPU's [`Microarch`], from `cpuid`'s vendor and family (read once:
/// in a virtual machine each `cpuid` traps to the hypervisor).
pub(super) fn microarch() -> Microarch {
    static MODEL: std::sync::OnceLock<Microarch> = std::sync::OnceLock::new();
    *MODEL.get_or_init(read_microarch)
}

/// [`microarch`], read.
fn read_microarch() -> Microarch {
    use std::arch::x86_64::__cpuid;
    let leaf0 = __cpuid(0);
    let word = |s: &[u8; 4]| u32::from_le_bytes(*s);
    let amd = [leaf0.ebx, leaf0.edx, leaf0.ecx] == [word(b"Auth"), word(b"enti"), word(b"cAMD")];
    if !amd || leaf0.eax < 1 {
        return Microarch::Other;
    }
    let eax = __cpuid(1).eax;
    let base = (eax >> 8) & 0xF;
    let family = if base == 0xF {
        base + ((eax >> 20) & 0xFF)
    } else {
        base
    };
    match family {
        0x1A => Microarch::Zen5,
        _ => Microarch::Other,
    }
}

/// The most groups of 16 rows the AVX-512 one-token passes
/// (`k256::tiles16::run_bands`, `q32::tiles16::run_bands`) read side by
/// side: each group is one stream through memory, and how many streams
/// keep the most reads in flight depends on the core's prefetchers.
/// - AMD Zen 5: one, for every format, with each stream prefetching far
///   enough ahead ([`bands_ahead`]): it read faster than two or four
///   groups at one and two threads, whole models included.
/// - Other CPUs: four, as measured on Intel Ice Lake (four read faster
///   than one or two from DRAM).
///
/// The measurements are in `docs/perf.md` ("x86 one-token passes").
pub(super) fn one_token_groups() -> usize {
    match microarch() {
        Microarch::Zen5 => 1,
        Microarch::Other => 4,
    }
}

/// How far ahead of its reads each of the `groups` streams of a one-token
/// pass prefetches (`q32::one_token::one_token_bands`, and the Q4_K and
/// IQ4_XS passes of `k256/one_token_bands.rs`; its Q6_K pass with a floor,
/// `k256::one_token_bands::q6k_ahead`): [`PASS_AHEAD`] bytes over them
/// all.
pub(super) const fn bands_ahead(groups: usize) -> usize {
    PASS_AHEAD / groups
}

/// Bytes a one-token pass prefetches ahead of its reads, over all its
/// streams ([`bands_ahead`]): 8192, the fastest on AMD Zen 5 (one stream:
/// 2048 came too late, more than 8192 read slower) and, shared by four
/// streams, as fast as 2048 each on Intel Ice Lake (1024 to 8192 bytes a
/// stream read alike there). The measurements are in `docs/perf.md` ("x86
/// one-token passes").
const PASS_AHEAD: usize = 8192;

/// A one-token pass of the AVX-512 kernels over whole rows of a weight
/// (`k256::tiles16::run_bands`, `q32::tiles16::run_bands` at some width).
#[cfg(test)]
pub(super) type PassFn =
    unsafe fn(&[u8], usize, &[u8], usize, crate::backend::cpu::kernels::Out<'_>);

/// Asserts that each of `passes` (`(groups per pass, pass)`) gives the
/// first one's results bit for bit, and that those are finite: 91 rows of
/// 3 random blocks of `ty` (seeded by `seed`; the f16 scales at the byte
/// offsets `f16_at` of each block kept finite and small), laid out as
/// [`layout`] says, by the one activation row `acts` makes from the same
/// generator (3 blocks). Prints a reason and checks nothing where the CPU
/// lacks AVX-512 VNNI.
#[cfg(test)]
pub(super) fn assert_passes_agree(
    ty: GgmlType,
    f16_at: &[usize],
    seed: u64,
    acts: impl FnOnce(&mut crate::quant::reference::testutil::Rng, usize) -> Vec<u8>,
    passes: &[(usize, PassFn)],
) {
    if !available(Isa::Avx512) {
        eprintln!("skipped: this CPU lacks AVX-512 VNNI");
        return;
    }
    let (bb, nb, rows) = (ty.block_bytes(), 3, 91);
    let mut rng = crate::quant::reference::testutil::Rng::new(seed);
    let mut w: Vec<u8> = (0..rows * nb * bb).map(|_| rng.next_u32() as u8).collect();
    for block in w.chunks_exact_mut(bb) {
        for &at in f16_at {
            // Finite and small: exponent well below all ones.
            block[at + 1] &= 0x3B;
        }
    }
    layout(Isa::Avx512, ty).apply(&mut w, nb * bb, bb);
    let a = acts(&mut rng, nb);
    let run = |f: PassFn| {
        let mut out = vec![f32::NAN; rows];
        let o = crate::backend::cpu::kernels::Out {
            out: &mut out,
            row_stride: 1,
            tok_stride: rows,
        };
        // SAFETY: AVX-512 VNNI is available (checked above); `w` is `rows`
        // rows laid out as the passes read them.
        unsafe { f(&w, nb * bb, &a, a.len(), o) };
        out
    };
    let Some(&(g0, first)) = passes.first() else {
        return;
    };
    let want = run(first);
    assert!(
        want.iter().all(|x| x.is_finite()),
        "{ty} seed {seed}: {want:?}"
    );
    for &(g, pass) in &passes[1..] {
        let got = run(pass);
        for (r, (x, y)) in want.iter().zip(&got).enumerate() {
            assert_eq!(
                x.to_bits(),
                y.to_bits(),
                "{ty} seed {seed} row {r}: {x} by {g0} groups per pass, {y} by {g}"
            );
        }
    }
}
