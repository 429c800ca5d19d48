//! `wasm-bindgen --target web --out-dir DIR [--out-name NAME] INPUT.wasm`:
//! the one invocation Hearth's browser builds make, with the same options
//! wasm-bindgen-cli 0.2.130 passes to its library for it (so the output is the
//! CLI's, byte for byte). `--version` prints `wasm-bindgen 0.2.130` as the CLI
//! does.

use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use wasm_bindgen_cli_support::Bindgen;

/// The library version this tool is built against (Cargo.toml pins it).
const VERSION: &str = "0.2.130";

/// What the command line asked for.
struct Args {
    input: PathBuf,
    out_dir: PathBuf,
    out_name: Option<String>,
}

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let Some(args) = parse(std::env::args().skip(1))? else {
        println!("wasm-bindgen {VERSION}");
        return Ok(());
    };
    let mut b = Bindgen::new();
    b.web(true)?;
    // The CLI's defaults, set explicitly as it sets them (Bindgen::new()'s own
    // defaults differ for some, e.g. omit_default_module_path).
    #[allow(deprecated)] // reference_types(false), as the CLI passes it
    b.input_path(&args.input)
        .debug(false)
        .demangle(true)
        .keep_lld_exports(false)
        .keep_debug(false)
        .split_debug_info(false)
        .remove_name_section(false)
        .remove_producers_section(false)
        .typescript(true)
        .omit_imports(false)
        .omit_default_module_path(false)
        .split_linked_modules(false)
        .js_string_builtins(false)
        .ts_typed_array_buffers(false)
        .reference_types(false)
        .reset_state_function(false)
        .force_enable_abort_handler(false);
    if let Some(name) = &args.out_name {
        b.out_name(name);
    }
    b.generate(&args.out_dir)
        .with_context(|| format!("wasm-bindgen of {}", args.input.display()))
}

/// Parses the supported arguments; `None` for `--version`.
fn parse(mut it: impl Iterator<Item = String>) -> Result<Option<Args>> {
    let (mut input, mut out_dir, mut out_name, mut target) = (None, None, None, None);
    while let Some(arg) = it.next() {
        let mut value = |flag: &str| it.next().with_context(|| format!("{flag} needs a value"));
        match arg.as_str() {
            "--version" | "-V" => return Ok(None),
            "--target" => target = Some(value("--target")?),
            "--out-dir" => out_dir = Some(PathBuf::from(value("--out-dir")?)),
            "--out-name" => out_name = Some(value("--out-name")?),
            flag if flag.starts_with('-') => bail!(
                "unsupported option {flag}: this wasm-bindgen takes only --target web, --out-dir, \
                 --out-name and the input (install wasm-bindgen-cli {VERSION} for the others)"
            ),
            path if input.is_none() => input = Some(PathBuf::from(path)),
            extra => bail!("unexpected argument {extra}: give one input module"),
        }
    }
    if target.as_deref() != Some("web") {
        bail!("pass --target web (the only target the browser builds use)");
    }
    Ok(Some(Args {
        input: input.context("no input module given")?,
        out_dir: out_dir.context("--out-dir is required")?,
        out_name,
    }))
}
