//! Fusion: one pass over a plan that replaces runs of ops by the fused
//! variants a backend has kernels for ([`Op::FusedMatMul`],
//! [`Op::RopeKvWrite`]), and [`expand`], its inverse, which says what a
//! fused op stands for.
//!
//! The pass knows the plan's buffers by name, so the conditions every
//! fusion needs (the product reads what the norm wrote, the ropes rotate
//! in place, no output clobbers an input another part still reads) are
//! checked once here for every backend. A backend opts into a fused
//! variant by answering `true` to it in
//! [`supports`](crate::backend::Backend::supports); for a run it refuses,
//! the pass offers the smaller fusions (the norm without the residual
//! add, the products without the norm) before leaving the ops apart.
//!
//! The runs it looks for, in the order a transformer layer has them:
//! - `[Add] RmsNorm MatMul+`, `SiluMul|GeluTanhMul MatMul+` and `MatMul MatMul+`
//!   over one input: [`Op::FusedMatMul`] with the matching [`Prologue`];
//! - `Rope(q) Rope(k) KvWrite(k, v)` at the same positions: [`Op::RopeKvWrite`].

use super::plan::{BufId, Plan, Step};
use super::{Activation, Op, Prologue, RopeSpec};
use crate::quant::GgmlType;

/// Replaces runs of `plan`'s steps by fused ops that `supports` accepts.
/// The plan computes the same values (up to the backend's fused kernels).
pub fn fuse(plan: &mut Plan, supports: &dyn Fn(&Op) -> bool) {
    let old = std::mem::take(&mut plan.steps);
    // `at[j]`: the new index of the step that starts at old step `j`.
    let mut at = vec![0; old.len() + 1];
    let mut steps = Vec::with_capacity(old.len());
    let mut i = 0;
    while i < old.len() {
        // Never across a sync point: the host acts between the two sides.
        let end = plan
            .syncs
            .iter()
            .map(|s| s.before)
            .find(|&b| b > i)
            .map_or(old.len(), |b| b.min(old.len()));
        let run = &old[i..end];
        let (step, used) = fuse_products(plan, run, supports)
            .or_else(|| fuse_rope(plan, run, supports))
            .unwrap_or_else(|| (run[0].clone(), 1));
        at[i] = steps.len();
        steps.push(step);
        i += used;
    }
    at[old.len()] = steps.len();
    for s in &mut plan.syncs {
        s.before = at[s.before.min(old.len())];
    }
    plan.steps = steps;
}

/// A run of products over one input: their weights, outputs, and shape.
struct Products {
    x: BufId,
    k: usize,
    exact: bool,
    parts: Vec<(GgmlType, usize)>,
    weights: Vec<BufId>,
    outputs: Vec<BufId>,
}

/// The products that start `run`: consecutive [`Op::MatMul`]s reading one
/// input of the same width, whose outputs are distinct and clobber none of
/// the run's reads (the input, the `keep` buffers, each other's weights).
fn products(run: &[Step], keep: &[BufId]) -> Option<Products> {
    let first = run.first()?;
    let (&Op::MatMul { k, exact, .. }, [x, _]) = (&first.op, first.inputs.as_slice()) else {
        return None;
    };
    let mut p = Products {
        x: *x,
        k,
        exact,
        parts: Vec::new(),
        weights: Vec::new(),
        outputs: Vec::new(),
    };
    for s in run {
        let (
            &Op::MatMul {
                ty,
                k: sk,
                n,
                exact: se,
            },
            [sx, w],
            [y],
        ) = (&s.op, s.inputs.as_slice(), s.outputs.as_slice())
        else {
            break;
        };
        let clobbers = *y == p.x
            || keep.contains(y)
            || p.outputs.contains(y)
            || p.weights.contains(y)
            || w == y;
        if *sx != p.x || sk != k || se != exact || clobbers {
            break;
        }
        p.parts.push((ty, n));
        p.weights.push(*w);
        p.outputs.push(*y);
    }
    (!p.parts.is_empty()).then_some(p)
}

