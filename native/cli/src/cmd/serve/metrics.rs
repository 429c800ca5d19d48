//! `/metrics`: Prometheus text with vLLM's metric names and meanings (the
//! routers and autoscalers people run read these: llm-d's endpoint picker,
//! KServe, vLLM's production-stack router), beside Hearth's own.
//!
//! Every series carries a constant `model_name` label, as vLLM's do.

use std::borrow::Cow;
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

use hearth::engine::{EngineStats, FinishReason, Usage};
use hearth::moe::ExpertStats;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;
type FloatGauge = Gauge<f64, AtomicU64>;

/// vLLM's latency buckets (seconds) for time to first token.
const TTFT_BUCKETS: [f64; 18] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0,
];
/// vLLM's buckets (seconds) for the time between output tokens.
const ITL_BUCKETS: [f64; 16] = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
];
/// vLLM's buckets (seconds) for whole requests.
const E2E_BUCKETS: [f64; 15] = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
];

/// The server's metrics.
pub struct Metrics {
    registry: Registry,
    running: Gauge,
    waiting: Gauge,
    kv_usage: FloatGauge,
    kv_usage_old: FloatGauge,
    prefix_queries: Counter,
    prefix_hits: Counter,
    prompt_tokens: Counter,
    generation_tokens: Counter,
    success: Family<Labels, Counter>,
    ttft: Histogram,
    itl: Histogram,
    itl_old: Histogram,
    e2e: Histogram,
    cache_config: Family<Labels, Gauge>,
    kv_free: Gauge,
    kv_total: Gauge,
    preemptions: Counter,
    steps: Counter,
    prefill_tokens: Counter,
    decode_tokens: Counter,
    cancelled: Counter,
    rejected: Family<Labels, Counter>,
    loaded: Gauge,
    /// The engine totals seen last (prefix queries, prefix hits,
    /// preemptions, steps, prefill and decode tokens), so counters advance
    /// by the difference.
    last: Mutex<[u64; 6]>,
    /// The expert cache's counts: hits, misses, copies, bytes copied,
    /// experts computed on the host, routed experts with a prediction, of
    /// them predicted, experts copied ahead, hits on those.
    experts: [Counter; 9],
    /// Their totals seen last.
    experts_last: Mutex<[u64; 9]>,
    /// Seconds the device waited on the host for experts.
    experts_host_seconds: FloatGauge,
}

