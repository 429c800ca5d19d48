//! Prints ptxas's report (registers, stack, spills) on the kernels whose
//! names contain the first argument, for sm_90 (the second argument, e.g.
//! 80, picks another), from the backend's modules or, with a third
//! argument, from that file composed after common.cuh and quant.cuh.
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let want = args.get(1).cloned().unwrap_or_default();
    let sm: u32 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(90);
    let arch = hearth_cuda::compile::Arch {
        major: sm / 10,
        minor: sm % 10,
    };
    let sources: Vec<(String, String)> = match args.get(3) {
        Some(path) => {
            let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shaders/cuda/");
            let read = |p: &str| std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{p}: {e}"));
            let src =
                read(&format!("{dir}common.cuh")) + &read(&format!("{dir}quant.cuh")) + &read(path);
            vec![("file".into(), src)]
        }
        None => hearth_cuda::sources::MODULES
            .iter()
            .map(|m| (m.name.to_string(), m.source.to_string()))
            .collect(),
    };
    for (name, source) in sources {
        let (_, log) = match hearth_cuda::compile::compile_verbose(&name, &source, arch) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("{e}");
                std::process::exit(1);
            }
        };
        let mut show = false;
        for l in log.lines() {
            if l.contains("Compiling entry function") || l.contains("Function properties for") {
                show = l.contains(&want);
            }
            if show && !l.contains("Compile time") {
                println!("{l}");
            }
        }
    }
}
