//! Quantizing a whole model: llama-quantize's recipe, tensor order and
//! metadata, written through the streaming GGUF writer.
//!
//! The quantizers are those of [`crate::quant::reference`], which give the
//! bytes llama.cpp's own give (no importance matrix): a model quantized here
//! and one quantized by `llama-quantize` from the same source are the same
//! file.

use std::io::Write;

use rayon::prelude::*;

use crate::gguf::{
    read_tensor_data, ByteSource, GgufModel, GgufWriter, Metadata, TensorInfo, TensorSpec, Value,
};
use crate::model::ModelConfig;
use crate::quant::recipe::{self, FileType, ModelShape, TensorRef};
use crate::quant::{reference, GgmlType, QuantError};

/// ggml's `GGML_QNT_VERSION`, written to `general.quantization_version`.
pub const QUANTIZATION_VERSION: u32 = 2;

/// What a quantization will write: the output metadata, and each tensor in
/// output order with the type it gets.
#[derive(Debug, Clone)]
pub struct QuantPlan {
    /// The output file's metadata.
    pub metadata: Metadata,
    /// `(index into the source model's tensors, new type)`, in output order.
    pub tensors: Vec<(usize, GgmlType)>,
}

impl QuantPlan {
    /// Plans quantizing `model` to `ftype` (`pure`: every weight gets the
    /// file type's tensor type, as `llama-quantize --pure`).
    pub fn new(model: &GgufModel, ftype: FileType, pure: bool) -> crate::Result<Self> {
        let cfg = ModelConfig::from_metadata(model.metadata())?;
        let shape = ModelShape {
            n_layer: cfg.n_layer,
            n_expert: cfg.n_expert,
            n_gqa: cfg.n_head / cfg.n_head_kv.max(1),
        };
        let names: Vec<&str> = model.tensors.iter().map(|t| t.name.as_str()).collect();
        let order = recipe::quantize_order(&names);
        let refs: Vec<TensorRef<'_>> = order
            .iter()
            .map(|&i| {
                let t = &model.tensors[i];
                TensorRef {
                    name: &t.name,
                    shape: &t.shape,
                    ty: t.ty,
                }
            })
            .collect();
        let types = recipe::plan(ftype, pure, shape, &refs);
        let mut tensors = Vec::with_capacity(order.len());
        for (&i, to) in order.iter().zip(types) {
            let src = &model.tensors[i];
            if src.ty != to && !reference::SUPPORTED.contains(&src.ty) {
                return Err(QuantError::Unsupported {
                    op: "requantize",
                    ty: src.ty,
                    supported: "convert the model to F16 or F32 first".into(),
                }
                .into());
            }
            tensors.push((i, to));
        }
        Ok(QuantPlan {
            metadata: output_metadata(model.metadata(), ftype),
            tensors,
        })
    }

    /// The writer's tensor specs, in output order.
    pub fn specs(&self, model: &GgufModel) -> Vec<TensorSpec> {
        self.tensors
            .iter()
            .map(|&(i, ty)| {
                let t = &model.tensors[i];
                TensorSpec {
                    name: t.name.clone(),
                    shape: t.shape.clone(),
                    ty,
                }
            })
            .collect()
    }
}

/// The source metadata with llama-quantize's changes: the quantization
/// version and file type set (moved to the end, as `gguf_set_val` does) and
/// the split keys dropped.
fn output_metadata(source: &Metadata, ftype: FileType) -> Metadata {
    let mut metadata = source.clone();
    for (key, value) in [
        ("general.quantization_version", QUANTIZATION_VERSION),
        ("general.file_type", ftype.id()),
    ] {
        metadata.remove(key);
        metadata.set(key, Value::U32(value));
    }
    for key in ["split.no", "split.count", "split.tensors.count"] {
        metadata.remove(key);
    }
    metadata
}

/// Writes `model` quantized as `plan` says to `out`, reading each source
/// tensor once; `progress(bytes_done, bytes_total, tensor_name)` after each.
pub async fn quantize_model<S: ByteSource, W: Write>(
    model: &GgufModel,
    sources: &[S],
    plan: &QuantPlan,
    out: W,
    progress: &mut dyn FnMut(u64, u64, &str),
) -> crate::Result<W> {
    let mut writer = GgufWriter::new(out, &plan.metadata, &plan.specs(model))?;
    let total: u64 = plan
        .tensors
        .iter()
        .map(|&(i, _)| model.tensors[i].size)
        .sum();
    let mut done = 0;
    for &(i, to) in &plan.tensors {
        let t = &model.tensors[i];
        let src = sources.get(t.split).ok_or_else(|| QuantError::Shape {
            ty: t.ty,
            detail: format!(
                "tensor {} lives in split {} which was not given",
                t.name, t.split
            ),
        })?;
        let data = read_tensor_data(src, t).await?;
        if t.ty == to {
            writer.write_data(&data)?;
        } else {
            writer.write_data(&convert_tensor(t, &data, to)?)?;
        }
        done += t.size;
        progress(done, total, &t.name);
    }
    Ok(writer.finish()?)
}

/// Re-encodes one tensor's rows (in parallel where threads exist):
/// dequantize each row, quantize it to `to`.
pub fn convert_tensor(t: &TensorInfo, data: &[u8], to: GgmlType) -> Result<Vec<u8>, QuantError> {
    let shape_err = |detail: String| QuantError::Shape { ty: to, detail };
    let row_len = usize::try_from(t.shape[0]).map_err(|e| shape_err(e.to_string()))?;
    let in_row = t.ty.bytes_for(t.shape[0]).ok_or_else(|| {
        shape_err(format!(
            "{}: rows of {row_len} are not whole {} blocks",
            t.name, t.ty
        ))
    })?;
    if to.bytes_for(t.shape[0]).is_none() {
        return Err(shape_err(format!(
            "{}: rows of {row_len} do not split into {to} blocks",
            t.name
        )));
    }
    let rows: Vec<Vec<u8>> = data
        .par_chunks(in_row as usize)
        .map(|row| {
            let mut f32s = vec![0.0f32; row_len];
            reference::dequantize(t.ty, row, &mut f32s)?;
            let mut out = Vec::new();
            reference::quantize(to, &f32s, &mut out)?;
            Ok(out)
        })
        .collect::<Result<_, QuantError>>()?;
    Ok(rows.concat())
}
