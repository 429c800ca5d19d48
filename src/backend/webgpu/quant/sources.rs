//! The WGSL sources of the quantized weight kernels, and which files make
//! up each variant.
//!
//! A variant is the backend's composition ([`PipelineKey::compose`]: the
//! prelude, common helpers and reductions) followed by the parts listed
//! here, in order: the `tile_t` alias (tiled kernel), the shared `Params`
//! struct, the quant helpers, one format file implementing the quant
//! interface (`shaders/quant/common.wgsl` documents it), the team reduction
//! (matrix-vector kernels) and the kernel file.

use crate::quant::GgmlType;

use super::super::caps::GpuCaps;
use super::super::shader::{ConstValue, PipelineKey};

/// The `Params` uniform struct every kernel here binds at 0.
pub const PARAMS_WGSL: &str = include_str!("../../../../shaders/matmul_params.wgsl");
/// Helpers the format files use, and the quant interface's types.
pub const QUANT_COMMON_WGSL: &str = include_str!("../../../../shaders/quant/common.wgsl");
/// Team reduction of the matrix-vector kernels, workgroup memory only.
pub const REDUCE_WGSL: &str = include_str!("../../../../shaders/matmul_reduce.wgsl");
/// Team reduction of the matrix-vector kernels, with subgroups.
pub const REDUCE_SG_WGSL: &str = include_str!("../../../../shaders/matmul_reduce_sg.wgsl");
/// Matrix-vector kernel (f32 dot of dequantized weights).
pub const MATVEC_WGSL: &str = include_str!("../../../../shaders/matmul_vec.wgsl");
/// The MoE experts' matrix-vector kernel, grouped by expert over routed ids.
pub const MOE_MATVEC_WGSL: &str = include_str!("../../../../shaders/moe_matvec.wgsl");
/// Matrix-vector kernel with packed int8 dot products.
pub const MATVEC_I8_WGSL: &str = include_str!("../../../../shaders/matmul_vec_i8.wgsl");
/// The int8 matrix-vector kernel with several rows per team (activations
/// loaded once for all of them).
pub const MATVEC_I8_ROWS_WGSL: &str = include_str!("../../../../shaders/matmul_vec_i8_rows.wgsl");
/// The int8 matrix-vector kernel's items from `quant_q32` (any int8 format).
pub const ITEM_Q32_WGSL: &str = include_str!("../../../../shaders/quant/item_q32.wgsl");
/// Activation quantizer feeding [`MATVEC_I8_WGSL`].
pub const QUANTIZE_X_WGSL: &str = include_str!("../../../../shaders/matmul_quantize_x.wgsl");
/// The quantizer's body, shared with the fused quantizers.
pub const QUANTIZE_Q8_WGSL: &str = include_str!("../../../../shaders/quantize_q8.wgsl");
/// Tiled matrix-matrix kernel.
pub const TILED_WGSL: &str = include_str!("../../../../shaders/matmul_tiled.wgsl");
/// Embedding lookup.
pub const GET_ROWS_WGSL: &str = include_str!("../../../../shaders/matmul_get_rows.wgsl");

const TILE_F16: &str = "alias tile_t = f16;\n";
const TILE_F32: &str = "alias tile_t = f32;\n";

