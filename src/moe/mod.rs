//! Mixture of experts: the routing every backend computes, and the seam
//! where the expert cache lives.
//!
//! [`route`] turns router logits into each token's top-k experts and weights
//! (softmax over all experts, top-k, renormalised, as llama.cpp does for
//! Mixtral and Qwen3-MoE): the reference of [`Op::MoeTopK`], kept with the
//! other references in [`crate::graph::reference::moe`] so that backends
//! need nothing above [`crate::graph`]. On the device,
//! the ids stay where they are made and [`Op::MoeExperts`] runs the experts
//! as a grouped product over them; [`group_by_expert`] is that grouping on
//! the host (each expert's weights read once per step).
//!
//! [`ExpertStore`] ([`store`]) is where a model's routed experts live when
//! they are not all on the device: a plan then stops after each MoE layer's
//! routing ([`crate::graph::plan::SyncKind::MoeRoutes`]) and the store makes
//! the routed experts resident before the layer's experts run.
//! [`ExpertCache`] ([`cache`]) is the store every build uses: routed
//! experts in host memory, pools of device slots kept by a [`Policy`]
//! ([`policy`]), the misses copied or computed on the host.
//!
//! [`Op::MoeTopK`]: crate::graph::Op::MoeTopK
//! [`Op::MoeExperts`]: crate::graph::Op::MoeExperts

pub mod cache;
pub mod policy;
pub mod store;

pub use crate::graph::reference::moe::{group_by_expert, route, ExpertBatch, TokenRoute};
pub use cache::{CacheOptions, ExpertCache, ExpertStats, HostExperts, PoolSpec};
pub use policy::Policy;
pub use store::{ExpertPlacement, ExpertStore, Routes};
