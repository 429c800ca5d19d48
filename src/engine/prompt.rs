//! Prompts to token ids, as llama.cpp tokenizes them.

use super::request::Prompt;
use super::EngineError;
use crate::model::chat::{ChatError, ChatMessage, ChatTemplate};
use crate::model::tokenizer::Tokenizer;

/// Tokenizes `prompt` (see [`Prompt`] for each kind's rules). Checks ids
/// against `n_vocab` and rejects an empty result.
pub(crate) fn tokenize_prompt(
    prompt: &Prompt,
    tokenizer: &Tokenizer,
    template: Option<&ChatTemplate>,
    n_vocab: usize,
) -> crate::Result<Vec<u32>> {
    let ids = match prompt {
        Prompt::Text(text) if text.is_empty() => Vec::new(),
        Prompt::Text(text) => tokenizer.encode(text, true, false)?,
        Prompt::Tokens(ids) => ids.clone(),
        Prompt::Chat(messages) => chat_ids(messages, None, tokenizer, template)?,
        Prompt::ChatWithTools { messages, tools } => {
            chat_ids(messages, Some(tools), tokenizer, template)?
        }
    };
    if ids.is_empty() {
        return Err(EngineError::EmptyPrompt.into());
    }
    if let Some(&token) = ids.iter().find(|&&t| t as usize >= n_vocab) {
        return Err(EngineError::TokenOutOfVocab { token, n_vocab }.into());
    }
    Ok(ids)
}

/// A conversation rendered with the template (opening the assistant's
/// turn) and tokenized with special tokens parsed.
fn chat_ids(
    messages: &[ChatMessage],
    tools: Option<&[serde_json::Value]>,
    tokenizer: &Tokenizer,
    template: Option<&ChatTemplate>,
) -> crate::Result<Vec<u32>> {
    let template = template.ok_or(ChatError::NoTemplate)?;
    let text = template.render_with_tools(messages, tools, true)?;
    let text = strip_added_specials(&text, tokenizer, template);
    Ok(tokenizer.encode(text, true, true)?)
}

/// llama.cpp's `common_chat_template_direct_apply`: when the tokenizer adds
/// BOS (EOS) itself, a BOS (EOS) text the template printed at the start
/// (end) is removed so it is not doubled.
fn strip_added_specials<'a>(
    text: &'a str,
    tokenizer: &Tokenizer,
    template: &ChatTemplate,
) -> &'a str {
    let (add_bos, add_eos) = tokenizer.adds_bos_eos();
    let mut text = text;
    let bos = template.bos_token();
    if add_bos && !bos.is_empty() {
        text = text.strip_prefix(bos).unwrap_or(text);
    }
    let eos = template.eos_token();
    if add_eos && !eos.is_empty() {
        text = text.strip_suffix(eos).unwrap_or(text);
    }
    text
}