/// The format file of `ty`, or `None` for a type the kernels do not run.
/// A quantized format's file defines `quant_q8` and whatever it computes
/// faster than from `quant_q8`; the rest of the quant interface comes
/// from `quant_q8` (`w8_of_q8.wgsl`, `q32_of_q8.wgsl`).
pub fn format_source(ty: GgmlType) -> Option<&'static str> {
    use GgmlType::*;
    macro_rules! quant {
        ($file:literal) => {
            concat!(
                include_str!(concat!("../../../../shaders/quant/", $file)),
                include_str!("../../../../shaders/quant/w8_of_q8.wgsl"),
            )
        };
        ($file:literal, q32_of_q8) => {
            concat!(
                quant!($file),
                include_str!("../../../../shaders/quant/q32_of_q8.wgsl"),
            )
        };
    }
    Some(match ty {
        F32 => include_str!("../../../../shaders/quant/f32.wgsl"),
        F16 => include_str!("../../../../shaders/quant/f16.wgsl"),
        BF16 => include_str!("../../../../shaders/quant/bf16.wgsl"),
        Q4_0 => quant!("q4_0.wgsl"),
        Q4_1 => quant!("q4_1.wgsl", q32_of_q8),
        Q5_0 => quant!("q5_0.wgsl", q32_of_q8),
        Q5_1 => quant!("q5_1.wgsl", q32_of_q8),
        Q8_0 => quant!("q8_0.wgsl"),
        Q2_K => quant!("q2_k.wgsl", q32_of_q8),
        Q3_K => quant!("q3_k.wgsl", q32_of_q8),
        Q4_K => quant!("q4_k.wgsl"),
        Q5_K => quant!("q5_k.wgsl", q32_of_q8),
        Q6_K => quant!("q6_k.wgsl"),
        IQ4_NL => quant!("iq4_nl.wgsl", q32_of_q8),
        IQ4_XS => quant!("iq4_xs.wgsl", q32_of_q8),
        _ => return None,
    })
}

/// The lower-case label of a type in pipeline keys (`q4_k`).
pub fn type_label(ty: GgmlType) -> &'static str {
    ty.weight_label().unwrap_or("unsupported")
}

/// The item file of `ty` reading rows in 16-byte loads through a second
/// binding of the weights (rows at multiples of 16 bytes), if it has one.
pub fn item_w4_source(ty: GgmlType) -> Option<&'static str> {
    match ty {
        GgmlType::Q4_K => Some(include_str!("../../../../shaders/quant/q4_k_item.wgsl")),
        GgmlType::Q6_K => Some(include_str!("../../../../shaders/quant/q6_k_item.wgsl")),
        _ => None,
    }
}

/// Whether `ty` has the int8 half of the quant interface (`quant_q8`).
pub fn has_int8(ty: GgmlType) -> bool {
    !matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}

/// The kernels of this module.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// Matrix-vector, f32 dot of dequantized weights (`matmul_vec.wgsl`).
    MatVec,
    /// Matrix-vector with packed int8 dots (`matmul_vec_i8.wgsl`).
    MatVecI8,
    /// Activation quantizer for [`Kernel::MatVecI8`] (no weight type).
    QuantizeX,
    /// Tiled matrix-matrix (`matmul_tiled.wgsl`).
    Tiled,
    /// Embedding lookup (`matmul_get_rows.wgsl`).
    GetRows,
    /// MoE expert rows over routed ids, f32 dot of dequantized weights
    /// (`moe_matvec.wgsl`).
    MoeMatVec,
}

impl Kernel {
    /// Every kernel.
    pub const ALL: [Kernel; 6] = [
        Kernel::MatVec,
        Kernel::MatVecI8,
        Kernel::QuantizeX,
        Kernel::Tiled,
        Kernel::GetRows,
        Kernel::MoeMatVec,
    ];

    /// The name in pipeline labels.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::MatVec => "matvec",
            Kernel::MatVecI8 => "matvec_i8",
            Kernel::QuantizeX => "quantize_x",
            Kernel::Tiled => "matmul",
            Kernel::GetRows => "get_rows",
            Kernel::MoeMatVec => "moe_matvec",
        }
    }

    /// Whether the kernel reads weights of `ty`.
    pub fn runs(self, ty: GgmlType) -> bool {
        format_source(ty).is_some() && (self != Kernel::MatVecI8 || has_int8(ty))
    }
}