/// The fused products that start `run`, and how many steps they replace:
/// with the largest prologue `supports` accepts.
fn fuse_products(
    plan: &Plan,
    run: &[Step],
    supports: &dyn Fn(&Op) -> bool,
) -> Option<(Step, usize)> {
    let s0 = run.first()?;
    let norm = |s: &Step| match (&s.op, s.inputs.as_slice(), s.outputs.as_slice()) {
        (&Op::RmsNorm { eps, .. }, [x, w], [h]) => Some((eps, *x, *w, *h)),
        _ => None,
    };
    // Prologues that start the run: (prologue, its inputs, its outputs,
    // steps it takes).
    let mut candidates: Vec<(Prologue, Vec<BufId>, Vec<BufId>, usize)> = Vec::new();
    match (&s0.op, s0.inputs.as_slice(), s0.outputs.as_slice()) {
        (Op::Add, [a, b], [sum]) => {
            if let Some((eps, x, w, h)) = run.get(1).and_then(norm) {
                if x == *sum && h != *a && h != *b && h != w {
                    candidates.push((
                        Prologue::AddRmsNorm { eps },
                        vec![*a, *b, w],
                        vec![*sum, h],
                        2,
                    ));
                }
            }
        }
        (Op::RmsNorm { .. }, ..) => {
            if let Some((eps, x, w, h)) = norm(s0) {
                if h != w {
                    candidates.push((Prologue::RmsNorm { eps }, vec![x, w], vec![h], 1));
                }
            }
        }
        (Op::SiluMul | Op::GeluTanhMul, [g, u], [o]) if o != u => {
            let act = match s0.op {
                Op::SiluMul => Activation::Silu,
                _ => Activation::GeluTanh,
            };
            candidates.push((Prologue::Glu(act), vec![*g, *u], vec![*o], 1));
        }
        _ => {}
    }
    for (pre, ins, outs, skip) in candidates {
        let keep: Vec<BufId> = ins.iter().chain(&outs).copied().collect();
        let Some(p) = products(&run[skip..], &keep) else {
            continue;
        };
        // The norm's width is the products' input width.
        let widths_match = match pre {
            Prologue::RmsNorm { .. } | Prologue::AddRmsNorm { .. } => {
                matches!(run[skip - 1].op, Op::RmsNorm { width, .. } if width == p.k)
            }
            _ => true,
        };
        if outs.last() != Some(&p.x) || !widths_match {
            continue;
        }
        if let Some(step) = fused_products(plan, pre, ins, outs, &p, supports) {
            return Some((step, skip + p.parts.len()));
        }
    }
    // Products of one input sharing its quantized activations.
    let p = products(run, &[])?;
    if p.parts.len() < 2 {
        return None;
    }
    let used = p.parts.len();
    fused_products(plan, Prologue::None, vec![p.x], Vec::new(), &p, supports).map(|s| (s, used))
}

/// The [`Op::FusedMatMul`] step of `pre` (over `ins`, writing `outs`) and
/// the products `p`, if `supports` accepts it.
fn fused_products(
    plan: &Plan,
    pre: Prologue,
    mut ins: Vec<BufId>,
    mut outs: Vec<BufId>,
    p: &Products,
    supports: &dyn Fn(&Op) -> bool,
) -> Option<Step> {
    let op = Op::FusedMatMul {
        pre,
        k: p.k,
        parts: p.parts.clone(),
        exact: p.exact,
        rows: plan.rows_of(p.x, p.k),
    };
    if !supports(&op) {
        return None;
    }
    ins.extend(&p.weights);
    outs.extend(&p.outputs);
    Some(Step {
        op,
        inputs: ins,
        outputs: outs,
    })
}

