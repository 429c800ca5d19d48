//! Shader composition and the pipeline cache.
//!
//! A shader is the concatenation of real `.wgsl` files under `shaders/`
//! (included with `include_str!`, so naga and editors see whole files):
//!
//! 1. a generated prelude: the `enable` lines of the target (naga rejects
//!    `enable subgroups;`, Dawn requires it) and typed constants
//!    (`const WG: u32 = 256u;`, `const HAS_F16: bool = true;`, ...);
//! 2. common helpers (`shaders/common.wgsl`) and the reduction helpers of
//!    the adapter (`reduce_sg.wgsl` with subgroups, `reduce_wg.wgsl`
//!    without: both define the same functions);
//! 3. optionally one quant file implementing the fixed weight interface;
//! 4. one kernel file with the entry point `main`.
//!
//! No preprocessor: variants differ by constants and by which files are
//! composed. Pipelines are cached under a [`PipelineKey`] whose `Display`
//! is the label (`matvec.q4_k.sg.wg256`).

use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::sync::Arc;

use super::caps::{GpuCaps, ShaderTarget};

/// Helpers every kernel may use (indexing of large dispatches, f16 packing).
pub const COMMON_WGSL: &str = include_str!("../../../shaders/common.wgsl");
/// Workgroup reductions through subgroup operations.
pub const REDUCE_SG_WGSL: &str = include_str!("../../../shaders/reduce_sg.wgsl");
/// Workgroup reductions through workgroup memory (no subgroups).
pub const REDUCE_WG_WGSL: &str = include_str!("../../../shaders/reduce_wg.wgsl");

/// A typed constant of the prelude.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConstValue {
    /// `u32`.
    U32(u32),
    /// `i32`.
    I32(i32),
    /// `f32`, by its bits (so keys stay `Eq + Hash`).
    F32Bits(u32),
    /// `bool`.
    Bool(bool),
}

impl ConstValue {
    /// An `f32` constant.
    pub fn f32(v: f32) -> Self {
        ConstValue::F32Bits(v.to_bits())
    }
}

impl fmt::Display for ConstValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ConstValue::U32(v) => write!(f, "{v}u"),
            ConstValue::I32(v) => write!(f, "{v}i"),
            ConstValue::F32Bits(b) => {
                let v = f32::from_bits(b);
                if v.is_finite() {
                    // The f32's exact value: its shortest f32 form may lie
                    // past f32::MAX as a decimal, which Tint rejects.
                    write!(f, "{:e}f", f64::from(v))
                } else {
                    write!(f, "bitcast<f32>({b}u)")
                }
            }
            ConstValue::Bool(v) => write!(f, "{v}"),
        }
    }
}

impl ConstValue {
    fn wgsl_type(&self) -> &'static str {
        match self {
            ConstValue::U32(_) => "u32",
            ConstValue::I32(_) => "i32",
            ConstValue::F32Bits(_) => "f32",
            ConstValue::Bool(_) => "bool",
        }
    }
}

/// Identifies a compiled pipeline: the kernel, the weight type it reads
/// (if any), the adapter features it uses, its workgroup size and any
/// further compile-time constants.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PipelineKey {
    /// Kernel name (`rms_norm`, `matvec`).
    pub kernel: &'static str,
    /// Weight type the kernel reads (`q4_k`), if any.
    pub ty: Option<&'static str>,
    /// Uses shader-f16.
    pub f16: bool,
    /// Uses subgroup operations.
    pub subgroups: bool,
    /// Workgroup size (x).
    pub wg: u32,
    /// Further constants, in the order the prelude declares them.
    pub consts: Vec<(&'static str, ConstValue)>,
}

impl PipelineKey {
    /// A key for `kernel` at workgroup size `wg` using the adapter's
    /// subgroups when `caps` has them (no f16, no weight type).
    pub fn new(kernel: &'static str, wg: u32, caps: &GpuCaps) -> Self {
        Self {
            kernel,
            ty: None,
            f16: false,
            subgroups: caps.subgroups,
            wg,
            consts: Vec::new(),
        }
    }

