//! aarch64 kernels: NEON (every aarch64 CPU), with the dotprod extension's
//! `sdot` chosen at run time where the CPU has it.
//!
//! `neon.rs` writes each kernel once, over an int8 dot primitive, and
//! instantiates it twice: `plain` (widening multiplies, `smull` + `sadalp`)
//! and `sdot` (`target_feature = "dotprod"`). Entries are reachable only
//! through [`vec_dot`] and [`quantizer`] here, which the kernel table calls
//! only for an [`Isa`] that [`available`] confirmed, and [`vec_dot`] picks the
//! `sdot` kernels only after detecting dotprod: that is the safety argument
//! of every `unsafe` call in the entries.
//!
//! Agreement with the scalar kernels is as on x86 (`x86/mod.rs`): exact
//! integer block sums in the scalar float order, so the 32-element formats
//! are bit-identical; Q4_K and Q6_K scale each block's exact sum once.

mod neon;

use super::{DotFn, Isa, QuantizeFn};
use crate::quant::GgmlType;

/// Whether this CPU runs `isa`'s kernels.
pub(super) fn available(isa: Isa) -> bool {
    match isa {
        Isa::Scalar => true,
        Isa::Neon => std::arch::is_aarch64_feature_detected!("neon"),
        _ => false,
    }
}

/// The NEON dot of weight type `ty` under `isa`, `None` where the scalar one
/// stays. Callers must have checked [`available`]`(isa)`.
pub(super) fn vec_dot(isa: Isa, ty: GgmlType) -> Option<DotFn> {
    match isa {
        Isa::Neon if std::arch::is_aarch64_feature_detected!("dotprod") => neon::vec_dot_sdot(ty),
        Isa::Neon => neon::vec_dot_plain(ty),
        _ => None,
    }
}

/// The NEON activation quantizer to `ty` under `isa`, `None` where the
/// scalar one stays. Callers must have checked [`available`]`(isa)`.
pub(super) fn quantizer(isa: Isa, ty: GgmlType) -> Option<QuantizeFn> {
    match isa {
        Isa::Neon => neon::quantizer(ty),
        _ => None,
    }
}
