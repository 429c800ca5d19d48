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

/// A MoE shape with Qwen3-30B-A3B's or Mixtral's routing (`experts`,
/// `used`) but a narrow residual stream, so its routers are quick to make.
fn moe(hidden: u64, experts: u64, used: u64) -> SynthShape {
    let mut s = SynthShape::custom(SynthArch::Qwen3Moe, [hidden, 2, 4, 2, 64, 512, 512]);
    s.experts = experts;
    s.experts_used = used;
    s.expert_ffn = 32;
    s
}

/// Tensor `name`'s values as the file stores them.
fn values_of(model: &SynthModel, name: &str) -> Vec<f32> {
    let i = model
        .tensors
        .iter()
        .position(|t| t.name == name)
        .unwrap_or_else(|| panic!("no tensor {name}"));
    let t = &model.tensors[i];
    let mut bytes = Vec::new();
    model
        .encode_rows(i, 0..t.n_rows(), &mut bytes)
        .expect("rows");
    let mut values = vec![0.0f32; (t.row_len() * t.n_rows()) as usize];
    reference::dequantize(t.ty, &bytes, &mut values).expect("dequantize");
    values
}

/// Each expert's share of the top-k hits of `layer`'s router over `tokens`
/// Gaussian hidden states, RMS-normed and scaled by the layer's `ffn_norm`
/// (the router's input), most popular first.
fn hit_shares(model: &SynthModel, layer: u64, tokens: usize, seed: u64) -> Vec<f64> {
    use crate::graph::reference::moe::route;
    let (n, k) = (
        model.shape.experts as usize,
        model.shape.experts_used as usize,
    );
    let d = model.shape.hidden as usize;
    let router = values_of(model, &format!("blk.{layer}.ffn_gate_inp.weight"));
    let norm = values_of(model, &format!("blk.{layer}.ffn_norm.weight"));
    let mut gen = rng::Pcg32::new(seed, 1);
    let mut h = vec![0.0f32; d];
    let mut logits = vec![0.0f32; tokens * n];
    for row in logits.chunks_exact_mut(n) {
        rng::fill_normal(&mut gen, 0.0, 1.0, &mut h);
        let rms = (h.iter().map(|x| x * x).sum::<f32>() / d as f32).sqrt();
        for (x, g) in h.iter_mut().zip(&norm) {
            *x *= g / rms;
        }
        for (l, w) in row.iter_mut().zip(router.chunks_exact(d)) {
            *l = w.iter().zip(&h).map(|(a, b)| a * b).sum();
        }
    }
    let mut hits = vec![0u64; n];
    for r in route(&logits, n, k) {
        for e in r.experts {
            hits[e] += 1;
        }
    }
    let total = (tokens * k) as f64;
    let mut shares: Vec<f64> = hits.iter().map(|&h| h as f64 / total).collect();
    shares.sort_by(|a, b| b.total_cmp(a));
    shares
}

/// The share of the hits of the most popular `frac` of the experts (at least one).
fn top_share(shares: &[f64], frac: f64) -> f64 {
    let m = ((shares.len() as f64 * frac).ceil() as usize).max(1);
    shares[..m].iter().sum()
}

/// A fresh seed for a statistical test, printed by its assertions.
fn fresh_seed() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    rng::splitmix64(nanos)
}

/// A change here changes synthetic files: skew 0 must keep writing the bytes
/// written before `router_skew` existed (this hash was taken then).
#[test]
fn router_skew_zero_writes_the_files_it_wrote_before() {
    let opts = SynthOptions::new(FileType::Q4_K_M, 11);
    assert_eq!(opts.router_skew, 0.0);
    let model = SynthModel::new(tiny(SynthArch::Qwen3Moe), "t", &opts).expect("plan");
    assert!(model.tensors.iter().all(|t| t.row_scales.is_empty()));
    assert!(model.metadata.get("hearth.synth.router_skew").is_none());
    let bytes = write(&model);
    assert_eq!(
        (rng::fnv1a(&bytes), bytes.len()),
        (0x72de_9b00_3c62_cfe1, 1_317_312)
    );
}

