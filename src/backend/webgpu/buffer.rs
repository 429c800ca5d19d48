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
    /// Where this buffer's bytes start in `raw`: 0, except for weights
    /// placed side by side in one wgpu buffer ([`Backend::alloc_weights`]),
    /// at multiples of the storage offset alignment.
    ///
    /// [`Backend::alloc_weights`]: crate::backend::Backend::alloc_weights
    pub offset: u64,
    /// Bytes asked for (the buffer may be up to 3 bytes larger).
    pub len: u64,
    /// What it was allocated for.
    pub kind: BufKind,
}

impl GpuBuffer {
    /// The whole buffer as a binding.
    pub fn binding(&self) -> wgpu::BindingResource<'_> {
        match self.bound_size() {
            None => self.raw.as_entire_binding(),
            size => wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: &self.raw,
                offset: self.offset,
                size,
            }),
        }
    }

    /// The size of a binding of the whole buffer: `None` (the rest of
    /// `raw`) for a buffer of its own, its words for one sharing `raw`.
    pub fn bound_size(&self) -> Option<std::num::NonZeroU64> {
        if self.offset == 0 && self.raw.size() <= self.len.div_ceil(4) * 4 {
            return None;
        }
        std::num::NonZeroU64::new(self.len.div_ceil(4).max(1) * 4)
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

/// The word-aligned copy that covers `range`: (first byte, bytes), and
/// where `range` starts within it.
pub fn copy_span(range: &std::ops::Range<u64>) -> (u64, u64, usize) {
    // Copies move whole words: widen to them and cut after.
    let start = range.start & !3;
    let end = range.end.div_ceil(4) * 4;
    (start, end - start, (range.start - start) as usize)
}

/// A mappable staging buffer of `size` bytes.
pub fn staging_buffer(device: &wgpu::Device, size: u64) -> wgpu::Buffer {
    device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("readback"),
        size,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    })
}

/// A staging buffer whose copy was submitted, being mapped.
#[derive(Debug)]
pub struct PendingMap {
    staging: wgpu::Buffer,
    state: Arc<Mutex<MapState>>,
    /// Bytes mapped (from byte 0).
    size: u64,
    /// The wanted bytes within them.
    at: usize,
    len: usize,
}

impl PendingMap {
    /// Starts mapping bytes `0..size` of `staging` (after the submission
    /// that fills it); the result is `len` bytes from `at`.
    pub fn start(staging: wgpu::Buffer, size: u64, at: usize, len: usize) -> Self {
        let state = Arc::new(Mutex::new(MapState::default()));
        let cb_state = state.clone();
        staging.map_async(wgpu::MapMode::Read, 0..size, move |r| {
            let mut s = match cb_state.lock() {
                Ok(s) => s,
                Err(p) => p.into_inner(),
            };
            s.done = Some(r.map_err(|e| e.to_string()));
            if let Some(w) = s.waker.take() {
                w.wake();
            }
        });
        Self {
            staging,
            state,
            size,
            at,
            len,
        }
    }

    /// Waits for the map (natively by polling the device), copies the
    /// bytes out and unmaps; returns them and the staging buffer, free
    /// for reuse.
    pub async fn finish(self, device: &wgpu::Device) -> Result<(Vec<u8>, wgpu::Buffer), GpuError> {
        #[cfg(not(target_arch = "wasm32"))]
        device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| GpuError::Device {
                during: "waiting for a readback".into(),
                detail: e.to_string(),
            })?;
        #[cfg(target_arch = "wasm32")]
        let _ = device;
        MapFuture(self.state)
            .await
            .map_err(|detail| GpuError::Device {
                during: "mapping a readback buffer".into(),
                detail,
            })?;
        let view = self
            .staging
            .get_mapped_range(0..self.size)
            .map_err(|e| GpuError::Device {
                during: "reading a mapped buffer".into(),
                detail: e.to_string(),
            })?;
        let out = view[self.at..self.at + self.len].to_vec();
        drop(view);
        self.staging.unmap();
        Ok((out, self.staging))
    }
}

/// Reads `range` of `src` back (`range` in bytes, within `src.len`).
///
/// One copy into a new staging buffer, one submission, one map.
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
    let (start, size, at) = copy_span(&range);
    let staging = staging_buffer(device, size);
    let mut enc = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
        label: Some("readback"),
    });
    enc.copy_buffer_to_buffer(&src.raw, src.offset + start, &staging, 0, size);
    queue.submit([enc.finish()]);
    let (out, _) = PendingMap::start(staging, size, at, len as usize)
        .finish(device)
        .await?;
    Ok(out)
}
