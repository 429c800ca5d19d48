use super::*;
use crate::gguf::{GgufFile, GgufWriter, MemSource};
use crate::model::tokenizer::Tokenizer;
use crate::model::ModelConfig;

fn tiny(arch: SynthArch) -> SynthShape {
    let mut s = SynthShape::custom(arch, [256, 2, 4, 2, 64, 512, 512]);
    if arch.is_moe() {
        s.experts = 4;
        s.experts_used = 2;
        s.expert_ffn = 256;
    }
    s
}

fn write(model: &SynthModel) -> Vec<u8> {
    let mut w = GgufWriter::new(Vec::new(), &model.metadata, &model.specs()).expect("header");
    let mut buf = Vec::new();
    for (i, t) in model.tensors.iter().enumerate() {
        buf.clear();
        model.encode_rows(i, 0..t.n_rows(), &mut buf).expect("rows");
        assert_eq!(buf.len() as u64, t.data_bytes(), "{}", t.name);
        w.write_data(&buf).expect("data");
    }
    w.finish().expect("finish")
}

fn types_of(model: &SynthModel) -> Vec<(String, GgmlType)> {
    model
        .tensors
        .iter()
        .map(|t| (t.name.clone(), t.ty))
        .collect()
}

#[test]
fn q4_k_m_follows_llama_quantize_recipe() {
    let model = SynthModel::new(
        tiny(SynthArch::Llama),
        "t",
        &SynthOptions::new(FileType::Q4_K_M, 1),
    )
    .expect("plan");
    use GgmlType::*;
    let expected = [
        ("output_norm.weight", F32),
        ("token_embd.weight", Q6_K), // tied: takes the output's type
        ("blk.0.attn_k.weight", Q4_K),
        ("blk.0.attn_norm.weight", F32),
        ("blk.0.attn_output.weight", Q4_K),
        ("blk.0.attn_q.weight", Q4_K),
        ("blk.0.attn_v.weight", Q4_K),
        ("blk.0.ffn_down.weight", Q4_K),
        ("blk.0.ffn_gate.weight", Q4_K),
        ("blk.0.ffn_norm.weight", F32),
        ("blk.0.ffn_up.weight", Q4_K),
        ("blk.1.attn_k.weight", Q4_K),
        ("blk.1.attn_norm.weight", F32),
        ("blk.1.attn_output.weight", Q4_K),
        ("blk.1.attn_q.weight", Q4_K),
        ("blk.1.attn_v.weight", Q6_K),
        ("blk.1.ffn_down.weight", Q6_K),
        ("blk.1.ffn_gate.weight", Q4_K),
        ("blk.1.ffn_norm.weight", F32),
        ("blk.1.ffn_up.weight", Q4_K),
    ];
    let got = types_of(&model);
    let want: Vec<(String, GgmlType)> = expected.iter().map(|(n, t)| (n.to_string(), *t)).collect();
    assert_eq!(got, want);
    assert_eq!(model.metadata.get_u32("general.file_type"), Some(15));
}