/// Per-adapter tuning of the kernels: workgroup shapes, measured once per
/// device and passed in (the defaults suit most adapters).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KernelConfig {
    /// Invocations per matrix-vector workgroup (a power of two).
    pub mv_wg: u32,
    /// Read the weights of the int8 matrix-vector kernel in 16-byte loads
    /// where the format has an item file for it and rows are aligned. Off
    /// by default: on the H200 (Vulkan) the 4-byte loads decoded an 8B
    /// Q4_K_M model at 126 tokens/s, the 16-byte ones at 115.
    pub mv_w4: bool,
    /// Weight rows per matrix-vector workgroup (`mv_wg / mv_rows` invocations
    /// per row, a power of two).
    pub mv_rows: u32,
    /// Teams per workgroup of the int8 matrix-vector kernel when a
    /// workgroup takes several tokens (in place of `mv_rows`): wider teams
    /// there, as each item costs four tokens' activations.
    pub mv_batch_rows: u32,
    /// Most weight rows per team of the int8 matrix-vector kernel (a power
    /// of two; 1: `matmul_vec_i8.wgsl`, else `matmul_vec_i8_rows.wgsl`, which
    /// loads each item's activations once for all of a team's rows).
    pub mv_lane_rows: u32,
    /// Items of each row an invocation of the several-rows kernel loads
    /// before using any (1 or 2), at one token per workgroup (several
    /// tokens take 1). On the H200, 2 decoded at 173.5 tokens/s against
    /// 180.2 at 1.
    pub mv_lane_items: u32,
    /// Fewest workgroups a matrix-vector dispatch should have: the rows per
    /// team are halved (down to 1) while a weight part would have fewer, so
    /// that small weights still spread over the whole device.
    pub mv_min_groups: u32,
    /// Largest token count that uses the matrix-vector kernels; more tokens
    /// use the tiled kernel.
    pub mv_max_tokens: u32,
    /// Use packed int8 dot products for quantized weights in the
    /// matrix-vector kernels (activations quantized per 32 values).
    pub int8: bool,
    /// Tokens per tile of the tiled kernel (a multiple of `thread_m`).
    pub tile_m: u32,
    /// Weight rows per tile of the tiled kernel (a multiple of `thread_n`).
    pub tile_n: u32,
    /// Tokens per invocation of the tiled kernel.
    pub thread_m: u32,
    /// Weight rows per invocation of the tiled kernel.
    pub thread_n: u32,
    /// Keep the tiled kernel's tiles in f16 where the adapter has it (half
    /// the workgroup memory; each use converts back to f32). Off by default:
    /// on the H200 (Vulkan) f32 tiles of 128 x 128 prefilled an 8B Q4_K_M
    /// model at 1,377 tokens/s against 1,359 in f16, and rounding x to f16
    /// put the logits 4.3e-3 (nrmse) from the CPU's exact f32 against 1.2e-5.
    pub tile_f16: bool,
    /// Invocations of the one-thread-per-item kernels.
    pub flat_wg: u32,
}

impl Default for KernelConfig {
    fn default() -> Self {
        Self {
            mv_wg: 256,
            mv_w4: false,
            mv_rows: 8,
            mv_batch_rows: 4,
            // On the H200 (Vulkan), an 8B Q4_K_M model: 4 rows per team
            // decoded 4 sequences at 480 tokens/s against 371 at 1 row
            // (510 with teams of 64 there, `mv_batch_rows`), batch 1 at
            // 157.7 against 154.9.
            mv_lane_rows: 4,
            mv_lane_items: 1,
            // On the H200, an 8B model: 512 decoded one sequence at 187.2
            // tokens/s (4 sequences 497.1), 256 at 177.4-179.1 (500.6-513.1),
            // 128 at 157.4 (494.9).
            mv_min_groups: 512,
            mv_max_tokens: 8,
            int8: true,
            // 8 x 8 outputs per invocation: on the H200, 128 x 128 x 8 x 8
            // prefilled at 1,377 tokens/s, 64 x 64 x 4 x 4 at 1,291 (f32 tiles).
            tile_m: 128,
            tile_n: 128,
            thread_m: 8,
            thread_n: 8,
            tile_f16: false,
            flat_wg: 256,
        }
    }
}

impl KernelConfig {
    /// The default with `spec`'s overrides (`HEARTH_WEBGPU_KERNELS`, for
    /// tuning on a new adapter): comma-separated `key=value` of
    /// `tile=MxNxT[xU]` (tile_m x tile_n x thread_m [x thread_n, else 4]),
    /// `mv_rows`, `mv_wg`, `mv_batch_rows`, `mv_lane_rows`, `mv_lane_items`,
    /// `mv_min_groups`, `mv_max_tokens`, `int8`, `mv_w4` and `tile_f16`
    /// (0/1). Unknown or malformed entries are ignored, each with a warning
    /// in the list returned; [`KernelConfig::fit`] still applies.
    pub fn with_overrides(spec: &str) -> (Self, Vec<String>) {
        let mut c = Self::default();
        let mut warnings = Vec::new();
        for part in spec.split(',').filter(|p| !p.trim().is_empty()) {
            if c.set(part.trim()).is_none() {
                warnings.push(format!(
                    "ignoring `{part}` (want tile=MxNxT[xU], mv_rows=R, mv_wg=W, mv_batch_rows=B, \
                     mv_lane_rows=L, mv_lane_items=1|2, mv_min_groups=G, mv_max_tokens=T, int8=0|1, \
                     mv_w4=0|1 or tile_f16=0|1)"
                ));
            }
        }
        (c, warnings)
    }

