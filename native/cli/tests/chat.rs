//! `hearth chat`: turns on stdin, replies on stdout, the conversation kept
//! (later turns reuse the earlier turns' K/V through the prefix cache).

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

fn chat(args: &[&str], stdin: &str) -> (bool, String, String) {
    let model = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/llamacpp/synthetic/models/llama-Q8_0.gguf");
    let mut child = Command::new(env!("CARGO_BIN_EXE_hearth"))
        .arg("chat")
        .arg("-m")
        .arg(&model)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run hearth chat");
    // The child may exit before reading its input (a missing template is
    // reported before loading): a broken pipe here is not the test's failure.
    let written = child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes());
    if let Err(e) = written {
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "write stdin: {e}");
    }
    let out = child.wait_with_output().expect("wait");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `[P prompt tokens (C cached), G generated, ...]` lines of stderr.
fn turn_stats(stderr: &str) -> Vec<(usize, usize, usize)> {
    stderr
        .lines()
        .filter_map(|l| {
            let nums: Vec<usize> = l
                .split(|c: char| !c.is_ascii_digit())
                .filter(|s| !s.is_empty())
                .filter_map(|s| s.parse().ok())
                .collect();
            (l.starts_with('[') && nums.len() >= 3).then(|| (nums[0], nums[1], nums[2]))
        })
        .collect()
}

#[test]
fn turns_keep_the_conversation_and_reuse_its_kv() {
    let system = "You are a helpful assistant who answers every question briefly and kindly.";
    let args = [
        "--chat-template",
        "chatml",
        "--system",
        system,
        "--temp",
        "0",
        "-n",
        "6",
    ];
    let (ok, stdout, stderr) = chat(&args, "hello there\nand again\n/exit\nnever read\n");
    assert!(ok, "{stderr}");
    assert_eq!(
        stdout.lines().count(),
        2,
        "one reply line per turn: {stdout:?}"
    );
    let stats = turn_stats(&stderr);
    assert_eq!(stats.len(), 2, "{stderr}");
    let ((p1, _, g1), (p2, c2, _)) = (stats[0], stats[1]);
    assert_eq!(g1, 6);
    assert!(
        p2 > p1 + g1,
        "the second prompt holds the first turn: {stats:?}"
    );
    assert!(
        c2 >= 16 && c2 <= p1 + g1,
        "the first turn's full blocks are reused: {stats:?}"
    );
}

#[test]
fn end_of_input_quits_and_a_missing_template_is_one_error_line() {
    let (ok, stdout, stderr) = chat(
        &["--chat-template", "chatml", "-n", "3", "--seed", "7"],
        "hi\n",
    );
    assert!(ok, "{stderr}");
    assert_eq!(stdout.lines().count(), 1);
    // The synthetic model has no template of its own.
    let (ok, _, stderr) = chat(&[], "hi\n");
    assert!(!ok);
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("--chat-template"), "{stderr}");
}