impl Metrics {
    /// Metrics of a server of `model_name`.
    pub fn new(model_name: &str) -> Self {
        let labels = [(
            Cow::Borrowed("model_name"),
            Cow::Owned(model_name.to_string()),
        )];
        let mut registry = Registry::with_labels(labels.into_iter());
        let m = Metrics {
            running: Gauge::default(),
            waiting: Gauge::default(),
            kv_usage: FloatGauge::default(),
            kv_usage_old: FloatGauge::default(),
            prefix_queries: Counter::default(),
            prefix_hits: Counter::default(),
            prompt_tokens: Counter::default(),
            generation_tokens: Counter::default(),
            success: Family::default(),
            ttft: Histogram::new(TTFT_BUCKETS),
            itl: Histogram::new(ITL_BUCKETS),
            itl_old: Histogram::new(ITL_BUCKETS),
            e2e: Histogram::new(E2E_BUCKETS),
            cache_config: Family::default(),
            kv_free: Gauge::default(),
            kv_total: Gauge::default(),
            preemptions: Counter::default(),
            steps: Counter::default(),
            prefill_tokens: Counter::default(),
            decode_tokens: Counter::default(),
            cancelled: Counter::default(),
            rejected: Family::default(),
            loaded: Gauge::default(),
            last: Mutex::new([0; 6]),
            experts: Default::default(),
            experts_last: Mutex::new([0; 9]),
            experts_host_seconds: FloatGauge::default(),
            registry: Registry::default(),
        };
        let r = &mut registry;
        r.register(
            "vllm:num_requests_running",
            "Requests in the running batch",
            m.running.clone(),
        );
        r.register(
            "vllm:num_requests_waiting",
            "Requests waiting to be scheduled (new or preempted)",
            m.waiting.clone(),
        );
        r.register(
            "vllm:kv_cache_usage_perc",
            "Fraction of K/V cache blocks in use (0..1)",
            m.kv_usage.clone(),
        );
        r.register(
            "vllm:gpu_cache_usage_perc",
            "Fraction of K/V cache blocks in use (0..1; older name)",
            m.kv_usage_old.clone(),
        );
        r.register(
            "vllm:prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache",
            m.prefix_queries.clone(),
        );
        r.register(
            "vllm:prefix_cache_hits",
            "Prompt tokens found in the prefix cache",
            m.prefix_hits.clone(),
        );
        r.register(
            "vllm:prompt_tokens",
            "Prompt tokens of finished requests",
            m.prompt_tokens.clone(),
        );
        r.register(
            "vllm:generation_tokens",
            "Tokens generated",
            m.generation_tokens.clone(),
        );
        r.register(
            "vllm:request_success",
            "Requests finished, by reason",
            m.success.clone(),
        );
        r.register(
            "vllm:time_to_first_token_seconds",
            "Time from arrival to the first token",
            m.ttft.clone(),
        );
        r.register(
            "vllm:inter_token_latency_seconds",
            "Time between output tokens",
            m.itl.clone(),
        );
        r.register(
            "vllm:time_per_output_token_seconds",
            "Time between output tokens (older name)",
            m.itl_old.clone(),
        );
        r.register(
            "vllm:e2e_request_latency_seconds",
            "Time from arrival to the last token",
            m.e2e.clone(),
        );
        r.register(
            "vllm:cache_config_info",
            "K/V cache configuration (labels; value 1)",
            m.cache_config.clone(),
        );
        r.register(
            "hearth_kv_blocks_free",
            "K/V blocks free (cached free blocks included)",
            m.kv_free.clone(),
        );
        r.register(
            "hearth_kv_blocks",
            "K/V blocks in the pool",
            m.kv_total.clone(),
        );
        r.register(
            "hearth_preemptions",
            "Requests preempted (recomputed later) for lack of K/V blocks",
            m.preemptions.clone(),
        );
        r.register(
            "hearth_steps",
            "Engine steps that ran a forward pass",
            m.steps.clone(),
        );
        r.register(
            "hearth_prefill_tokens",
            "Prompt (and recomputed) tokens run through the model",
            m.prefill_tokens.clone(),
        );
        r.register(
            "hearth_decode_tokens",
            "Generated tokens fed back through the model",
            m.decode_tokens.clone(),
        );
        r.register(
            "hearth_requests_cancelled",
            "Requests cancelled because their client went away",
            m.cancelled.clone(),
        );
        r.register(
            "hearth_requests_rejected",
            "Requests refused before they ran, by reason",
            m.rejected.clone(),
        );
        r.register(
            "hearth_model_loaded",
            "1 once the model is loaded and serving",
            m.loaded.clone(),
        );
        let expert_help = [
            (
                "hearth_expert_cache_hits",
                "Routed experts found in a device slot (once per layer step)",
            ),
            (
                "hearth_expert_cache_misses",
                "Routed experts not in a device slot",
            ),
            (
                "hearth_expert_cache_copies",
                "Misses copied into a device slot",
            ),
            (
                "hearth_expert_cache_bytes_copied",
                "Bytes copied into device slots",
            ),
            (
                "hearth_expert_cache_host_experts",
                "Routed experts computed on the host",
            ),
            (
                "hearth_expert_cache_predicted",
                "Routed experts of layer steps whose experts the layer before predicted",
            ),
            (
                "hearth_expert_cache_predicted_right",
                "Routed experts the prediction named",
            ),
            (
                "hearth_expert_cache_prefetched",
                "Experts copied into a slot ahead, on a prediction",
            ),
            (
                "hearth_expert_cache_prefetch_hits",
                "Hits on experts copied ahead",
            ),
        ];
        for ((name, help), c) in expert_help.into_iter().zip(&m.experts) {
            r.register(name, help, c.clone());
        }
        r.register(
            "hearth_expert_cache_host_seconds",
            "Seconds the device waited on the host for experts (staging copies, host experts)",
            m.experts_host_seconds.clone(),
        );
        Metrics { registry, ..m }
    }

    /// Brings the expert-cache counters up to `s` (the model's totals).
    pub fn observe_experts(&self, s: &ExpertStats) {
        let now = [
            s.hits,
            s.misses,
            s.copies,
            s.bytes_copied,
            s.host_experts,
            s.predicted,
            s.predicted_right,
            s.prefetched,
            s.prefetch_hits,
        ];
        let Ok(mut last) = self.experts_last.lock() else {
            return;
        };
        for ((c, now), then) in self.experts.iter().zip(now).zip(last.iter()) {
            c.inc_by(now.saturating_sub(*then));
        }
        *last = now;
        self.experts_host_seconds.set(s.host_seconds);
    }

