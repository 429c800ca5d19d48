//! The kernel modules: each `shaders/cuda/*.cu` file composed after the
//! headers it uses (`common.cuh`, `quant.cuh`), as one NVRTC program.

/// One compiled unit: its name (the `.cu` file's stem) and source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Module {
    /// The `.cu` file's stem (`matmul`).
    pub name: &'static str,
    /// The composed source.
    pub source: &'static str,
}

macro_rules! shader {
    ($file:literal) => {
        include_str!(concat!("../../../shaders/cuda/", $file))
    };
}

/// Row and element ops, argmax / top-k and the MoE router.
pub const ROWOPS: Module = Module {
    name: "rowops",
    source: concat!(shader!("common.cuh"), shader!("rowops.cu")),
};

/// Quantized matrix products, the activation quantizer, embedding lookup
/// and the MoE expert products.
pub const MATMUL: Module = Module {
    name: "matmul",
    source: concat!(
        shader!("common.cuh"),
        shader!("quant.cuh"),
        shader!("matmul.cu")
    ),
};

/// Paged attention.
pub const ATTENTION: Module = Module {
    name: "attention",
    source: concat!(shader!("common.cuh"), shader!("attention.cu")),
};

/// Every module the backend loads.
pub const MODULES: [Module; 3] = [ROWOPS, MATMUL, ATTENTION];