    /// Applies one `key=value` override; `None` when it is not one.
    pub(super) fn set(&mut self, part: &str) -> Option<()> {
        let (key, value) = part.split_once('=')?;
        let num = |v: &str| v.parse::<u32>().ok().filter(|&n| n > 0);
        let flag = |v: &str| match v {
            "0" => Some(false),
            "1" => Some(true),
            _ => None,
        };
        match key {
            "tile" => {
                let d: Vec<u32> = value.split('x').map(num).collect::<Option<_>>()?;
                let (m, n, t, u) = match d[..] {
                    [m, n, t] => (m, n, t, 4),
                    [m, n, t, u] => (m, n, t, u),
                    _ => return None,
                };
                let valid = m % t == 0
                    && n % u == 0
                    && (m / t).is_power_of_two()
                    && (n / u).is_power_of_two();
                valid.then(|| {
                    (self.tile_m, self.tile_n, self.thread_m, self.thread_n) = (m, n, t, u)
                })
            }
            "mv_rows" => num(value)
                .filter(|v| v.is_power_of_two())
                .map(|v| self.mv_rows = v),
            "mv_wg" => num(value)
                .filter(|v| v.is_power_of_two())
                .map(|v| self.mv_wg = v),
            "mv_batch_rows" => num(value)
                .filter(|v| v.is_power_of_two())
                .map(|v| self.mv_batch_rows = v),
            "mv_lane_rows" => num(value)
                .filter(|v| v.is_power_of_two() && *v <= 16)
                .map(|v| self.mv_lane_rows = v),
            "mv_lane_items" => num(value)
                .filter(|v| *v <= 2)
                .map(|v| self.mv_lane_items = v),
            "mv_min_groups" => num(value).map(|v| self.mv_min_groups = v),
            "mv_max_tokens" => num(value).map(|v| self.mv_max_tokens = v),
            "tile_f16" => flag(value).map(|v| self.tile_f16 = v),
            "int8" => flag(value).map(|v| self.int8 = v),
            "mv_w4" => flag(value).map(|v| self.mv_w4 = v),
            _ => None,
        }
    }

    /// Invocations per tiled workgroup.
    pub fn tiled_wg(&self) -> u32 {
        (self.tile_m / self.thread_m) * (self.tile_n / self.thread_n)
    }

    /// `self` adjusted to what `caps` allows: workgroup sizes within the
    /// invocation limit, matrix-vector teams no narrower than a subgroup,
    /// tiles within workgroup memory.
    pub fn fit(mut self, caps: &GpuCaps) -> Self {
        let max_inv = caps
            .max_workgroup_invocations
            .min(caps.max_workgroup_size_x)
            .max(32);
        while self.mv_wg > max_inv {
            self.mv_wg /= 2;
        }
        // Teams at least one subgroup wide, so that their reductions stay
        // in subgroup operations (wave64 adapters).
        let fit_teams = |teams: u32| {
            let teams = teams.clamp(1, self.mv_wg);
            if caps.subgroups && self.mv_wg / teams < caps.subgroup_max_size {
                (self.mv_wg / caps.subgroup_max_size).max(1)
            } else {
                teams
            }
        };
        self.mv_rows = fit_teams(self.mv_rows);
        self.mv_batch_rows = fit_teams(self.mv_batch_rows);
        while self.flat_wg > max_inv {
            self.flat_wg /= 2;
        }
        let elem = if self.f16_tiles(caps) { 2 } else { 4 };
        // Tiles (rows of 32 values and 4 of padding) plus room for the
        // composed reduction buffers.
        let fits =
            |c: &Self| (c.tile_m + c.tile_n) * 36 * elem + 2048 <= caps.max_workgroup_storage;
        while (!fits(&self) || self.tiled_wg() > max_inv) && self.tile_m > self.thread_m {
            self.tile_m /= 2;
        }
        self
    }