/// `Rope(q) Rope(k) KvWrite(k, v)` at the start of `run` as one
/// [`Op::RopeKvWrite`], if `supports` accepts it: both ropes in place with
/// the same parameters, positions and factors, the write of the rotated k.
fn fuse_rope(plan: &Plan, run: &[Step], supports: &dyn Fn(&Op) -> bool) -> Option<(Step, usize)> {
    let [rq, rk, w, ..] = run else {
        return None;
    };
    let (spec, sk) = (RopeSpec::of(&rq.op)?, RopeSpec::of(&rk.op)?);
    let Op::KvWrite {
        layer,
        k_width,
        v_width,
        dtype,
    } = w.op
    else {
        return None;
    };
    let (q, k) = (*rq.inputs.first()?, *rk.inputs.first()?);
    let (&[_, v, slots], &[kc, vc]) = (w.inputs.as_slice(), w.outputs.as_slice()) else {
        return None;
    };
    let in_place = rq.outputs == [q] && rk.outputs == [k] && q != k;
    let same_rotation = spec == sk && rq.inputs[1..] == rk.inputs[1..];
    let writes_k = w.inputs.first() == Some(&k) && v != q && v != k;
    if !(in_place && same_rotation && writes_k) {
        return None;
    }
    let op = Op::RopeKvWrite {
        rope: spec,
        layer,
        k_width,
        v_width,
        dtype,
        rows: plan.rows_of(k, k_width),
    };
    if !supports(&op) {
        return None;
    }
    let mut inputs = vec![q, k, v, rq.inputs[1], slots];
    inputs.extend(rq.inputs.get(2));
    let step = Step {
        op,
        inputs,
        outputs: vec![q, k, kc, vc],
    };
    Some((step, 3))
}

/// Where a part of a fused op takes a buffer from: the fused op's input
/// or output `i`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arg {
    /// The fused op's input `i`.
    In(usize),
    /// The fused op's output `i`.
    Out(usize),
}

/// One op a fused op stands for, over the fused op's buffers.
#[derive(Debug, Clone, PartialEq)]
pub struct Part {
    /// The op.
    pub op: Op,
    /// Its inputs.
    pub inputs: Vec<Arg>,
    /// Its outputs.
    pub outputs: Vec<Arg>,
}

/// The ops a fused op stands for, in order (`None` for an op that is not
/// fused): running them one by one computes what the fused op does.
pub fn expand(op: &Op) -> Option<Vec<Part>> {
    use Arg::{In, Out};
    let part = |op: Op, inputs: Vec<Arg>, outputs: Vec<Arg>| Part {
        op,
        inputs,
        outputs,
    };
    match op {
        Op::FusedMatMul {
            pre,
            k,
            parts,
            exact,
            ..
        } => {
            let (ins, outs) = pre.arity();
            let mut v = match *pre {
                Prologue::None => Vec::new(),
                Prologue::RmsNorm { eps } => vec![part(
                    Op::RmsNorm { width: *k, eps },
                    vec![In(0), In(1)],
                    vec![Out(0)],
                )],
                Prologue::AddRmsNorm { eps } => vec![
                    part(Op::Add, vec![In(0), In(1)], vec![Out(0)]),
                    part(
                        Op::RmsNorm { width: *k, eps },
                        vec![Out(0), In(2)],
                        vec![Out(1)],
                    ),
                ],
                Prologue::Glu(act) => {
                    let op = match act {
                        Activation::Silu => Op::SiluMul,
                        Activation::GeluTanh => Op::GeluTanhMul,
                    };
                    vec![part(op, vec![In(0), In(1)], vec![Out(0)])]
                }
            };
            let x = if outs == 0 { In(0) } else { Out(outs - 1) };
            for (i, &(ty, n)) in parts.iter().enumerate() {
                let mm = Op::MatMul {
                    ty,
                    k: *k,
                    n,
                    exact: *exact,
                };
                v.push(part(mm, vec![x, In(ins + i)], vec![Out(outs + i)]));
            }
            Some(v)
        }
        Op::RopeKvWrite {
            rope,
            layer,
            k_width,
            v_width,
            dtype,
            ..
        } => {
            let mut rq = vec![In(0), In(3)];
            let mut rk = vec![In(1), In(3)];
            // Frequency divisors, when the fused op has them (input 5).
            rq.push(In(5));
            rk.push(In(5));
            let write = Op::KvWrite {
                layer: *layer,
                k_width: *k_width,
                v_width: *v_width,
                dtype: *dtype,
            };
            Some(vec![
                part(rope.op(), rq, vec![Out(0)]),
                part(rope.op(), rk, vec![Out(1)]),
                part(write, vec![Out(1), In(2), In(4)], vec![Out(2), Out(3)]),
            ])
        }
        _ => None,
    }
}

