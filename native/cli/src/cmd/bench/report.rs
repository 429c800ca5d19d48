//! The results of `hearth bench`: a table on stdout as they come, or one
//! JSON object per line.

use std::io::Write;

use anyhow::Result;
use hearth::gguf::GgufModel;
use serde_json::json;

use super::membw::Bandwidth;

/// What the results say about a model file.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    /// File name without `.gguf`.
    pub name: String,
    /// Bytes of all its tensors (llama-bench's `model_size`).
    pub bytes: u64,
    /// Weight bytes one decode step reads: every tensor, except a token
    /// embedding table that is not also the output projection (a step reads
    /// one row of it).
    pub read_per_token: u64,
}

impl ModelInfo {
    /// The sizes of `gguf`'s tensors.
    pub fn new(name: String, gguf: &GgufModel) -> Self {
        let size_of = |want: &str| gguf.tensors.iter().find(|t| t.name == want).map(|t| t.size);
        let bytes: u64 = gguf.tensors.iter().map(|t| t.size).sum();
        let untied_embd = match (size_of("token_embd.weight"), size_of("output.weight")) {
            (Some(embd), Some(_)) => embd,
            _ => 0,
        };
        ModelInfo {
            name,
            bytes,
            read_per_token: bytes - untied_embd,
        }
    }
}

/// One measured test.
#[derive(Debug)]
pub struct Row<'a> {
    /// The model.
    pub model: &'a ModelInfo,
    /// `--backend`.
    pub backend: &'a str,
    /// The CPU kernels' instruction set (the device name elsewhere).
    pub isa: String,
    /// The backend's own name for itself (`cpu avx512 x2`).
    pub device: &'a str,
    /// Threads.
    pub threads: usize,
    /// `pp512`, `tg128`.
    pub test: String,
    /// Whether the test is decode (it then has an effective bandwidth).
    pub decode: bool,
    /// Sequences decoded together (1 for prefill and batch-1 decode).
    pub seqs: usize,
    /// Tokens/s of each timed repetition.
    pub samples_tps: Vec<f64>,
}

impl Row<'_> {
    /// Mean tokens/s.
    pub fn tps(&self) -> f64 {
        mean(&self.samples_tps)
    }

    /// Effective read bandwidth of decode: weight bytes per step times
    /// steps/s (a step decodes one token of each of `seqs` sequences), in
    /// GB/s (1e9 bytes).
    pub fn gbps(&self) -> Option<f64> {
        self.decode
            .then(|| self.model.read_per_token as f64 * self.tps() / self.seqs.max(1) as f64 / 1e9)
    }

    /// The JSON line.
    pub fn json(&self) -> serde_json::Value {
        let mut v = json!({
            "model": self.model.name,
            "test": self.test,
            "threads": self.threads,
            "seqs": self.seqs,
            "tps": self.tps(),
            "tps_stddev": stddev(&self.samples_tps),
            "backend": self.backend,
            "isa": self.isa,
            "device": self.device,
            "model_bytes": self.model.bytes,
            "reps": self.samples_tps.len(),
            "samples_tps": self.samples_tps,
        });
        if let Some(gbps) = self.gbps() {
            v["read_bytes_per_token"] = json!(self.model.read_per_token);
            v["gbps"] = json!(gbps);
        }
        v
    }
}

/// Writes results to stdout as they come.
pub struct Reporter {
    json: bool,
    model_width: usize,
    header_done: bool,
    bandwidth: Vec<Bandwidth>,
}

impl Reporter {
    /// A reporter for `models` (their names size the table's first column).
    pub fn new(json: bool, models: &[String]) -> Self {
        let model_width = models.iter().map(String::len).max().unwrap_or(0).max(5);
        Reporter {
            json,
            model_width,
            header_done: false,
            bandwidth: Vec::new(),
        }
    }

    /// Reports a memory bandwidth measurement.
    pub fn membw(&mut self, bw: &Bandwidth) -> Result<()> {
        let mut out = std::io::stdout().lock();
        if self.json {
            writeln!(out, "{}", bw.json())?;
        } else {
            writeln!(
                out,
                "memory read bandwidth, {} thread{}: {:.1} ± {:.1} GB/s (best {:.1}; {} MiB buffer, {} reps, {})",
                bw.threads,
                if bw.threads == 1 { "" } else { "s" },
                mean(&bw.samples_gbps),
                stddev(&bw.samples_gbps),
                bw.best(),
                bw.bytes >> 20,
                bw.samples_gbps.len(),
                bw.pattern
            )?;
        }
        self.bandwidth.push(bw.clone());
        Ok(())
    }

    /// Reports one test's result.
    pub fn row(&mut self, row: &Row<'_>) -> Result<()> {
        let mut out = std::io::stdout().lock();
        if self.json {
            writeln!(out, "{}", row.json())?;
            return Ok(());
        }
        let w = self.model_width;
        if !self.header_done {
            self.header_done = true;
            writeln!(
                out,
                "| {:w$} | {:>10} | {:>7} | {:>7} | {:>7} | {:>7} | {:>18} | {:>13} |",
                "model", "size", "backend", "isa", "threads", "test", "t/s", "GB/s"
            )?;
            writeln!(
                out,
                "| {:-<w$} | {:->10} | {:->7} | {:->7} | {:->7} | {:->7} | {:->18} | {:->13} |",
                "", "", "", "", "", "", "", ""
            )?;
        }
        let tps = format!("{:.2} ± {:.2}", row.tps(), stddev(&row.samples_tps));
        let gbps = row
            .gbps()
            .map_or(String::new(), |g| self.gbps_cell(g, row.threads));
        writeln!(
            out,
            "| {:w$} | {:>10} | {:>7} | {:>7} | {:>7} | {:>7} | {:>18} | {:>13} |",
            row.model.name,
            super::super::human_bytes(row.model.bytes),
            row.backend,
            row.isa,
            row.threads,
            row.test,
            tps,
            gbps
        )?;
        out.flush()?;
        Ok(())
    }

    /// `4.61`, or `4.61 (23%)` of the best bandwidth measured at `threads`
    /// (the ceiling; the best repetition is the one a busy machine hurt least).
    fn gbps_cell(&self, gbps: f64, threads: usize) -> String {
        match self.bandwidth.iter().find(|b| b.threads == threads) {
            Some(bw) => format!("{gbps:.2} ({:.0}%)", 100.0 * gbps / bw.best()),
            None => format!("{gbps:.2}"),
        }
    }

    /// Ends the report.
    pub fn finish(self) -> Result<()> {
        std::io::stdout().lock().flush()?;
        Ok(())
    }
}

/// The mean (0 for none).
pub fn mean(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    xs.iter().sum::<f64>() / xs.len() as f64
}

/// The sample standard deviation (n - 1; 0 below two values), as llama-bench.
pub fn stddev(xs: &[f64]) -> f64 {
    if xs.len() < 2 {
        return 0.0;
    }
    let m = mean(xs);
    let var = xs.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (xs.len() - 1) as f64;
    var.sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_and_sample_stddev() {
        assert_eq!(mean(&[]), 0.0);
        assert_eq!(stddev(&[3.0]), 0.0);
        assert!((mean(&[2.0, 4.0, 9.0]) - 5.0).abs() < 1e-12);
        // Deviations -3, -1, 4: squares sum to 26, over n - 1 = 2.
        assert!((stddev(&[2.0, 4.0, 9.0]) - 13f64.sqrt()).abs() < 1e-12);
    }
}
