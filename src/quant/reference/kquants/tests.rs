//! Unit tests of the k-quant reference (random data in `tests/quant_kquants.rs`).

use super::*;

#[test]
fn nearest_int_rounds_half_to_even() {
    let cases = [
        (0.5, 0),
        (1.5, 2),
        (2.5, 2),
        (-0.5, 0),
        (-1.5, -2),
        (3.49, 3),
        (-3.51, -4),
        (4194303.0, 4194303),
    ];
    for (x, want) in cases {
        assert_eq!(nearest_int(x), want, "nearest_int({x})");
    }
}
