//! Chat templates: turning role/content messages into the prompt text a
//! model was trained on.
//!
//! A GGUF model usually carries its template as Jinja source in
//! `tokenizer.chat_template`; [`ChatTemplate::from_metadata`] compiles it once
//! and [`ChatTemplate::render`] fills it per request. Models without one (base
//! models such as Gemma 3 270M) take a built-in format by name
//! ([`ChatTemplate::builtin`]: `chatml`, `llama3`, `gemma`), each identical to
//! llama.cpp's built-in of that name.
//!
//! The rendered text is meant to be tokenized with special tokens parsed.
//! Jinja templates often begin with `bos_token` themselves, while the
//! built-ins never do (the tokenizer adds BOS, as in llama.cpp).

mod builtin;
mod jinja;
mod pyfmt;
mod strftime;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::gguf::Metadata;
use builtin::{Builtin, BUILTIN_NAMES};
use jinja::{JinjaTemplate, RenderVars};

/// Metadata key of the Jinja chat template.
const TEMPLATE_KEY: &str = "tokenizer.chat_template";

/// Errors building or rendering a chat template.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ChatError {
    /// The model has no chat template and none was chosen.
    #[error(
        "the model has no chat template (no `tokenizer.chat_template` in its metadata); \
         pick a built-in one with --chat-template chatml|llama3|gemma \
         (ChatTemplate::builtin), matching the format the model was trained on"
    )]
    NoTemplate,
    /// A built-in template name that does not exist.
    #[error("unknown built-in chat template `{name}`; the built-in templates are: {}", BUILTIN_NAMES.join(", "))]
    UnknownBuiltin {
        /// The name asked for.
        name: String,
    },
    /// The template source does not parse.
    #[error("the chat template does not compile: {detail}; fix the template or pick a built-in one with --chat-template")]
    Syntax {
        /// The parser's message, with the line.
        detail: String,
    },
    /// The template called `raise_exception(message)`: it rejects this
    /// conversation (roles out of order, an unsupported role, ...).
    #[error("the chat template rejected the conversation: {message}")]
    Raised {
        /// The template's own message.
        message: String,
    },
    /// Rendering failed for another reason (a type error in the template,
    /// `strftime_now` without a clock, ...).
    #[error("rendering the chat template failed: {detail}")]
    Render {
        /// The engine's message, with the template line.
        detail: String,
    },
    /// A special token id in the metadata is not in the vocabulary.
    #[error(
        "`{key}` is {id} but the vocabulary (`tokenizer.ggml.tokens`) has {n_tokens} tokens; \
         the GGUF metadata is inconsistent, re-convert the model"
    )]
    BadTokenId {
        /// The metadata key (`tokenizer.ggml.bos_token_id`, ...).
        key: &'static str,
        /// The id it holds.
        id: u64,
        /// The vocabulary size found.
        n_tokens: usize,
    },
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool`, or any role the template knows.
    pub role: String,
    /// The message text.
    pub content: String,
    /// The calls an assistant turn made, in OpenAI's shape
    /// (`[{"id", "type": "function", "function": {"name", "arguments"}}]`);
    /// templates see `arguments` as a map when it is a JSON string, as
    /// Hugging Face templates expect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<serde_json::Value>,
    /// The call a `tool` message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl ChatMessage {
    /// A message with the given role and text.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            tool_calls: None,
            tool_call_id: None,
        }
    }
}

/// How a [`ChatTemplate`] renders.
#[derive(Debug)]
enum Kind {
    Jinja(Box<JinjaTemplate>),
    Builtin(Builtin),
}

/// A compiled chat template, ready to render any number of conversations.
#[derive(Debug)]
pub struct ChatTemplate {
    kind: Kind,
    bos_token: String,
    eos_token: String,
    /// Fixed render time for `strftime_now`; `None` reads the system clock
    /// (natively; the browser build has none).
    now_unix: Option<i64>,
}

impl ChatTemplate {
    /// Compiles a Jinja template. `bos_token` and `eos_token` are the texts
    /// of the model's BOS/EOS tokens, which templates may print.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, ChatError> {
        Ok(ChatTemplate {
            kind: Kind::Jinja(Box::new(JinjaTemplate::compile(source)?)),
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
            now_unix: None,
        })
    }

    /// A built-in format by name: `chatml`, `llama3` or `gemma`. The error
    /// for any other name lists these.
    pub fn builtin(name: &str) -> Result<Self, ChatError> {
        let builtin = Builtin::from_name(name).ok_or_else(|| ChatError::UnknownBuiltin {
            name: name.to_string(),
        })?;
        Ok(ChatTemplate {
            kind: Kind::Builtin(builtin),
            bos_token: String::new(),
            eos_token: String::new(),
            now_unix: None,
        })
    }

    /// The names [`ChatTemplate::builtin`] accepts.
    pub fn builtin_names() -> &'static [&'static str] {
        &BUILTIN_NAMES
    }

    /// The model's template: the built-in `override_name` when given, else
    /// `tokenizer.chat_template` with BOS/EOS texts looked up in
    /// `tokenizer.ggml.tokens`. [`ChatError::NoTemplate`] when the model has
    /// no template and no override was given.
    pub fn from_metadata(md: &Metadata, override_name: Option<&str>) -> Result<Self, ChatError> {
        if let Some(name) = override_name {
            return Self::builtin(name);
        }
        let source = md.get_str(TEMPLATE_KEY).ok_or(ChatError::NoTemplate)?;
        let bos = token_text(md, "tokenizer.ggml.bos_token_id")?;
        let eos = token_text(md, "tokenizer.ggml.eos_token_id")?;
        Self::new(source, bos, eos)
    }

    /// Fixes the time `strftime_now` reports (seconds since the Unix epoch,
    /// formatted as UTC). Needed in the browser, which gives the core no
    /// clock; natively the system clock is used when this is not set.
    pub fn with_now(mut self, unix_secs: i64) -> Self {
        self.now_unix = Some(unix_secs);
        self
    }

    /// The built-in name, or `None` for a Jinja template.
    pub fn builtin_name(&self) -> Option<&'static str> {
        match self.kind {
            Kind::Builtin(b) => Some(b.name()),
            Kind::Jinja(_) => None,
        }
    }

    /// The BOS text given to the template (empty for built-ins).
    pub fn bos_token(&self) -> &str {
        &self.bos_token
    }

    /// The EOS text given to the template (empty for built-ins).
    pub fn eos_token(&self) -> &str {
        &self.eos_token
    }

    /// The prompt text for `messages`. With `add_generation_prompt` it ends
    /// by opening the assistant's turn, ready for generation.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        self.render_with_tools(messages, None, add_generation_prompt)
    }

    /// [`ChatTemplate::render`] with the functions the model may call
    /// (`tools`: OpenAI's `[{"type": "function", "function": {...}}]`),
    /// which a Jinja template sees as `tools`. Built-in formats have no
    /// place for tools and ignore them; see [`ChatTemplate::supports_tools`].
    pub fn render_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        match &self.kind {
            Kind::Builtin(b) => Ok(b.render(messages, add_generation_prompt)),
            Kind::Jinja(t) => t.render(
                messages,
                &RenderVars {
                    add_generation_prompt,
                    bos_token: &self.bos_token,
                    eos_token: &self.eos_token,
                    now_unix: self.now_unix.or_else(system_now),
                    tools,
                },
            ),
        }
    }

    /// Whether the template renders `tools` itself (a Jinja template that
    /// reads the variable). Without that, a caller offering tools must
    /// describe them in a message.
    pub fn supports_tools(&self) -> bool {
        match &self.kind {
            Kind::Builtin(_) => false,
            Kind::Jinja(t) => t.reads_tools(),
        }
    }

    /// The Jinja source, or `None` for a built-in.
    pub fn source(&self) -> Option<&str> {
        match &self.kind {
            Kind::Builtin(_) => None,
            Kind::Jinja(t) => Some(t.source()),
        }
    }
}

/// The text of the token whose id is stored under `key`; empty when the
/// model does not name that token.
fn token_text<'a>(md: &'a Metadata, key: &'static str) -> Result<&'a str, ChatError> {
    let Some(id) = md.get_u64(key) else {
        return Ok("");
    };
    let tokens = md.get_str_array("tokenizer.ggml.tokens").unwrap_or(&[]);
    usize::try_from(id)
        .ok()
        .and_then(|i| tokens.get(i))
        .map(String::as_str)
        .ok_or(ChatError::BadTokenId {
            key,
            id,
            n_tokens: tokens.len(),
        })
}

/// Seconds since the Unix epoch from the system clock.
#[cfg(not(target_arch = "wasm32"))]
fn system_now() -> Option<i64> {
    let elapsed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?;
    i64::try_from(elapsed.as_secs()).ok()
}

/// The browser build has no clock in the core (`SystemTime::now` panics on
/// wasm32-unknown-unknown); callers pass the time with `with_now`.
#[cfg(target_arch = "wasm32")]
fn system_now() -> Option<i64> {
    None
}
