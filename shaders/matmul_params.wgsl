// Uniforms of the quantized weight kernels (matmul_*.wgsl); mirrored by
// `KernelParams` in src/backend/webgpu/quant/kernels.rs (checked by a test).
// Offsets and strides count 4-byte elements of their buffers.
struct Params {
    k: u32,          // dot length (weight columns)
    n: u32,          // weight rows in this part
    m: u32,          // tokens (rows of x and y)
    nb: u32,         // blocks per weight row
    row_words: u32,  // u32 words between weight rows
    x_off: u32,      // first element of x (multiple of 4 for f32 x)
    x_stride: u32,   // elements between tokens of x (multiple of 4 for f32 x)
    y_off: u32,      // first element of y
    y_stride: u32,   // elements between tokens of y
    groups: u32,     // row groups of the 2-D grid (matvec, matmul); see group_index
    first_row: u32,  // the part's first row in the whole weight
    count: u32,      // items for the one-thread-per-item kernels
    // A matvec over joined weights (matmul_vec_i8_rows.wgsl): rows 0..n1 are
    // the first weight's, n1..n2 the second's, n2..n the third's; the second
    // and third start at words base1, base2 of the binding.
    n1: u32,
    n2: u32,
    base1: u32,
    base2: u32,
}