    /// The kernel kind, for profiles: the kernel, its weight type and its
    /// `MODE` constant if any (`matvec_i8.q4_k`, `binary.mode0`).
    pub fn kind(&self) -> String {
        let mut s = self.kernel.to_string();
        if let Some(ty) = self.ty {
            s.push('.');
            s.push_str(ty);
        }
        for (name, v) in &self.consts {
            if *name == "MODE" {
                let _ = write!(s, ".mode{}", v.to_string().trim_end_matches('u'));
            }
            // Rows per team of the int8 matrix-vector kernel: by weight shape.
            if *name == "MV_LR" {
                let _ = write!(s, ".lr{}", v.to_string().trim_end_matches('u'));
            }
        }
        s
    }

    /// With a weight type.
    pub fn with_ty(mut self, ty: &'static str) -> Self {
        self.ty = Some(ty);
        self
    }

    /// With shader-f16 on or off.
    pub fn with_f16(mut self, f16: bool) -> Self {
        self.f16 = f16;
        self
    }

    /// With subgroups forced on or off.
    pub fn with_subgroups(mut self, on: bool) -> Self {
        self.subgroups = on;
        self
    }

    /// With one more constant.
    pub fn with_const(mut self, name: &'static str, v: ConstValue) -> Self {
        self.consts.push((name, v));
        self
    }

    /// The prelude of this variant for `target`: `enable` lines and the
    /// typed constants every kernel may read.
    pub fn prelude(&self, target: ShaderTarget, sg_min: u32) -> String {
        let mut s = String::new();
        if self.f16 {
            s.push_str("enable f16;\n");
        }
        if self.subgroups && target == ShaderTarget::Browser {
            s.push_str("enable subgroups;\n");
        }
        let _ = writeln!(s, "const WG: u32 = {}u;", self.wg);
        let _ = writeln!(s, "const HAS_F16: bool = {};", self.f16);
        let _ = writeln!(s, "const HAS_SUBGROUPS: bool = {};", self.subgroups);
        let _ = writeln!(s, "const SG_MIN: u32 = {}u;", sg_min.max(1));
        for (name, v) in &self.consts {
            let _ = writeln!(s, "const {name}: {} = {v};", v.wgsl_type());
        }
        s
    }

    /// The full source: prelude, common helpers, the reduction helpers of
    /// this variant, then `parts` (a quant file, the kernel file).
    pub fn compose(&self, target: ShaderTarget, sg_min: u32, parts: &[&str]) -> String {
        let mut s = self.prelude(target, sg_min);
        s.push_str(COMMON_WGSL);
        s.push_str(if self.subgroups {
            REDUCE_SG_WGSL
        } else {
            REDUCE_WG_WGSL
        });
        for p in parts {
            s.push('\n');
            s.push_str(p);
        }
        s
    }
}

impl fmt::Display for PipelineKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kernel)?;
        if let Some(ty) = self.ty {
            write!(f, ".{ty}")?;
        }
        if self.f16 {
            f.write_str(".f16")?;
        }
        if self.subgroups {
            f.write_str(".sg")?;
        }
        write!(f, ".wg{}", self.wg)?;
        for (name, v) in &self.consts {
            write!(f, ".{}{v}", name.to_lowercase())?;
        }
        Ok(())
    }
}

/// Compiled compute pipelines by key. Entry point `main`; the bind group
/// layout is derived from the shader (group 0).
#[derive(Debug, Default)]
pub struct PipelineCache {
    map: HashMap<PipelineKey, Arc<wgpu::ComputePipeline>>,
}

