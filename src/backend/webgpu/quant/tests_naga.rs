//! Every shader variant composed and validated by naga, with no GPU.

use super::super::caps::GpuCaps;
use super::sources::{variant, Kernel, KernelConfig, MvShape, PARAMS_WGSL};
use super::KernelParams;
use crate::quant::WEIGHT_TYPES;

fn validate(label: &str, source: &str, f16: bool, sg: bool) {
    let module = match naga::front::wgsl::parse_str(source) {
        Ok(m) => m,
        Err(e) => panic!("{label}: parse error\n{}", e.emit_to_string(source)),
    };
    let mut caps = naga::valid::Capabilities::SHADER_FLOAT16_IN_FLOAT32;
    if f16 {
        caps |= naga::valid::Capabilities::SHADER_FLOAT16;
    }
    if sg {
        caps |= naga::valid::Capabilities::SUBGROUP;
    }
    let mut v = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps);
    v.subgroup_stages(naga::valid::ShaderStages::COMPUTE);
    v.subgroup_operations(naga::valid::SubgroupOperationSet::all());
    if let Err(e) = v.validate(&module) {
        panic!("{label}: invalid\n{}", e.emit_to_string(source));
    }
}

#[test]
fn every_variant_composes_and_validates() {
    let mut labels = std::collections::BTreeSet::new();
    for f16 in [false, true] {
        for sg in [false, true] {
            let caps = GpuCaps::for_validation(f16, sg);
            let cfgs = [
                KernelConfig::default(),
                // The 16-byte loads (off by default).
                KernelConfig {
                    mv_w4: true,
                    ..KernelConfig::default()
                },
                // Two items of each of a team's rows in flight.
                KernelConfig {
                    mv_lane_items: 2,
                    ..KernelConfig::default()
                },
                // Teams of 64: subgroup reductions on the validation caps.
                KernelConfig {
                    mv_rows: 4,
                    mv_w4: true,
                    ..KernelConfig::default()
                },
                KernelConfig {
                    mv_rows: 4,
                    ..KernelConfig::default()
                },
                KernelConfig {
                    mv_wg: 64,
                    mv_rows: 1,
                    tile_m: 32,
                    tile_n: 32,
                    thread_m: 2,
                    ..KernelConfig::default()
                },
                // 4 x 4 outputs per invocation, f16 tiles.
                KernelConfig {
                    tile_m: 64,
                    tile_n: 64,
                    thread_m: 4,
                    thread_n: 4,
                    tile_f16: true,
                    ..KernelConfig::default()
                },
            ];
            for cfg in cfgs {
                let cfg = cfg.fit(&caps);
                for kernel in Kernel::ALL {
                    for ty in WEIGHT_TYPES {
                        let shapes = [
                            (1, false, 1, false),
                            (1, true, 1, false),
                            (4, true, 1, false),
                            (1, true, 4, false),
                            (4, false, 2, false),
                            (1, true, 1, true),
                            (4, true, 4, true),
                        ];
                        for (tokens, aligned, lane_rows, joined) in shapes {
                            let mv = MvShape {
                                tokens,
                                aligned,
                                lane_rows,
                                joined,
                            };
                            let Some(v) = variant(kernel, ty, &caps, &cfg, mv) else {
                                assert!(kernel == Kernel::MatVecI8, "{kernel:?} {ty}");
                                continue;
                            };
                            let label = v.key.to_string();
                            if !labels.insert(label.clone()) {
                                continue;
                            }
                            let src = v.key.compose(caps.target, caps.subgroup_min_size, &v.parts);
                            validate(&label, &src, v.key.f16, v.key.subgroups);
                        }
                    }
                }
            }
        }
    }
    // 15 formats (12 with int8) x kernels x {f16, sg} x configs, deduplicated.
    assert!(labels.len() > 200, "only {} variants", labels.len());
    for label in [
        "matvec_i8.q4_k.wg256.mv_rows8u.mv_tokens1u.mv_w4true",
        "matvec_i8.q6_k.sg.wg256.mv_rows4u.mv_tokens4u.mv_w4true",
        "matvec_i8.q6_k.wg256.mv_rows8u.mv_tokens1u.mv_w4false",
        "matvec_i8.q8_0.sg.wg256.mv_rows4u.mv_tokens1u.mv_w4false",
    ] {
        assert!(labels.contains(label), "no {label}");
    }
    assert!(labels.contains("matmul.q6_k.f16.wg256.tile_m64u.tile_n64u.thread_m4u.thread_n4u"));
    println!("{} variants validated", labels.len());
}

#[test]
fn params_struct_matches_the_wgsl() {
    let fields: Vec<&str> = PARAMS_WGSL
        .lines()
        .map(str::trim)
        .filter_map(|l| l.split_once(": u32,").map(|(name, _)| name))
        .collect();
    let expect = [
        "k",
        "n",
        "m",
        "nb",
        "row_words",
        "x_off",
        "x_stride",
        "y_off",
        "y_stride",
        "groups",
        "first_row",
        "count",
        "n1",
        "n2",
        "base1",
        "base2",
    ];
    assert_eq!(fields, expect);
    assert_eq!(std::mem::size_of::<KernelParams>(), 4 * expect.len());
}

#[test]
fn kernel_config_overrides_parse_and_refuse_bad_values() {
    let mut c = KernelConfig::default();
    assert_eq!(c.set("tile=128x64x8"), Some(()));
    assert_eq!(
        (c.tile_m, c.tile_n, c.thread_m, c.tiled_wg()),
        (128, 64, 8, 256)
    );
    assert_eq!(c.set("tile=64x128x4x8"), Some(()));
    assert_eq!(
        (c.tile_m, c.tile_n, c.thread_m, c.thread_n, c.tiled_wg()),
        (64, 128, 4, 8, 256)
    );
    assert_eq!(c.set("mv_rows=8"), Some(()));
    assert_eq!(c.set("mv_wg=128"), Some(()));
    assert_eq!(c.set("int8=0"), Some(()));
    assert_eq!(c.set("tile_f16=0"), Some(()));
    assert!(!c.tile_f16);
    assert_eq!(c.set("mv_w4=1"), Some(()));
    assert!(c.mv_w4);
    assert_eq!(c.set("mv_w4=0"), Some(()));
    assert!(!c.mv_w4);
    assert_eq!((c.mv_rows, c.mv_wg, c.int8), (8, 128, false));
    for bad in [
        "tile=64x64",
        "tile=60x64x4",
        "tile=64x66x4",
        "tile=64x64x4x6",
        "tile=64x64x4x4x4",
        "mv_rows=3",
        "mv_wg=0",
        "int8=2",
        "mv_w4=yes",
        "x=1",
        "mv_rows",
    ] {
        let before = c;
        assert_eq!(c.set(bad), None, "{bad}");
        assert_eq!(c, before, "{bad} changed the config");
    }
}