#[test]
fn every_arch_round_trips_through_the_reader() {
    for arch in SynthArch::names()
        .into_iter()
        .filter_map(SynthArch::from_name)
    {
        let shape = tiny(arch);
        let model = SynthModel::new(
            shape.clone(),
            arch.name(),
            &SynthOptions::new(FileType::Q8_0, 3),
        )
        .expect("plan");
        let bytes = write(&model);
        let file = pollster::block_on(GgufFile::read(&MemSource::new(bytes))).expect("parse");
        assert_eq!(file.tensors.len(), model.tensors.len(), "{}", arch.name());
        for (info, t) in file.tensors.iter().zip(&model.tensors) {
            assert_eq!(
                (&info.name, &info.shape, info.ty),
                (&t.name, &t.shape, t.ty)
            );
        }
        let cfg = ModelConfig::from_metadata_supported(&file.metadata).expect("config");
        assert_eq!(
            (
                cfg.n_embd,
                cfg.n_layer,
                cfg.n_head,
                cfg.n_head_kv,
                cfg.head_dim_k
            ),
            (256, 2, 4, 2, 64),
            "{}",
            arch.name()
        );
        assert_eq!((cfg.n_vocab, cfg.n_ff), (512, 512));
        assert_eq!(
            cfg.name.as_deref(),
            Some(format!("synthetic {}", arch.name()).as_str())
        );
        if arch.is_moe() {
            assert_eq!(
                (cfg.n_expert, cfg.n_expert_used, cfg.n_ff_expert),
                (4, 2, Some(256))
            );
            assert!(file.tensor("blk.1.ffn_down_exps.weight").is_some());
        }
        assert_eq!(
            arch.has_qk_norm(),
            file.tensor("blk.0.attn_q_norm.weight").is_some()
        );
        assert_eq!(
            arch.has_qkv_bias(),
            file.tensor("blk.0.attn_v.bias").is_some()
        );
        assert_eq!(
            arch == SynthArch::Gemma3,
            cfg.sliding_window == Some(512) && file.tensor("blk.0.post_ffw_norm.weight").is_some()
        );
    }
}

#[test]
fn the_tokenizer_builds_and_round_trips() {
    let model = SynthModel::new(
        SynthShape {
            vocab: 4000,
            ..tiny(SynthArch::Llama)
        },
        "t",
        &SynthOptions::new(FileType::F16, 1),
    )
    .expect("plan");
    let tok = Tokenizer::from_metadata(&model.metadata).expect("tokenizer");
    assert_eq!(tok.vocab_size(), 4000);
    assert_eq!((tok.bos(), tok.eos()), (Some(1), Some(2)));
    let text = "Hello world, this is a tokenizer test: 42 €\n";
    let ids = tok.encode(text, true, false).expect("encode");
    assert_eq!(ids[0], 1, "BOS first");
    assert!(ids.len() > 5 && ids.len() < text.len(), "{ids:?}");
    // Pieces longer than one character were used.
    assert!(ids
        .iter()
        .any(|&id| tok.token_text(id).is_some_and(|t| t.chars().count() >= 3)));
    // The SentencePiece space prefix may come back, as in llama.cpp.
    assert_eq!(tok.decode(&ids, true, false).trim_start_matches(' '), text);
}

#[test]
fn rows_are_deterministic_and_independent_of_how_they_are_split() {
    let opts = SynthOptions::new(FileType::Q4_0, 99);
    let model = SynthModel::new(tiny(SynthArch::Qwen3), "t", &opts).expect("plan");
    let i = model
        .tensors
        .iter()
        .position(|t| t.name == "blk.1.ffn_up.weight")
        .expect("tensor");
    let rows = model.tensors[i].n_rows();
    let mut whole = Vec::new();
    model.encode_rows(i, 0..rows, &mut whole).expect("rows");
    let mut parts = Vec::new();
    model.encode_rows(i, 0..7, &mut parts).expect("rows");
    model.encode_rows(i, 7..rows, &mut parts).expect("rows");
    assert_eq!(whole, parts);
    let other = SynthModel::new(
        tiny(SynthArch::Qwen3),
        "t",
        &SynthOptions { seed: 100, ..opts },
    )
    .expect("plan");
    let mut diff = Vec::new();
    other.encode_rows(i, 0..rows, &mut diff).expect("rows");
    assert_ne!(whole, diff);
    assert!(model.encode_rows(i, 0..rows + 1, &mut diff).is_err());
    assert!(model.encode_rows(10_000, 0..1, &mut diff).is_err());
}