    /// Records the K/V cache layout and marks the model loaded.
    pub fn set_loaded(&self, block_size: usize, num_blocks: usize) {
        let labels = vec![
            ("block_size".to_string(), block_size.to_string()),
            ("num_gpu_blocks".to_string(), num_blocks.to_string()),
            ("enable_prefix_caching".to_string(), "True".to_string()),
        ];
        self.cache_config.get_or_create(&labels).set(1);
        self.loaded.set(1);
    }

    /// Brings the gauges and counters up to the engine's state.
    pub fn observe_engine(&self, s: &EngineStats) {
        let q = &s.sched;
        self.running.set(q.num_running as i64);
        self.waiting.set(q.num_waiting as i64);
        let used = q.num_usable_blocks.saturating_sub(q.num_free_blocks);
        let usage = used as f64 / q.num_usable_blocks.max(1) as f64;
        self.kv_usage.set(usage);
        self.kv_usage_old.set(usage);
        self.kv_free.set(q.num_free_blocks as i64);
        self.kv_total.set(q.num_usable_blocks as i64);
        let now = [
            q.prefix.queried_tokens,
            q.prefix.hit_tokens,
            q.num_preemptions,
            s.steps,
            s.prefill_tokens,
            s.decode_tokens,
        ];
        let counters = [
            &self.prefix_queries,
            &self.prefix_hits,
            &self.preemptions,
            &self.steps,
            &self.prefill_tokens,
            &self.decode_tokens,
        ];
        let Ok(mut last) = self.last.lock() else {
            return;
        };
        for ((c, now), then) in counters.iter().zip(now).zip(last.iter()) {
            c.inc_by(now.saturating_sub(*then));
        }
        *last = now;
    }

    /// A request's first token, `seconds` after it arrived.
    pub fn first_token(&self, seconds: f64) {
        self.ttft.observe(seconds);
        self.generation_tokens.inc();
    }

    /// A later token, `seconds` after the one before.
    pub fn inter_token(&self, seconds: f64) {
        self.itl.observe(seconds);
        self.itl_old.observe(seconds);
        self.generation_tokens.inc();
    }

    /// A request ended.
    pub fn finished(&self, reason: FinishReason, usage: &Usage, e2e_seconds: f64) {
        let name = match reason {
            FinishReason::Stop | FinishReason::StopString => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "abort",
            FinishReason::Error => "error",
        };
        let labels = vec![("finished_reason".to_string(), name.to_string())];
        self.success.get_or_create(&labels).inc();
        self.prompt_tokens.inc_by(usage.prompt_tokens as u64);
        self.e2e.observe(e2e_seconds);
    }

    /// A request cancelled because its client disconnected.
    pub fn cancelled(&self) {
        self.cancelled.inc();
    }

    /// A request refused before it ran (`invalid`, `busy`, `too_large`,
    /// `unauthorized`, `loading`).
    pub fn rejected(&self, reason: &str) {
        let labels = vec![("reason".to_string(), reason.to_string())];
        self.rejected.get_or_create(&labels).inc();
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expert_cache_counters_advance_by_the_difference() {
        let m = Metrics::new("m");
        let mut s = ExpertStats {
            hits: 5,
            misses: 2,
            copies: 1,
            bytes_copied: 300,
            host_experts: 1,
            host_seconds: 0.25,
            predicted: 8,
            predicted_right: 6,
            ..ExpertStats::default()
        };
        m.observe_experts(&s);
        s.hits = 9;
        s.predicted_right = 7;
        m.observe_experts(&s);
        let text = m.render();
        for line in [
            "hearth_expert_cache_hits_total{model_name=\"m\"} 9",
            "hearth_expert_cache_misses_total{model_name=\"m\"} 2",
            "hearth_expert_cache_predicted_right_total{model_name=\"m\"} 7",
            "hearth_expert_cache_bytes_copied_total{model_name=\"m\"} 300",
            "hearth_expert_cache_host_seconds{model_name=\"m\"} 0.25",
        ] {
            assert!(text.contains(line), "{line} not in\n{text}");
        }
    }
}
