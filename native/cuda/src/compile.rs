//! Kernels from `.cu` source to a cubin for the device's architecture,
//! with NVRTC at run time, cached on disk.
//!
//! The cubin, not PTX, is what gets loaded: a newer NVRTC than the driver
//! writes PTX the driver may not read, while the cubin of the device's
//! exact architecture always loads. A cached cubin is keyed by the
//! source's hash, the architecture and NVRTC's version, so a changed
//! kernel, another card or another NVRTC compiles afresh.

use std::ffi::{c_char, CStr};
use std::path::{Path, PathBuf};

use cudarc::nvrtc::{result, sys};
use sha2::{Digest, Sha256};

use crate::CudaError;

/// A GPU architecture as NVRTC names it: `(9, 0)` is `sm_90`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arch {
    /// Compute capability, major.
    pub major: u32,
    /// Compute capability, minor.
    pub minor: u32,
}

impl Arch {
    /// `sm_90`.
    pub fn sm(&self) -> String {
        format!("sm_{}{}", self.major, self.minor)
    }
}

/// Whether NVRTC's library can be loaded here (cudarc panics on a call
/// into a library it cannot find, so every entry point asks first).
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to open the library.
    unsafe { sys::is_culib_present() }
}

/// NVRTC's version, `(major, minor)`.
pub fn nvrtc_version() -> Result<(i32, i32), CudaError> {
    if !nvrtc_present() {
        return Err(CudaError::Missing("NVRTC (libnvrtc)"));
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two valid out-pointers.
    unsafe { sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| CudaError::Nvrtc(format!("nvrtcVersion: {e:?}")))?;
    Ok((major, minor))
}

/// Compiles `source` (named `name` in messages) to a cubin for `arch`,
/// reading and writing `cache` (a directory) when given.
pub fn compile(
    name: &str,
    source: &str,
    arch: Arch,
    cache: Option<&Path>,
) -> Result<Vec<u8>, CudaError> {
    let (major, minor) = nvrtc_version()?;
    let key = cache_key(source, arch, (major, minor));
    let path = cache.map(|dir| dir.join(format!("{name}-{key}.cubin")));
    if let Some(bytes) = path.as_deref().and_then(|p| std::fs::read(p).ok()) {
        return Ok(bytes);
    }
    let (cubin, _) = nvrtc_cubin(name, source, arch, false)?;
    if let Some(p) = &path {
        // A cache that cannot be written costs a compile next time, not an error.
        let _ = write_atomically(p, &cubin);
    }
    Ok(cubin)
}

/// Compiles `source` for `arch` with ptxas reporting on every kernel
/// (`--ptxas-options=-v`: registers, stack, spill stores and loads); the
/// cubin and the log. No cache: for the build's checks.
pub fn compile_verbose(
    name: &str,
    source: &str,
    arch: Arch,
) -> Result<(Vec<u8>, String), CudaError> {
    nvrtc_cubin(name, source, arch, true)
}

/// The kernels of a ptxas `-v` log that spill: (kernel, spill store
/// bytes, spill load bytes) for each with either above zero.
pub fn spills(log: &str) -> Vec<(String, u64, u64)> {
    let mut out = Vec::new();
    let mut kernel = String::new();
    for line in log.lines() {
        if let Some(rest) = line.split("Function properties for ").nth(1) {
            kernel = rest.trim().to_string();
        } else if line.contains("spill stores") {
            let num = |what: &str| {
                line.split(',')
                    .find(|p| p.contains(what))
                    .and_then(|p| p.split_whitespace().next())
                    .and_then(|n| n.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            let (st, ld) = (num("spill stores"), num("spill loads"));
            if st > 0 || ld > 0 {
                out.push((kernel.clone(), st, ld));
            }
        }
    }
    out
}

/// The cache key of `source` for `arch` under NVRTC `version`.
pub fn cache_key(source: &str, arch: Arch, version: (i32, i32)) -> String {
    let digest = Sha256::digest(source.as_bytes());
    let hex: String = digest[..12].iter().map(|b| format!("{b:02x}")).collect();
    format!("{hex}-{}-nvrtc{}.{}", arch.sm(), version.0, version.1)
}

/// Writes `bytes` to `path` through a temporary file, so that a reader
/// never sees half a cubin.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut tmp = PathBuf::from(path);
    tmp.set_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

/// One NVRTC compile of `source` to an `arch` cubin.
fn nvrtc_cubin(
    name: &str,
    source: &str,
    arch: Arch,
    verbose: bool,
) -> Result<(Vec<u8>, String), CudaError> {
    let fail =
        |what: &str, e: result::NvrtcError| CudaError::Nvrtc(format!("{name}: {what}: {e:?}"));
    let src = std::ffi::CString::new(source)
        .map_err(|_| CudaError::Nvrtc(format!("{name}: the source holds a NUL byte")))?;
    let cname = std::ffi::CString::new(format!("{name}.cu"))
        .map_err(|_| CudaError::Nvrtc(format!("{name}: the name holds a NUL byte")))?;
    let prog = result::create_program(&src, Some(&cname)).map_err(|e| fail("create", e))?;
    let mut opts = vec![
        format!("--gpu-architecture={}", arch.sm()),
        "--std=c++17".into(),
    ];
    if verbose {
        opts.push("--ptxas-options=-v".into());
    }
    // SAFETY: `prog` is a live program, destroyed once below.
    let out = unsafe {
        let log = || {
            result::get_program_log(prog)
                .map(|l| CStr::from_ptr(l.as_ptr()).to_string_lossy().into_owned())
                .unwrap_or_default()
        };
        match result::compile_program(prog, &opts) {
            Ok(()) => cubin_of(prog)
                .map(|c| (c, if verbose { log() } else { String::new() }))
                .map_err(|e| fail("cubin", e)),
            Err(e) => {
                let log = log();
                Err(CudaError::Nvrtc(format!(
                    "{name}.cu does not compile for {} ({e:?}):\n{log}",
                    arch.sm()
                )))
            }
        }
    };
    // SAFETY: destroyed once, after its last use.
    unsafe { result::destroy_program(prog) }.map_err(|e| fail("destroy", e))?;
    out
}

/// The cubin of a compiled program.
///
/// # Safety
/// `prog` is a live program that compiled.
unsafe fn cubin_of(prog: sys::nvrtcProgram) -> Result<Vec<u8>, result::NvrtcError> {
    let mut size = 0usize;
    sys::nvrtcGetCUBINSize(prog, &mut size).result()?;
    let mut buf = vec![0u8; size];
    sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut c_char).result()?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_follows_source_arch_and_version() {
        let a = Arch { major: 9, minor: 0 };
        let k = cache_key("x", a, (13, 0));
        assert!(k.ends_with("-sm_90-nvrtc13.0"), "{k}");
        assert_ne!(k, cache_key("y", a, (13, 0)));
        assert_ne!(k, cache_key("x", Arch { major: 8, minor: 9 }, (13, 0)));
        assert_ne!(k, cache_key("x", a, (13, 5)));
    }
}