#[test]
fn router_skew_changes_only_the_routers_and_is_recorded() {
    let plain = SynthOptions::new(FileType::Q8_0, 4);
    let skewed = SynthOptions {
        router_skew: SUGGESTED_ROUTER_SKEW,
        ..plain.clone()
    };
    let a = SynthModel::new(moe(64, 16, 4), "t", &plain).expect("plan");
    let b = SynthModel::new(moe(64, 16, 4), "t", &skewed).expect("plan");
    assert_eq!(types_of(&a), types_of(&b));
    for (i, t) in a.tensors.iter().enumerate() {
        let (mut x, mut y) = (Vec::new(), Vec::new());
        a.encode_rows(i, 0..t.n_rows(), &mut x).expect("rows");
        b.encode_rows(i, 0..t.n_rows(), &mut y).expect("rows");
        assert_eq!(
            x == y,
            !t.name.ends_with("ffn_gate_inp.weight"),
            "{}",
            t.name
        );
    }
    // Each router row is the plain row times its rank's factor.
    let (x, y) = (
        values_of(&a, "blk.1.ffn_gate_inp.weight"),
        values_of(&b, "blk.1.ffn_gate_inp.weight"),
    );
    let ranks = router::expert_ranks(4, 1, 16);
    for (e, (px, py)) in x.chunks_exact(64).zip(y.chunks_exact(64)).enumerate() {
        let f = router::rank_scale(ranks[e], SUGGESTED_ROUTER_SKEW);
        for (&p, &q) in px.iter().zip(py) {
            assert!((p * f - q).abs() <= 1e-6 * p.abs().max(1e-3), "expert {e}");
        }
    }
    assert_eq!(
        b.metadata.get("hearth.synth.router_skew"),
        Some(&Value::F32(1.0))
    );
    let description = |m: &SynthModel| match m.metadata.get("general.description") {
        Some(Value::String(s)) => s.clone(),
        other => panic!("description {other:?}"),
    };
    assert!(
        description(&b).contains("router skew 1"),
        "{}",
        description(&b)
    );
    assert!(!description(&a).contains("skew"));
    // Hearth and llama.cpp read past the extra key.
    let file = pollster::block_on(GgufFile::read(&MemSource::new(write(&b)))).expect("parse");
    ModelConfig::from_metadata_supported(&file.metadata).expect("config");
}

#[test]
fn bad_router_skews_are_rejected() {
    for (shape, skew, needle) in [
        (moe(64, 16, 4), -1.0, "--router-skew"),
        (moe(64, 16, 4), f32::NAN, "--router-skew"),
        (tiny(SynthArch::Llama), 1.0, "mixture-of-experts"),
    ] {
        let opts = SynthOptions {
            router_skew: skew,
            ..SynthOptions::new(FileType::Q8_0, 1)
        };
        let err = SynthModel::new(shape, "t", &opts).expect_err(needle);
        assert!(err.to_string().contains(needle), "{err}");
    }
}

/// Qwen3-30B-A3B's routing (128 experts, 8 used): at the suggested skew the
/// top 10% of experts take most of the hits (at most 80% is possible, see
/// `router`), at skew 0 about their 10%; each layer has its own favourites.
#[test]
fn suggested_router_skew_concentrates_qwen3_moe_hits() {
    let seed = fresh_seed();
    let plan = |skew| {
        let opts = SynthOptions {
            router_skew: skew,
            ..SynthOptions::new(FileType::Q8_0, seed)
        };
        SynthModel::new(moe(256, 128, 8), "t", &opts).expect("plan")
    };
    let (flat, skewed) = (plan(0.0), plan(SUGGESTED_ROUTER_SKEW));
    let tokens = 3000;
    let top = top_share(&hit_shares(&skewed, 0, tokens, seed), 0.1);
    let uniform = top_share(&hit_shares(&flat, 0, tokens, seed), 0.1);
    assert!(top >= 0.6, "seed {seed}: top 10% of experts took {top:.3}");
    assert!(
        uniform < 0.2,
        "seed {seed}: top 10% took {uniform:.3} at skew 0"
    );
    let favourites = |layer| {
        let ranks = router::expert_ranks(seed, layer, 128);
        let mut top: Vec<usize> = (0..128).filter(|&e| ranks[e] < 13).collect();
        top.sort_unstable();
        top
    };
    assert_ne!(favourites(0), favourites(1), "seed {seed}");
}

/// Mixtral's routing (8 experts, 2 used): "10%" is less than one expert, so
/// the test is that the favourite takes clearly more than its 1/8 (at most
/// 1/4 is possible) and the top quarter more than its quarter.
#[test]
fn suggested_router_skew_skews_mixtral_hits() {
    let seed = fresh_seed();
    let plan = |skew| {
        let opts = SynthOptions {
            router_skew: skew,
            ..SynthOptions::new(FileType::Q8_0, seed)
        };
        SynthModel::new(moe(1024, 8, 2), "t", &opts).expect("plan")
    };
    let tokens = 4000;
    let skewed = hit_shares(&plan(SUGGESTED_ROUTER_SKEW), 1, tokens, seed);
    let flat = hit_shares(&plan(0.0), 1, tokens, seed);
    let (first, quarter) = (skewed[0], top_share(&skewed, 0.25));
    assert!(first >= 0.2, "seed {seed}: favourite took {first:.3}");
    assert!(quarter >= 0.4, "seed {seed}: top 2 took {quarter:.3}");
    assert!(
        flat[0] < 0.16,
        "seed {seed}: favourite took {:.3} at skew 0",
        flat[0]
    );
}
