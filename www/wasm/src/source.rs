//! [`JsSource`]: a [`ByteSource`] whose reads are JavaScript promises.
//!
//! The package's worker hands the loader one reader object per GGUF file:
//! `{ size: number, read(offset: number, length: number): Promise<Uint8Array> }`.
//! Behind it sits a `Blob`/`File` (`blob.slice().arrayBuffer()`), an OPFS
//! file, or HTTP `Range` requests; the core only sees async exact reads.

use hearth::gguf::{ByteSource, GgufError};
use js_sys::{Promise, Uint8Array};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;

#[wasm_bindgen]
extern "C" {
    /// The JavaScript reader object (see the module docs).
    pub type JsReader;

    /// Total bytes of the file.
    #[wasm_bindgen(method, getter)]
    fn size(this: &JsReader) -> f64;

    /// Starts reading `length` bytes at `offset`.
    #[wasm_bindgen(method, catch)]
    fn read(this: &JsReader, offset: f64, length: f64) -> Result<Promise, JsValue>;
}

/// A GGUF file read through a [`JsReader`].
pub struct JsSource {
    reader: JsReader,
    len: u64,
}

impl JsSource {
    /// Wraps `reader`; its `size` must be a whole number of bytes.
    pub fn new(reader: JsReader) -> Result<Self, GgufError> {
        let size = reader.size();
        if !(size.is_finite() && size >= 0.0 && size.fract() == 0.0) {
            return Err(GgufError::Source(format!(
                "the reader's size {size} is not a byte count; pass a Blob, File or URL"
            )));
        }
        Ok(JsSource {
            reader,
            len: size as u64,
        })
    }
}

/// The text of a JavaScript error value.
pub fn js_error_text(err: &JsValue) -> String {
    if let Some(e) = err.dyn_ref::<js_sys::Error>() {
        return String::from(e.message());
    }
    err.as_string().unwrap_or_else(|| format!("{err:?}"))
}

impl ByteSource for JsSource {
    fn len(&self) -> u64 {
        self.len
    }

    async fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), GgufError> {
        let end = offset.checked_add(buf.len() as u64);
        if end.is_none_or(|end| end > self.len) {
            return Err(GgufError::OutOfRange {
                offset,
                len: buf.len() as u64,
                source_len: self.len,
            });
        }
        let failed = |e: JsValue| {
            GgufError::Source(format!(
                "read of {} bytes at {offset} failed: {}",
                buf.len(),
                js_error_text(&e)
            ))
        };
        let promise = self
            .reader
            .read(offset as f64, buf.len() as f64)
            .map_err(failed)?;
        let value = JsFuture::from(promise).await.map_err(failed)?;
        let bytes = Uint8Array::new(&value);
        if bytes.length() as usize != buf.len() {
            return Err(GgufError::Source(format!(
                "read of {} bytes at {offset} returned {} bytes; the file changed or the server ignores Range",
                buf.len(),
                bytes.length()
            )));
        }
        bytes.copy_to(buf);
        Ok(())
    }
}