    /// Whether the tiled kernel's tiles are f16 on `caps`.
    pub fn f16_tiles(&self, caps: &GpuCaps) -> bool {
        caps.f16 && self.tile_f16
    }

    /// Teams per workgroup of a matrix-vector kernel (`int8`: the int8
    /// one) taking `tokens` tokens per workgroup.
    pub fn teams(&self, int8: bool, tokens: u32) -> u32 {
        if int8 && tokens > 1 {
            self.mv_batch_rows
        } else {
            self.mv_rows
        }
    }

    /// Rows per team of the int8 matrix-vector kernel for a weight part of
    /// `rows` rows with `teams` teams per workgroup:
    /// [`KernelConfig::mv_lane_rows`], halved while the part would have
    /// fewer than [`KernelConfig::mv_min_groups`] workgroups.
    pub fn lane_rows_for(&self, rows: u64, teams: u32) -> u32 {
        let mut r = self.mv_lane_rows.max(1);
        while r > 1 && rows.div_ceil(u64::from(teams * r)) < u64::from(self.mv_min_groups) {
            r /= 2;
        }
        r
    }

    /// Invocations of a row team in the matrix-vector kernels (one token
    /// per workgroup).
    pub fn team(&self) -> u32 {
        self.mv_wg / self.mv_rows
    }
}

/// A composed variant: its pipeline key and the parts after the backend's
/// prelude, common helpers and reductions.
#[derive(Debug, Clone)]
pub struct Variant {
    /// The key (its `Display` is the pipeline label).
    pub key: PipelineKey,
    /// The parts, in composition order.
    pub parts: Vec<&'static str>,
    /// Binds the weights a second time (binding 5, as `vec4<u32>`).
    pub w4: bool,
}

/// The shape of a matrix-vector dispatch: what [`variant`] needs beyond
/// the kernel, the type and the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MvShape {
    /// Tokens per workgroup (1 or 4).
    pub tokens: u32,
    /// The weight's rows start at multiples of 16 bytes (the int8 kernel
    /// may then read them in 16-byte loads).
    pub aligned: bool,
    /// Weight rows per team of the int8 kernel (a power of two).
    pub lane_rows: u32,
    /// Several weights' rows in one dispatch (the int8 kernel of several
    /// rows per team, even at one).
    pub joined: bool,
}

impl MvShape {
    /// `tokens` per workgroup, one row per team.
    pub fn new(tokens: u32, aligned: bool) -> Self {
        Self {
            tokens,
            aligned,
            lane_rows: 1,
            joined: false,
        }
    }
}