/// [`expand`] over concrete buffers: the steps a fused step stands for (a
/// part's argument past the step's buffers, such as absent rope factors,
/// is left out).
pub fn expand_step(step: &Step) -> Option<Vec<Step>> {
    let resolve = |a: &Arg| match *a {
        Arg::In(i) => step.inputs.get(i).copied(),
        Arg::Out(i) => step.outputs.get(i).copied(),
    };
    let parts = expand(&step.op)?;
    Some(
        parts
            .into_iter()
            .map(|p| Step {
                inputs: p.inputs.iter().filter_map(resolve).collect(),
                outputs: p.outputs.iter().filter_map(resolve).collect(),
                op: p.op,
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::plan::SyncKind;
    use crate::graph::{KvType, RopeMode};

    const T: usize = 3;

    fn mm(n: usize) -> Op {
        Op::MatMul {
            ty: GgmlType::Q8_0,
            k: 64,
            n,
            exact: false,
        }
    }

    /// One llama layer over 3 tokens, as the model plans it.
    fn layer() -> Plan {
        let mut p = Plan::default();
        let act = |p: &mut Plan, w: usize| p.act(T * w * 4);
        let (x, o, h) = (act(&mut p, 64), act(&mut p, 64), act(&mut p, 64));
        let (q, k, v, att) = (
            act(&mut p, 64),
            act(&mut p, 32),
            act(&mut p, 32),
            act(&mut p, 64),
        );
        let (g, u) = (act(&mut p, 128), act(&mut p, 128));
        let pos = p.input(crate::graph::plan::Input::Positions);
        let slots = p.input(crate::graph::plan::Input::Slots);
        let w = BufId::Weight;
        let norm = Op::RmsNorm {
            width: 64,
            eps: 1e-5,
        };
        let rope = Op::Rope {
            mode: RopeMode::Norm,
            head_dim: 16,
            n_rot: 16,
            base: 1e4,
            scale: 1.0,
        };
        p.push(Op::Add, &[x, o], &[x]);
        p.push(norm.clone(), &[x, w(0)], &[h]);
        p.push(mm(64), &[h, w(1)], &[q]);
        p.push(mm(32), &[h, w(2)], &[k]);
        p.push(mm(32), &[h, w(3)], &[v]);
        p.push(rope.clone(), &[q, pos], &[q]);
        p.push(rope, &[k, pos], &[k]);
        let write = Op::KvWrite {
            layer: 0,
            k_width: 32,
            v_width: 32,
            dtype: KvType::F16,
        };
        p.push(write, &[k, v, slots], &[BufId::KvK(0), BufId::KvV(0)]);
        p.push(Op::Scale(0.5), &[q], &[att]);
        p.push(mm(64), &[att, w(4)], &[o]);
        p.push(Op::Add, &[x, o], &[x]);
        p.push(norm, &[x, w(5)], &[h]);
        p.push(mm(128), &[h, w(6)], &[g]);
        p.push(mm(128), &[h, w(7)], &[u]);
        p.push(Op::SiluMul, &[g, u], &[g]);
        p.push(mm(64), &[g, w(8)], &[o]);
        p
    }

    /// The fused plan's steps, expanded again.
    fn expanded(p: &Plan) -> Vec<Step> {
        p.steps
            .iter()
            .flat_map(|s| expand_step(s).unwrap_or_else(|| vec![s.clone()]))
            .collect()
    }

    fn prologues(p: &Plan) -> Vec<String> {
        p.steps
            .iter()
            .map(|s| match &s.op {
                Op::FusedMatMul { pre, parts, .. } => format!("{pre:?}x{}", parts.len()),
                op => op.name().to_string(),
            })
            .collect()
    }

    #[test]
    fn a_layer_fuses_into_what_it_expands_from() {
        let plain = layer();
        let mut p = plain.clone();
        fuse(&mut p, &|_| true);
        assert_eq!(
            prologues(&p),
            [
                "AddRmsNorm { eps: 1e-5 }x3",
                "RopeKvWrite",
                "Scale",
                "MatMul",
                "AddRmsNorm { eps: 1e-5 }x2",
                "Glu(Silu)x1"
            ]
        );
        assert_eq!(expanded(&p), plain.steps);
        assert!(p.check(9, 1).is_ok());
        let rows = p.steps.iter().find_map(|s| match s.op {
            Op::FusedMatMul { rows, .. } | Op::RopeKvWrite { rows, .. } => Some(rows),
            _ => None,
        });
        assert_eq!(rows, Some(T));
    }

    #[test]
    fn a_refused_fusion_falls_back_to_a_smaller_one() {
        let plain = layer();
        let mut p = plain.clone();
        let no_add = |op: &Op| {
            !matches!(
                op,
                Op::FusedMatMul {
                    pre: Prologue::AddRmsNorm { .. },
                    ..
                }
            )
        };
        fuse(&mut p, &no_add);
        assert_eq!(
            prologues(&p),
            [
                "Add",
                "RmsNorm { eps: 1e-5 }x3",
                "RopeKvWrite",
                "Scale",
                "MatMul",
                "Add",
                "RmsNorm { eps: 1e-5 }x2",
                "Glu(Silu)x1"
            ]
        );
        assert_eq!(expanded(&p), plain.steps);
        // No prologue at all: the products of one input still share it.
        let mut p = plain.clone();
        let products_only = |op: &Op| {
            matches!(
                op,
                Op::FusedMatMul {
                    pre: Prologue::None,
                    ..
                }
            )
        };
        fuse(&mut p, &products_only);
        let fused: Vec<_> = prologues(&p)
            .into_iter()
            .filter(|s| s.starts_with("None"))
            .collect();
        assert_eq!(fused, ["Nonex3", "Nonex2"]);
        assert_eq!(expanded(&p), plain.steps);
        let mut p = plain.clone();
        fuse(&mut p, &|_| false);
        assert_eq!(p, plain);
    }

    #[test]
    fn no_fusion_crosses_a_sync_point_or_clobbers_an_input() {
        let plain = layer();
        let mut p = plain.clone();
        // A stop between the norm and the products, and one at the end.
        p.syncs.push(crate::graph::plan::SyncPoint {
            before: 2,
            read: vec![0],
            write: Vec::new(),
            kind: SyncKind::MoeRoutes { layer: 0 },
        });
        p.syncs.push(crate::graph::plan::SyncPoint {
            before: plain.steps.len(),
            read: vec![0],
            write: vec![0],
            kind: SyncKind::MoeRoutes { layer: 1 },
        });
        fuse(&mut p, &|_| true);
        assert_eq!(&prologues(&p)[..3], ["Add", "RmsNorm", "Nonex3"]);
        assert_eq!(p.syncs[0].before, 2);
        assert_eq!(p.syncs[1].before, p.steps.len());
        assert_eq!(expanded(&p), plain.steps);
        // A product writing the input the next one reads ends the run.
        let mut p = plain.clone();
        p.steps[3].outputs = p.steps[2].inputs[..1].to_vec();
        fuse(&mut p, &|_| true);
        assert_eq!(prologues(&p)[0], "AddRmsNorm { eps: 1e-5 }x1");
    }
}