impl PipelineCache {
    /// The pipeline of `key`, compiled from `parts` (see
    /// [`PipelineKey::compose`]) on first use.
    pub fn get(
        &mut self,
        device: &wgpu::Device,
        caps: &GpuCaps,
        key: &PipelineKey,
        parts: &[&str],
    ) -> Arc<wgpu::ComputePipeline> {
        if let Some(p) = self.map.get(key) {
            return p.clone();
        }
        let label = key.to_string();
        let source = key.compose(caps.target, caps.subgroup_min_size, parts);
        let desc = wgpu::ShaderModuleDescriptor {
            label: Some(&label),
            source: wgpu::ShaderSource::Wgsl(source.into()),
        };
        // Without naga's forced loop bounding: the counter it adds to every
        // loop keeps the driver from unrolling the kernels' constant-count
        // loops, so that arrays indexed by their counters (the tiled
        // kernel's accumulators) live in local memory instead of registers
        // (gfx-rs/wgpu#7698). Bounds checks stay on. In a browser the call
        // is plain `create_shader_module`.
        let checks = wgpu::ShaderRuntimeChecks {
            force_loop_bounding: false,
            ..wgpu::ShaderRuntimeChecks::checked()
        };
        // SAFETY: `force_loop_bounding: false` requires that no shader loops
        // forever. Every loop in shaders/ counts toward a bound (`for` loops
        // over u32 counters below u32 limits that the recording code checks)
        // or, in top_k.wgsl's insertion, steps down to 0 and stops there.
        let module = unsafe { device.create_shader_module_trusted(desc, checks) };
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(&label),
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: wgpu::PipelineCompilationOptions::default(),
            cache: None,
        });
        let p = Arc::new(pipeline);
        self.map.insert(key.clone(), p.clone());
        p
    }

    /// Pipelines compiled so far.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether nothing was compiled yet.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_read_like_the_design() {
        let caps = GpuCaps::for_validation(false, true);
        let k = PipelineKey::new("matvec", 256, &caps).with_ty("q4_k");
        assert_eq!(k.to_string(), "matvec.q4_k.sg.wg256");
        let k = PipelineKey::new("rms_norm", 64, &caps.clone().without_subgroups())
            .with_const("MODE", ConstValue::U32(2));
        assert_eq!(k.to_string(), "rms_norm.wg64.mode2u");
    }

    /// The float literals of `src`: digit runs with a point or an exponent
    /// that do not continue an identifier.
    fn float_literals(src: &str) -> Vec<&str> {
        let b = src.as_bytes();
        let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
        let mut out = Vec::new();
        let mut i = 0;
        while i < b.len() {
            if b[i].is_ascii_digit() && (i == 0 || !ident(b[i - 1])) {
                let start = i;
                while i < b.len()
                    && (b[i].is_ascii_digit()
                        || b[i] == b'.'
                        || b[i] == b'e'
                        || b[i] == b'E'
                        || ((b[i] == b'-' || b[i] == b'+') && matches!(b[i - 1], b'e' | b'E')))
                {
                    i += 1;
                }
                let lit = &src[start..i];
                // (`0..7` in a comment is a range, not a number.)
                if lit.contains(['.', 'e', 'E']) && !lit.contains("..") {
                    out.push(lit);
                }
            }
            i += 1;
        }
        out
    }

    #[test]
    fn float_literals_fit_f32_as_written() {
        // Tint (Chromium) rejects a literal whose decimal lies past
        // f32::MAX, such as 3.4028235e38 (f32::MAX's shortest form), where
        // naga rounds it; so every shader writes -3.4028234663852886e38.
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/shaders");
        let mut checked = 0;
        for entry in std::fs::read_dir(dir).expect("shaders/") {
            let path = entry.expect("entry").path();
            if path.extension().is_none_or(|e| e != "wgsl") {
                continue;
            }
            let src = std::fs::read_to_string(&path).expect("shader text");
            for lit in float_literals(&src) {
                let v: f64 = lit.parse().unwrap_or_else(|_| panic!("{path:?}: {lit}"));
                assert!(v <= f64::from(f32::MAX), "{path:?}: {lit} is not an f32");
                checked += 1;
            }
        }
        assert!(checked > 0, "no float literal found in {dir}");
        assert_eq!(float_literals("let q4_k = 1.5e2 + x2.0"), vec!["1.5e2"]);
        assert_eq!(float_literals("a = -3.4028235e38;"), vec!["3.4028235e38"]);
    }

    #[test]
    fn enable_lines_follow_the_target() {
        let caps = GpuCaps::for_validation(true, true);
        let k = PipelineKey::new("x", 64, &caps).with_f16(true);
        let naga = k.prelude(ShaderTarget::Naga, 4);
        let dawn = k.prelude(ShaderTarget::Browser, 4);
        assert!(naga.contains("enable f16;") && !naga.contains("enable subgroups;"));
        assert!(dawn.contains("enable f16;") && dawn.contains("enable subgroups;"));
    }
}