#[test]
fn quantized_weights_keep_the_asked_distribution() {
    let seed = 5;
    let mut opts = SynthOptions::new(FileType::Q4_K_M, seed);
    opts.scales.proj = 0.03;
    let model = SynthModel::new(tiny(SynthArch::Llama), "t", &opts).expect("plan");
    for (name, mean, std) in [
        ("blk.0.ffn_gate.weight", 0.0, 0.03),
        ("token_embd.weight", 0.0, 0.02),
        ("blk.0.attn_norm.weight", 1.0, 0.02),
    ] {
        let i = model
            .tensors
            .iter()
            .position(|t| t.name == name)
            .expect("tensor");
        let t = &model.tensors[i];
        let mut bytes = Vec::new();
        model
            .encode_rows(i, 0..t.n_rows(), &mut bytes)
            .expect("rows");
        let mut values = vec![0.0f32; (t.row_len() * t.n_rows()) as usize];
        reference::dequantize(t.ty, &bytes, &mut values).expect("dequantize");
        let n = values.len() as f64;
        let m = values.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
        let sd = (values
            .iter()
            .map(|&x| (f64::from(x) - m).powi(2))
            .sum::<f64>()
            / n)
            .sqrt();
        assert!((m - mean).abs() < 0.1 * std, "seed {seed} {name}: mean {m}");
        assert!(
            (sd / std - 1.0).abs() < 0.1,
            "seed {seed} {name} ({}): std {sd}",
            t.ty
        );
    }
}

#[test]
fn pure_f16_and_odd_rows_follow_the_recipe() {
    let pure = SynthOptions {
        pure: true,
        ..SynthOptions::new(FileType::Q4_K_M, 1)
    };
    let model = SynthModel::new(tiny(SynthArch::Llama), "t", &pure).expect("plan");
    for t in &model.tensors {
        let want = if t.shape.len() == 1 {
            GgmlType::F32
        } else {
            GgmlType::Q4_K
        };
        assert_eq!(t.ty, want, "{}", t.name);
    }
    let f16 = SynthModel::new(
        tiny(SynthArch::Qwen2),
        "t",
        &SynthOptions::new(FileType::F16, 1),
    )
    .expect("plan");
    assert!(f16.tensors.iter().all(|t| t.ty
        == if t.shape.len() == 1 {
            GgmlType::F32
        } else {
            GgmlType::F16
        }));
    // 576 wide (SmolLM2): Q4_K falls back to Q5_0, Q6_K to Q8_0, as llama-quantize does.
    let smol = SynthShape {
        hidden: 576,
        heads: 9,
        kv_heads: 3,
        ..tiny(SynthArch::Llama)
    };
    let model = SynthModel::new(smol, "t", &SynthOptions::new(FileType::Q4_K_M, 1)).expect("plan");
    let ty = |n: &str| model.tensors.iter().find(|t| t.name == n).map(|t| t.ty);
    assert_eq!(ty("blk.0.attn_q.weight"), Some(GgmlType::Q5_0));
    assert_eq!(ty("token_embd.weight"), Some(GgmlType::Q8_0));
}

#[test]
fn named_shapes_plan_their_real_sizes() {
    let plan = |name: &str, ft| {
        let shape = SynthShape::named(name).expect("shape");
        SynthModel::new(shape, name, &SynthOptions::new(ft, 0)).expect("plan")
    };
    let m = plan("llama-3.2-1b", FileType::Q4_K_M);
    // 1.24 B parameters; llama.cpp's Q4_K_M of Llama 3.2 1B is 807.7 MB of data.
    assert_eq!(m.n_params(), 1_235_814_400);
    let gb = m.data_bytes() as f64 / 1e9;
    assert!((0.79..0.82).contains(&gb), "{gb} GB");
    let m = plan("llama-3.1-8b", FileType::Q4_K_M);
    assert_eq!(m.n_params(), 8_030_261_248);
    assert!(m.tensors.iter().any(|t| t.name == "output.weight"));
    let m = plan("qwen3-30b-a3b", FileType::Q4_K_M);
    assert_eq!(
        m.tensors
            .iter()
            .filter(|t| t.name.ends_with("_exps.weight"))
            .count(),
        48 * 3
    );
}

#[test]
fn bad_scales_are_rejected() {
    let mut opts = SynthOptions::new(FileType::Q8_0, 1);
    opts.scales.embd = f32::NAN;
    let err = SynthModel::new(tiny(SynthArch::Llama), "t", &opts).expect_err("nan");
    assert!(err.to_string().contains("scale"));
}