/// The variant of `kernel` for weights of `ty` (ignored by
/// [`Kernel::QuantizeX`]) on `caps` with `cfg`, of the matrix-vector
/// shape `mv` (ignored by the other kernels). `None` when the kernel does
/// not run `ty`.
pub fn variant(
    kernel: Kernel,
    ty: GgmlType,
    caps: &GpuCaps,
    cfg: &KernelConfig,
    mv: MvShape,
) -> Option<Variant> {
    let MvShape {
        tokens,
        aligned,
        joined,
        ..
    } = mv;
    if kernel != Kernel::QuantizeX && !kernel.runs(ty) {
        return None;
    }
    let ty_parts = |ty| {
        [
            PARAMS_WGSL,
            QUANT_COMMON_WGSL,
            format_source(ty).unwrap_or(""),
        ]
    };
    Some(match kernel {
        Kernel::MoeMatVec => {
            let teams = cfg.mv_rows;
            let team = cfg.mv_wg / teams;
            let sg = caps.subgroups
                && caps.subgroup_min_size >= 4
                && caps.subgroup_max_size <= team
                && team.is_multiple_of(caps.subgroup_max_size.max(1));
            let key = PipelineKey::new(kernel.name(), cfg.mv_wg, caps)
                .with_ty(type_label(ty))
                .with_subgroups(sg)
                .with_const("MV_ROWS", ConstValue::U32(teams))
                .with_const("MV_TOKENS", ConstValue::U32(tokens));
            let mut parts = ty_parts(ty).to_vec();
            parts.push(if sg { REDUCE_SG_WGSL } else { REDUCE_WGSL });
            parts.push(MOE_MATVEC_WGSL);
            Variant {
                key,
                parts,
                w4: false,
            }
        }
        Kernel::MatVec | Kernel::MatVecI8 => {
            let teams = cfg.teams(kernel == Kernel::MatVecI8, tokens);
            let team = cfg.mv_wg / teams;
            let sg = caps.subgroups
                && caps.subgroup_min_size >= 4
                && caps.subgroup_max_size <= team
                && team.is_multiple_of(caps.subgroup_max_size.max(1));
            let mut key = PipelineKey::new(kernel.name(), cfg.mv_wg, caps)
                .with_ty(type_label(ty))
                .with_subgroups(sg)
                .with_const("MV_ROWS", ConstValue::U32(teams))
                .with_const("MV_TOKENS", ConstValue::U32(tokens));
            let mut parts = ty_parts(ty).to_vec();
            let mut w4 = false;
            let lane_rows = if kernel == Kernel::MatVecI8 {
                mv.lane_rows.max(1)
            } else {
                1
            };
            // The several-rows kernel: its outputs 2 and 3 take binding 5,
            // so it reads the weights through `w` alone.
            let rows_kernel = kernel == Kernel::MatVecI8 && (lane_rows > 1 || joined);
            let lane_items = if tokens == 1 {
                cfg.mv_lane_items.clamp(1, 2)
            } else {
                1
            };
            if kernel == Kernel::MatVecI8 {
                let item = item_w4_source(ty).filter(|_| cfg.mv_w4 && aligned && !rows_kernel);
                w4 = item.is_some();
                parts.push(item.unwrap_or(ITEM_Q32_WGSL));
                key = key.with_const("MV_W4", ConstValue::Bool(w4));
                if rows_kernel {
                    key = key
                        .with_const("MV_LR", ConstValue::U32(lane_rows))
                        .with_const("MV_LU", ConstValue::U32(lane_items));
                }
            }
            parts.push(if sg { REDUCE_SG_WGSL } else { REDUCE_WGSL });
            parts.push(match kernel {
                Kernel::MatVec => MATVEC_WGSL,
                _ if rows_kernel => MATVEC_I8_ROWS_WGSL,
                _ => MATVEC_I8_WGSL,
            });
            Variant { key, parts, w4 }
        }
        Kernel::QuantizeX => Variant {
            key: PipelineKey::new(kernel.name(), cfg.flat_wg, caps)
                .with_subgroups(caps.quad_subgroups()),
            parts: vec![PARAMS_WGSL, QUANTIZE_Q8_WGSL, QUANTIZE_X_WGSL],
            w4: false,
        },
        Kernel::Tiled => {
            let key = PipelineKey::new(kernel.name(), cfg.tiled_wg(), caps)
                .with_ty(type_label(ty))
                .with_f16(cfg.f16_tiles(caps))
                .with_subgroups(false)
                .with_const("TILE_M", ConstValue::U32(cfg.tile_m))
                .with_const("TILE_N", ConstValue::U32(cfg.tile_n))
                .with_const("THREAD_M", ConstValue::U32(cfg.thread_m))
                .with_const("THREAD_N", ConstValue::U32(cfg.thread_n));
            let mut parts = vec![if cfg.f16_tiles(caps) {
                TILE_F16
            } else {
                TILE_F32
            }];
            parts.extend(ty_parts(ty));
            parts.push(TILED_WGSL);
            Variant {
                key,
                parts,
                w4: false,
            }
        }
        Kernel::GetRows => {
            let key = PipelineKey::new(kernel.name(), cfg.flat_wg, caps)
                .with_ty(type_label(ty))
                .with_subgroups(false);
            let mut parts = ty_parts(ty).to_vec();
            parts.push(GET_ROWS_WGSL);
            Variant {
                key,
                parts,
                w4: false,
            }
        }
    })
}
