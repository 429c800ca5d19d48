// Rotary embedding, as ggml: theta_i = pos * theta_scale^i by repeated f32
// multiplication, divided by factors[i] when HAS_FACTORS, times freq_scale.
// One invocation per (row, head, pair of dims): pairs past n_rot / 2 copy
// the dims that do not rotate (`n_rot..head_dim`). MODE 0: pairs (2i, 2i + 1) (llama);
// 1: pairs (i, i + n_rot / 2) (neox).
// Two tensors at the same positions in one dispatch (q and k): the
// invocations past the first tensor's pairs rotate the second.
// x, out: `[rows, width]` f32 (out may be x); x2, out2: `[rows, width2]`
// (out2 may be x2; width2 0: no second tensor, any buffers);
// pos: `[rows]` u32; factors: `[n_rot / 2]` f32 (any buffer when unused).

struct Params {
    rows: u32,
    width: u32,
    head_dim: u32,
    n_rot: u32,
    theta_scale: f32,
    freq_scale: f32,
    has_factors: u32,
    width2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> pos: array<u32>;
@group(0) @binding(3) var<storage, read_write> factors: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<storage, read_write> x2: array<f32>;
@group(0) @binding(6) var<storage, read_write> out2: array<f32>;

// Where invocation `idx` of a `[rows, width]` tensor works: the two
// elements it rotates (or copies), and the rotation.
struct Site {
    a: u32,
    b: u32,
    c: f32,
    s: f32,
    rotate: bool,
}

fn site(idx: u32, width: u32) -> Site {
    let half_rot = p.n_rot / 2u;
    let half_dim = p.head_dim / 2u;
    let heads = width / p.head_dim;
    let i = idx % half_dim;
    let head = (idx / half_dim) % heads;
    let row = idx / (half_dim * heads);
    let base = row * width + head * p.head_dim;
    if i >= half_rot {
        let c = base + p.n_rot + 2u * (i - half_rot);
        return Site(c, c + 1u, 1.0, 0.0, false);
    }
    var theta = f32(pos[row]);
    for (var j = 0u; j < i; j = j + 1u) {
        theta = theta * p.theta_scale;
    }
    if p.has_factors != 0u {
        theta = theta / factors[i];
    }
    let t = p.freq_scale * theta;
    var a = base + 2u * i;
    var b = a + 1u;
    if MODE == 1u {
        a = base + i;
        b = a + half_rot;
    }
    return Site(a, b, cos(t), sin(t), true);
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let half_dim = p.head_dim / 2u;
    let n1 = p.rows * (p.width / p.head_dim) * half_dim;
    let n2 = p.rows * (p.width2 / p.head_dim) * half_dim;
    let idx = flat_index(wid, nwg, lid);
    if idx < n1 {
        let w = site(idx, p.width);
        let x0 = x[w.a];
        let x1 = x[w.b];
        if w.rotate {
            out[w.a] = x0 * w.c - x1 * w.s;
            out[w.b] = x0 * w.s + x1 * w.c;
        } else {
            out[w.a] = x0;
            out[w.b] = x1;
        }
    } else if idx < n1 + n2 {
        let w = site(idx - n1, p.width2);
        let x0 = x2[w.a];
        let x1 = x2[w.b];
        if w.rotate {
            out2[w.a] = x0 * w.c - x1 * w.s;
            out2[w.b] = x0 * w.s + x1 * w.c;
        } else {
            out2[w.a] = x0;
            out2[w.b] = x1;
        }
    }
}
