//! The `hearth` command line: run, chat with, serve, inspect, tokenize and
//! quantize GGUF models.

mod cmd;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Run GGUF language models on the hardware you have.
#[derive(Parser)]
#[command(name = "hearth", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Write a Perfetto trace of the run to FILE (open it at
    /// https://ui.perfetto.dev): loading, scheduler steps, requests, each
    /// op on the host and each kernel on the GPU.
    #[arg(long, global = true, env = "HEARTH_TRACE", value_name = "FILE")]
    trace: Option<std::path::PathBuf>,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt, streaming it to stdout.
    Run(cmd::run::Args),
    /// Chat with a model on stdin/stdout, using its chat template.
    Chat(cmd::chat::Args),
    /// Serve a model over HTTP with OpenAI's API (chat, completions, streaming).
    Serve(Box<cmd::serve::Args>),
    /// Write the logits of every position of a token sequence to a file.
    Logits(cmd::logits::Args),
    /// Describe a model: architecture, shapes, tokenizer, tensor types, memory.
    Info(cmd::info::Args),
    /// Turn text into token ids as the model's tokenizer does.
    Tokenize(cmd::tokenize::Args),
    /// Write a copy of a model with its weights in another format.
    Quantize(cmd::quantize::Args),
    /// Write a model of a real model's shape with random weights, for benchmarks.
    Synth(Box<cmd::synth::Args>),
    /// Measure prefill and decode tokens/s (like llama-bench) and memory bandwidth.
    Bench(Box<cmd::bench::Args>),
    /// Measure this machine's per-device kernel choices for a model and store them.
    Tune(cmd::tune::Args),
}

fn main() -> ExitCode {
    restore_sigpipe();
    let cli = Cli::parse();
    if cli.trace.is_some() {
        cmd::trace::start();
    }
    let result = match cli.command {
        Command::Run(args) => cmd::run::run(args),
        Command::Chat(args) => cmd::chat::run(args),
        Command::Serve(args) => cmd::serve::run(*args),
        Command::Logits(args) => cmd::logits::run(args),
        Command::Info(args) => cmd::info::run(args),
        Command::Tokenize(args) => cmd::tokenize::run(args),
        Command::Quantize(args) => cmd::quantize::run(args),
        Command::Synth(args) => cmd::synth::run(*args),
        Command::Bench(args) => cmd::bench::run(*args),
        Command::Tune(args) => cmd::tune::run(args),
    };
    let result = match (&cli.trace, result) {
        (Some(path), result) => cmd::trace::finish(path).and(result),
        (None, result) => result,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // One line: the error and its causes, outermost first.
            let chain: Vec<String> = err.chain().map(|e| e.to_string()).collect();
            eprintln!("error: {}", chain.join(": "));
            ExitCode::FAILURE
        }
    }
}

/// Lets a closed pipe end the process quietly (`hearth info M | head`), as
/// it ends other command-line tools, instead of a panic in `println!`.
fn restore_sigpipe() {
    #[cfg(unix)]
    // SAFETY: called first thing in main, before any thread exists; SIG_DFL
    // is a valid disposition for SIGPIPE.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}
