//! Built-in chat formats for models whose GGUF carries no template.
//!
//! Each reproduces the llama.cpp built-in of the same name byte for byte
//! (`llm_chat_apply_template` in `src/llama-chat.cpp`, llama.cpp 0.3.36). Like
//! llama.cpp's, none of them writes the BOS token: the tokenizer adds it.

use super::ChatMessage;

/// A built-in chat format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Builtin {
    /// `<|im_start|>role\ncontent<|im_end|>\n` (SmolLM, Qwen, many others).
    ChatMl,
    /// Llama 3 headers; contents trimmed.
    Llama3,
    /// Gemma turns; system text folded into the next user turn, `assistant` → `model`.
    Gemma,
}

/// The built-in names, in the order error messages list them.
pub(crate) const BUILTIN_NAMES: [&str; 3] = ["chatml", "llama3", "gemma"];

impl Builtin {
    /// The format called `name`, if there is one.
    pub fn from_name(name: &str) -> Option<Builtin> {
        match name {
            "chatml" => Some(Builtin::ChatMl),
            "llama3" => Some(Builtin::Llama3),
            "gemma" => Some(Builtin::Gemma),
            _ => None,
        }
    }

    /// The name [`Builtin::from_name`] accepts for this format.
    pub fn name(self) -> &'static str {
        match self {
            Builtin::ChatMl => "chatml",
            Builtin::Llama3 => "llama3",
            Builtin::Gemma => "gemma",
        }
    }

    /// The prompt text for `messages`; `add_assistant` opens the assistant turn.
    pub fn render(self, messages: &[ChatMessage], add_assistant: bool) -> String {
        match self {
            Builtin::ChatMl => chatml(messages, add_assistant),
            Builtin::Llama3 => llama3(messages, add_assistant),
            Builtin::Gemma => gemma(messages, add_assistant),
        }
    }
}

/// llama.cpp's `trim`: strips the bytes C `isspace` accepts (ASCII only).
fn trim_c(s: &str) -> &str {
    s.trim_matches(|c: char| matches!(c, ' ' | '\t' | '\n' | '\u{b}' | '\u{c}' | '\r'))
}

fn chatml(messages: &[ChatMessage], add_assistant: bool) -> String {
    let mut out = String::new();
    for m in messages {
        out.push_str(&format!(
            "<|im_start|>{}\n{}<|im_end|>\n",
            m.role, m.content
        ));
    }
    if add_assistant {
        out.push_str("<|im_start|>assistant\n");
    }
    out
}

fn llama3(messages: &[ChatMessage], add_assistant: bool) -> String {
    let mut out = String::new();
    for m in messages {
        out.push_str(&format!(
            "<|start_header_id|>{}<|end_header_id|>\n\n{}<|eot_id|>",
            m.role,
            trim_c(&m.content)
        ));
    }
    if add_assistant {
        out.push_str("<|start_header_id|>assistant<|end_header_id|>\n\n");
    }
    out
}

/// Gemma has no system role: system texts (trimmed, concatenated) wait and
/// open the next non-model turn, followed by a blank line.
fn gemma(messages: &[ChatMessage], add_assistant: bool) -> String {
    let mut out = String::new();
    let mut system = String::new();
    for m in messages {
        if m.role == "system" {
            system.push_str(trim_c(&m.content));
            continue;
        }
        let role = if m.role == "assistant" {
            "model"
        } else {
            m.role.as_str()
        };
        out.push_str("<start_of_turn>");
        out.push_str(role);
        out.push('\n');
        if !system.is_empty() && role != "model" {
            out.push_str(&system);
            out.push_str("\n\n");
            system.clear();
        }
        out.push_str(trim_c(&m.content));
        out.push_str("<end_of_turn>\n");
    }
    if add_assistant {
        out.push_str("<start_of_turn>model\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msgs(pairs: &[(&str, &str)]) -> Vec<ChatMessage> {
        pairs.iter().map(|&(r, c)| ChatMessage::new(r, c)).collect()
    }

    #[test]
    fn gemma_holds_system_text_past_model_turns() {
        // A system message before an assistant turn waits for the next user turn.
        let m = msgs(&[
            ("system", " A "),
            ("assistant", "hi"),
            ("system", "B\n"),
            ("user", " q "),
        ]);
        assert_eq!(
            Builtin::Gemma.render(&m, false),
            "<start_of_turn>model\nhi<end_of_turn>\n<start_of_turn>user\nAB\n\nq<end_of_turn>\n"
        );
    }

    #[test]
    fn trims_only_ascii_whitespace() {
        // U+00A0 is not C whitespace, so llama.cpp keeps it.
        let m = msgs(&[("user", "\u{a0}x \n")]);
        assert_eq!(
            Builtin::Llama3.render(&m, false),
            "<|start_header_id|>user<|end_header_id|>\n\n\u{a0}x<|eot_id|>"
        );
    }

    #[test]
    fn chatml_keeps_content_verbatim() {
        let m = msgs(&[("user", " x \n")]);
        assert_eq!(
            Builtin::ChatMl.render(&m, true),
            "<|im_start|>user\n x \n<|im_end|>\n<|im_start|>assistant\n"
        );
    }
}
