// Row lookup from an F32 or F16 (F16_TABLE: two values per u32) table.
// table: `[table_rows, width]`; ids: `[rows]` u32; out: `[rows, width]` f32.
// An id outside the table gives a row of NaN (the host checks ids first).

struct Params {
    rows: u32,
    width: u32,
    table_rows: u32,
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> table: array<u32>;
@group(0) @binding(2) var<storage, read_write> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if i >= p.rows * p.width {
        return;
    }
    let id = ids[i / p.width];
    if id >= p.table_rows {
        // A NaN from a runtime value: Tint rejects a constant NaN.
        out[i] = bitcast<f32>(0x7fc00000u | (id & 0u));
        return;
    }
    let at = id * p.width + i % p.width;
    if F16_TABLE {
        out[i] = packed_f16_at(table[at / 2u], at);
    } else {
        out[i] = bitcast<f32>(table[at]);
    }
}
