use super::*;

fn cfg(n_head: usize, n_head_kv: usize, n_ff: usize) -> ModelConfig {
    ModelConfig {
        name: None,
        arch: "llama".into(),
        n_layer: 1,
        n_embd: n_head * 8,
        n_head,
        n_head_kv,
        head_dim_k: 8,
        head_dim_v: 8,
        n_ff,
        n_vocab: 16,
        n_ctx_train: 64,
        rms_eps: 1e-5,
        rope_base: 1e4,
        rope_base_swa: None,
        sliding_window: None,
        n_expert: 0,
        n_expert_used: 0,
        n_ff_expert: None,
        expert_shard: None,
    }
}

#[test]
fn heads_split_evenly_and_few_kv_heads_are_copied() {
    let l = ShardLayout::new(&cfg(8, 4, 64), 2).expect("2 shards");
    assert_eq!((l.heads(1), l.kv_heads(1)), (4..8, 2..4));
    // 2 K/V heads over 4 shards: shards 0-1 read head 0, shards 2-3 head 1,
    // as their query heads (2 each, groups of 4) do.
    let l = ShardLayout::new(&cfg(8, 2, 64), 4).expect("4 shards");
    let kv: Vec<_> = (0..4).map(|i| l.kv_heads(i)).collect();
    assert_eq!(kv, vec![0..1, 0..1, 1..2, 1..2]);
    for i in 0..4 {
        let group = 8 / 2;
        assert!(l.heads(i).all(|h| h / group == l.kv_heads(i).start));
    }
    assert!(ShardLayout::new(&cfg(8, 4, 60), 8).is_err(), "60 FFN units");
    assert!(
        ShardLayout::new(&cfg(12, 3, 64), 2).is_err(),
        "3 K/V heads, 2 shards"
    );
    assert!(ShardLayout::new(&cfg(8, 4, 64), 0).is_err(), "no shards");
}

fn info(name: &str, shape: &[u64], ty: crate::quant::GgmlType) -> TensorInfo {
    TensorInfo {
        name: name.into(),
        shape: shape.to_vec(),
        ty,
        offset: 0,
        size: 0,
        split: 0,
    }
}

#[test]
fn rows_and_columns_are_cut_per_group_and_per_row() {
    use crate::quant::GgmlType;
    // 2 experts of 4 rows of 3 f32 columns: rows 1..3 of each expert.
    let t = info("blk.0.ffn_up_exps.weight", &[3, 4, 2], GgmlType::F32);
    let data: Vec<u8> = (0..24u32).flat_map(|v| (v as f32).to_le_bytes()).collect();
    let cut = Cut::Rows {
        per_group: 4,
        range: 1..3,
    };
    let (spec, bytes) = cut_tensor(&t, &data, &cut, 2).expect("cut");
    let got: Vec<f32> = bytemuck::pod_collect_to_vec(&bytes);
    assert_eq!(spec.shape, vec![3, 2, 2]);
    assert_eq!(
        got,
        vec![3., 4., 5., 6., 7., 8., 15., 16., 17., 18., 19., 20.]
    );
    // Columns 32..64 of Q8_0 rows: the second block of each row.
    let t = info("blk.0.ffn_down.weight", &[64, 2], GgmlType::Q8_0);
    let data: Vec<u8> = (0..2 * 2 * 34).map(|b| b as u8).collect();
    let (spec, bytes) = cut_tensor(&t, &data, &Cut::Cols(32..64), 2).expect("cut");
    assert_eq!(spec.shape, vec![32, 2]);
    assert_eq!(bytes, [&data[34..68], &data[102..136]].concat());
    // Expert 1 of 2 experts of 2 rows of 4 f32 columns, whole.
    let e = info("blk.0.ffn_gate_exps.weight", &[4, 2, 2], GgmlType::F32);
    let floats: Vec<u8> = (0..16u32).flat_map(|v| (v as f32).to_le_bytes()).collect();
    let (spec, bytes) = cut_tensor(&e, &floats, &Cut::Experts(1..2), 2).expect("cut");
    assert_eq!(spec.shape, vec![4, 2, 1]);
    assert_eq!(bytes, floats[32..].to_vec());
    // Half a block is refused.
    let err = cut_tensor(&t, &data, &Cut::Cols(16..48), 2).expect_err("half blocks");
    assert!(err.to_string().contains("whole blocks"), "{err}");
}

#[test]
fn the_host_reduce_adds_in_shard_order_whoever_comes_first() {
    let r = HostReduce::new(3);
    let waker = std::task::Waker::noop();
    let mut cx = Context::from_waker(waker);
    // Shard 2 first, then 0: nothing is done until shard 1 comes.
    let mut f2 = r.reduce(0, 2, vec![1e8, 1.0]);
    assert!(Pin::new(&mut f2).poll(&mut cx).is_pending());
    let mut f0 = r.reduce(0, 0, vec![1.0, 2.0]);
    // A second round may start before the first is taken.
    let mut g0 = r.reduce(1, 0, vec![5.0]);
    let mut f1 = r.reduce(0, 1, vec![-1e8, 3.0]);
    let want = vec![(1.0f32 + -1e8) + 1e8, 6.0];
    for f in [&mut f0, &mut f1, &mut f2] {
        assert_eq!(Pin::new(f).poll(&mut cx), Poll::Ready(want.clone()));
    }
    assert!(Pin::new(&mut g0).poll(&mut cx).is_pending());
    assert_eq!(
        r.rounds.lock().unwrap().len(),
        1,
        "round 0 is gone once taken"
    );
}
