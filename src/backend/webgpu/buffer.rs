//! [`GpuBuffer`] and the asynchronous readback of a buffer range.
//!
//! Readback copies the range into a mappable staging buffer, submits, and
//! maps it: natively the device is polled until the map completes; in the
//! browser the returned future resolves when the browser calls back.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use super::GpuError;
use crate::backend::BufKind;

/// A device buffer. Sizes are rounded up to whole u32 words.
#[derive(Debug, Clone)]
pub struct GpuBuffer {
    /// The wgpu buffer (a cheap handle: clones refer to the same memory).
    pub raw: wgpu::Buffer,
    /// Bytes asked for (the buffer may be up to 3 bytes larger).
    pub len: u64,
    /// What it was allocated for.
    pub kind: BufKind,
}

impl GpuBuffer {
    /// The whole buffer as a binding.
    pub fn binding(&self) -> wgpu::BindingResource<'_> {
        self.raw.as_entire_binding()
    }
}

/// The usages a buffer of `kind` needs: storage for kernels, copies in for
/// uploads and out for readback.
pub fn usages(kind: BufKind) -> wgpu::BufferUsages {
    use wgpu::BufferUsages as U;
    match kind {
        BufKind::Weights => U::STORAGE | U::COPY_DST,
        BufKind::Activations | BufKind::KvCache | BufKind::Readback => {
            U::STORAGE | U::COPY_DST | U::COPY_SRC
        }
    }
}

/// The state shared by a map request and its future.
#[derive(Debug, Default)]
struct MapState {
    done: Option<Result<(), String>>,
    waker: Option<Waker>,
}

/// Resolves when a `map_async` call back has fired.
#[derive(Debug)]
struct MapFuture(Arc<Mutex<MapState>>);

impl Future for MapFuture {
    type Output = Result<(), String>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut s = match self.0.lock() {
            Ok(s) => s,
            Err(p) => p.into_inner(),
        };
        match s.done.take() {
            Some(r) => Poll::Ready(r),
            None => {
                s.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// Reads `range` of `src` back (`range` in bytes, within `src.len`).
///
/// One copy into a staging buffer, one submission, one map.
pub async fn read_back(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    src: &GpuBuffer,
    range: std::ops::Range<u64>,
) -> Result<Vec<u8>, GpuError> {
    let len = range.end - range.start;
    if len == 0 {
        return Ok(Vec::new());
    }
    // Copies move whole words: widen to them and cut after.
    let start = range.start & !3;
    let end = range.end.div_ceil(4) * 4;
    let size = end - start;
    let staging = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("readback"),
        size,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut enc = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
        label: Some("readback"),
    });
    enc.copy_buffer_to_buffer(&src.raw, start, &staging, 0, size);
    queue.submit([enc.finish()]);
    let state = Arc::new(Mutex::new(MapState::default()));
    let cb_state = state.clone();
    staging.map_async(wgpu::MapMode::Read, .., move |r| {
        let mut s = match cb_state.lock() {
            Ok(s) => s,
            Err(p) => p.into_inner(),
        };
        s.done = Some(r.map_err(|e| e.to_string()));
        if let Some(w) = s.waker.take() {
            w.wake();
        }
    });
    #[cfg(not(target_arch = "wasm32"))]
    device
        .poll(wgpu::PollType::wait_indefinitely())
        .map_err(|e| GpuError::Device {
            during: "waiting for a readback".into(),
            detail: e.to_string(),
        })?;
    MapFuture(state).await.map_err(|detail| GpuError::Device {
        during: "mapping a readback buffer".into(),
        detail,
    })?;
    let view = staging.get_mapped_range(..).map_err(|e| GpuError::Device {
        during: "reading a mapped buffer".into(),
        detail: e.to_string(),
    })?;
    let at = (range.start - start) as usize;
    let out = view[at..at + len as usize].to_vec();
    drop(view);
    staging.unmap();
    Ok(out)
}
