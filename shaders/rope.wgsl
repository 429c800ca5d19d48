// Rotary embedding, as ggml: theta_i = pos * theta_scale^i by repeated f32
// multiplication, divided by factors[i] when HAS_FACTORS, times freq_scale.
// One invocation per (row, head, pair). MODE 0: pairs (2i, 2i + 1) (llama);
// 1: pairs (i, i + n_rot / 2) (neox).
// x, out: `[rows, width]` f32 (out may be x); pos: `[rows]` u32;
// factors: `[n_rot / 2]` f32 (any buffer when unused).

struct Params {
    rows: u32,
    width: u32,
    head_dim: u32,
    n_rot: u32,
    theta_scale: f32,
    freq_scale: f32,
    has_factors: u32,
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> pos: array<u32>;
@group(0) @binding(3) var<storage, read_write> factors: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let half_rot = p.n_rot / 2u;
    let heads = p.width / p.head_dim;
    let idx = flat_index(wid, nwg, lid);
    if idx >= p.rows * heads * half_rot {
        return;
    }
    let i = idx % half_rot;
    let head = (idx / half_rot) % heads;
    let row = idx / (half_rot * heads);
    var theta = f32(pos[row]);
    for (var j = 0u; j < i; j = j + 1u) {
        theta = theta * p.theta_scale;
    }
    if p.has_factors != 0u {
        theta = theta / factors[i];
    }
    let t = p.freq_scale * theta;
    let c = cos(t);
    let s = sin(t);
    let base = row * p.width + head * p.head_dim;
    var a = base + 2u * i;
    var b = a + 1u;
    if MODE == 1u {
        a = base + i;
        b = a + half_rot;
    }
    let x0 = x[a];
    let x1 = x[b];
    out[a] = x0 * c - x1 * s;
    out[b] = x0 * s + x1 * c;
}
