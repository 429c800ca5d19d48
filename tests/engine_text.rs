//! Output text: stop strings matched across token boundaries, held-back
//! text, UTF-8 characters split across byte tokens, end-of-generation tokens.

mod engine_support;

use engine_support::{assert_pool_full, engine, run_all, script_rule, small_config, synthetic};
use hearth::engine::{FinishReason, GenerateRequest, Prompt};
use hearth::sample::SamplingParams;

const PROMPT: [u32; 4] = [1, 300, 301, 302];

/// Runs PROMPT with the model scripted to emit `script` (then `filler`).
fn run_script(
    script: Vec<u32>,
    filler: u32,
    edit: impl FnOnce(&mut GenerateRequest),
) -> engine_support::Outcome {
    let mut e = engine(
        small_config(64, 32),
        script_rule(PROMPT.len(), script, filler),
    );
    let mut req = GenerateRequest::new(Prompt::Tokens(PROMPT.to_vec()));
    req.sampling = SamplingParams::greedy();
    req.max_tokens = Some(30);
    edit(&mut req);
    let id = e.add_request(req).expect("add");
    let mut all = run_all(&mut e);
    assert_pool_full(&e);
    all.remove(&id).expect("outcome")
}

fn piece(tok: &hearth::model::tokenizer::Tokenizer, id: u32) -> String {
    String::from_utf8(tok.token_to_piece(id, false)).expect("utf8 piece")
}

#[test]
fn stop_string_across_token_boundaries_cuts_the_output() {
    let (_, tok) = synthetic();
    let script = tok
        .encode("the cat sat on the mat", false, false)
        .expect("encode");
    let pieces: Vec<String> = script.iter().map(|&t| piece(&tok, t)).collect();
    let full = pieces.concat();
    let stop = "t on t";
    let at = full.find(stop).expect("stop in text");
    assert!(
        pieces.iter().all(|p| !p.contains(stop)),
        "the stop string must span tokens: {pieces:?}"
    );
    let o = run_script(script.clone(), 300, |r| {
        r.stop = vec![stop.into(), "zzz".into()]
    });
    assert_eq!(o.reason, Some(FinishReason::StopString));
    assert_eq!(o.text(), full[..at], "pieces {pieces:?}");
    // The request ended on the token completing the match, not later.
    let end = (1..=script.len())
        .find(|&n| {
            script[..n]
                .iter()
                .map(|&t| piece(&tok, t))
                .collect::<String>()
                .contains(stop)
        })
        .expect("match end");
    assert_eq!(o.tokens, script[..end]);
    // No event ever released text of the stop string.
    let mut released = String::new();
    for t in &o.texts {
        released.push_str(t);
        assert!(
            full[..at].starts_with(&released),
            "released {released:?} past the cut"
        );
    }
}

#[test]
fn held_back_false_start_is_released_at_the_end() {
    let (_, tok) = synthetic();
    let script = tok.encode("the cat", false, false).expect("encode");
    let full: String = script.iter().map(|&t| piece(&tok, t)).collect();
    // " cat" ends with "t", the first character of the stop string: held
    // until the request ends by length.
    let o = run_script(script.clone(), 300, |r| {
        r.stop = vec!["t!".into()];
        r.max_tokens = Some(script.len());
    });
    assert_eq!(o.reason, Some(FinishReason::Length));
    assert_eq!(o.text(), full);
    let last = o.texts.last().expect("a token");
    assert!(
        last.ends_with('t'),
        "held text comes with the last token: {:?}",
        o.texts
    );
}

#[test]
fn utf8_split_across_byte_tokens_streams_whole_characters() {
    let text = "é€😀";
    // Byte tokens <0x00>..<0xFF> are ids 3..258.
    let script: Vec<u32> = text.bytes().map(|b| 3 + u32::from(b)).collect();
    let o = run_script(script.clone(), 300, |r| r.max_tokens = Some(script.len()));
    assert_eq!(o.text(), text);
    assert_eq!(o.texts, ["", "é", "", "", "€", "", "", "", "😀"]);
}

#[test]
fn end_of_generation_token_stops_unless_ignored() {
    let script = vec![300, 301, 302, 2, 303];
    let o = run_script(script.clone(), 304, |_| {});
    assert_eq!(o.reason, Some(FinishReason::Stop));
    assert_eq!(
        o.tokens,
        [300, 301, 302, 2],
        "the EOS token is the last one reported"
    );
    assert_eq!(
        o.texts.last().map(String::as_str),
        Some(""),
        "EOS renders no text"
    );
    assert_eq!(o.usage.expect("usage").generated_tokens, 4);

    let o = run_script(script, 304, |r| {
        r.ignore_eos = true;
        r.max_tokens = Some(6);
    });
    assert_eq!(o.reason, Some(FinishReason::Length));
    assert_eq!(o.tokens, [300, 301, 302, 2, 303, 304]);
}

#[test]
fn end_of_turn_token_stops_too() {
    // 511 <|im_end|> is the synthetic vocabulary's EOT.
    let o = run_script(vec![300, 511, 301], 302, |_| {});
    assert_eq!(o.reason, Some(FinishReason::Stop));
    assert_eq!(o.tokens, [300, 511]);
}
