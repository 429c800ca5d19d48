//! The weight layouts the tiles read: rows read back, the banded layout
//! byte by byte, widened weights.

use super::*;

#[test]
fn rearranged_rows_read_back_as_the_plain_rows() {
    let mut rng = Rng::new(77);
    let banded = [
        (1, 0, GgmlType::Q4_0),
        (1, 0, GgmlType::Q8_0),
        (1, 0, GgmlType::Q5_0),
        (1, 0, GgmlType::IQ4_NL),
        (2, 0, GgmlType::Q4_1),
        (2, 0, GgmlType::Q4_K),
        (1, 208, GgmlType::Q6_K),
        (2, 0, GgmlType::IQ4_XS),
    ];
    let layouts = [BAND_ROWS, 4]
        .into_iter()
        .flat_map(|rows| banded.map(|(halves, at, ty)| (Layout::Bands { rows, halves, at }, ty)));
    for (layout, ty) in layouts {
        for rows in [1, 3, 4, 5, 8, 11, 16, 17, 35] {
            let (_, wq) = quantized_rows(&mut rng, ty, rows, 2 * ty.block_elems());
            let rb = wq.len() / rows;
            let mut w = wq.clone();
            layout.apply(&mut w, rb, ty.block_bytes());
            let g = layout.group_rows();
            let whole = rows / g * g;
            // The tail past the last whole group is untouched; a group
            // keeps its bytes, rearranged.
            let ctx = format!("{layout:?} {ty} {rows}");
            assert_eq!(w[whole * rb..], wq[whole * rb..], "{ctx}");
            for g0 in (0..whole).step_by(g) {
                let (a, b) = (&w[g0 * rb..(g0 + g) * rb], &wq[g0 * rb..(g0 + g) * rb]);
                assert_ne!(a, b, "{ctx}: group {g0} unchanged");
                let (mut a, mut b) = (a.to_vec(), b.to_vec());
                a.sort_unstable();
                b.sort_unstable();
                assert_eq!(a, b, "{ctx}: group {g0} lost bytes");
            }
            for r in 0..rows {
                let got = layout.plain_row(&w, rows, rb, ty.block_bytes(), r);
                assert_eq!(&*got, &wq[r * rb..(r + 1) * rb], "{ctx} row {r}");
            }
            assert!(layout
                .plain_row(&w, rows, rb, ty.block_bytes(), rows)
                .is_empty());
        }
    }
}

#[test]
fn banded_layout_puts_sixteen_rows_scales_and_words_side_by_side() {
    // The layout the AVX-512 one-token kernels read, written out by hand
    // for Q4_1: per block step, 16 `d`, 16 `m`, then word k of each row.
    let ty = GgmlType::Q4_1;
    let (bb, rows, nb) = (ty.block_bytes(), 16, 2);
    let wq: Vec<u8> = (0..rows * nb * bb)
        .map(|i| (i * 7 + i / 251) as u8)
        .collect();
    let rb = nb * bb;
    let mut w = wq.clone();
    Layout::Bands {
        rows: BAND_ROWS,
        halves: 2,
        at: 0,
    }
    .apply(&mut w, rb, bb);
    for r in 0..rows {
        for b in 0..nb {
            let plain = &wq[r * rb + b * bb..][..bb];
            let step = &w[b * rows * bb..][..rows * bb];
            assert_eq!(
                step[2 * r..2 * r + 2],
                plain[0..2],
                "d of row {r} block {b}"
            );
            assert_eq!(step[32 + 2 * r..34 + 2 * r], plain[2..4], "m of row {r}");
            for k in 0..4 {
                let at = 64 + 64 * k + 4 * r;
                assert_eq!(
                    step[at..at + 4],
                    plain[4 + 4 * k..8 + 4 * k],
                    "word {k} row {r}"
                );
            }
        }
    }
}

#[test]
fn widened_weights_hold_the_same_values() {
    // Where an ISA stores a type re-encoded (wasm: Q5_0 as Q8_0), the
    // encoding round-trips and its dots and rows are bit-identical.
    let mut checked = Vec::new();
    for isa in fast_isas() {
        let table = KernelTable::with_isa(isa).expect("available ISA");
        for (i, &ty) in WEIGHT_TYPES.iter().enumerate() {
            let k = table.weight(ty).expect("kernel");
            let Some(widen) = k.widen else { continue };
            let kw = table.weight(widen.to).expect("kernel of the stored type");
            assert_eq!(kw.vec_dot_type, k.vec_dot_type, "{isa} {ty}");
            let mut rng = Rng::new(13_000 + i as u64);
            let n = 8 * ty.block_elems();
            let (_, wq) = quantized_rows(&mut rng, ty, 1, n);
            let (_, aq) = quantized_rows(&mut rng, k.vec_dot_type, 1, n);
            let mut wide = vec![0u8; n / widen.to.block_elems() * widen.to.block_bytes()];
            (widen.encode)(&wq, &mut wide);
            let mut back = vec![0u8; wq.len()];
            (widen.decode)(&wide, &mut back);
            assert_eq!(back, wq, "{isa} {ty}: the encoding does not round-trip");
            let (a, b) = ((k.vec_dot)(&wq, &aq), (kw.vec_dot)(&wide, &aq));
            assert_eq!(a.to_bits(), b.to_bits(), "{isa} {ty}: {a} vs stored {b}");
            let (mut da, mut db) = (vec![0.0f32; n], vec![0.0f32; n]);
            (k.dequantize_row)(&wq, &mut da);
            (kw.dequantize_row)(&wide, &mut db);
            assert_eq!(da, db, "{isa} {ty}: values differ");
            checked.push(format!("{isa} {ty} as {}", widen.to));
        }
    }
    eprintln!("widened: {checked:?}");
}
