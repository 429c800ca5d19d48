//! Every kernel variant parsed and validated by naga, with no device.

use super::caps::{GpuCaps, ShaderTarget};
use super::shader::PipelineKey;

/// Parses and validates `source`, naming `label` on failure.
fn validate(label: &str, source: &str) -> Result<(), String> {
    let module = naga::front::wgsl::parse_str(source)
        .map_err(|e| format!("{label}: {}", e.emit_to_string(source)))?;
    let caps = naga::valid::Capabilities::all();
    let mut v = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps);
    v.subgroup_stages(naga::valid::ShaderStages::COMPUTE);
    v.subgroup_operations(naga::valid::SubgroupOperationSet::all());
    v.validate(&module)
        .map_err(|e| format!("{label}: {}", e.emit_to_string(source)))?;
    Ok(())
}

#[test]
fn every_kernel_variant_validates_with_and_without_f16_and_subgroups() {
    let mut failures = Vec::new();
    let mut n = 0;
    for (f16, sg) in [(false, false), (true, false), (false, true), (true, true)] {
        let caps = GpuCaps::for_validation(f16, sg);
        for (kernel, src, consts) in super::kernel_sources() {
            for wg in [64, 256] {
                let mut key = PipelineKey::new(kernel, wg, &caps).with_f16(f16);
                key.consts = consts.clone();
                let text = key.compose(ShaderTarget::Naga, caps.subgroup_min_size, &[src]);
                n += 1;
                if let Err(e) = validate(&key.to_string(), &text) {
                    failures.push(e);
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {n} variants failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
