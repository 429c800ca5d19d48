//! Constrained decoding (structured output): a request's output held to a
//! JSON Schema, a grammar or a regular expression while it is sampled.
//!
//! The grammars are compiled and run by [llguidance] (MIT licensed), which
//! computes, before each sampled token, the set of tokens that keep the
//! output a prefix of some string the grammar accepts. The engine drops every
//! other token from the row before the sampler's chain (penalties, top-k,
//! top-p, min-p, temperature, and the log-probabilities reported), feeds the
//! chosen token back, and ends the request with
//! [`FinishReason::Stop`](super::FinishReason::Stop) once the grammar is
//! complete: it accepts and nothing can follow, or it accepts and an
//! end-of-generation token was sampled.
//!
//! The token environment (every token's bytes in a trie, special tokens
//! marked so that only a grammar naming them, as `<|im_end|>`, can emit
//! them) is built once per engine, on the first constrained request.
//!
//! [llguidance]: https://github.com/guidance-ai/llguidance

mod gbnf;
mod vocab;

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{SimpleVob, TokEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};

use super::EngineError;
use crate::model::tokenizer::Tokenizer;

/// What a request's output must match. The OpenAI-style `response_format`
/// and llama.cpp's `grammar` map onto it.
#[derive(Debug, Clone, PartialEq)]
pub enum Constraint {
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    JsonObject,
    /// JSON valid against this JSON Schema (`response_format: {"type":
    /// "json_schema", ...}`, tool calls with `tool_choice: "required"`).
    ///
    /// llguidance's subset of the draft 2020-12 vocabulary: types, `enum`,
    /// `const`, `required`, `additionalProperties`, `properties`, `items`,
    /// `prefixItems`, `anyOf`/`oneOf`/`allOf`, string `pattern`/`format`
    /// /`minLength`/`maxLength`, number bounds, and `$ref` within the
    /// document (`#/$defs/...`). The output is compact (no whitespace
    /// between tokens of the JSON) unless the schema's own `x-guidance`
    /// object says otherwise (`{"whitespace_flexible": true}`).
    JsonSchema(Value),
    /// A grammar in llguidance's Lark dialect (start rule `start`; `%json`
    /// embeds a JSON Schema, `<|name|>` names a special token).
    Lark(String),
    /// A GBNF grammar as llama.cpp takes it (start rule `root`), converted
    /// to Lark as llguidance's own converter does.
    Gbnf(String),
    /// A regular expression (Rust `regex` syntax) the whole output must match.
    Regex(String),
}

impl Constraint {
    /// The name used in errors: `json_object`, `json_schema`, `lark`,
    /// `gbnf`, `regex`.
    pub fn kind(&self) -> &'static str {
        match self {
            Constraint::JsonObject => "json_object",
            Constraint::JsonSchema(_) => "json_schema",
            Constraint::Lark(_) => "lark",
            Constraint::Gbnf(_) => "gbnf",
            Constraint::Regex(_) => "regex",
        }
    }

    /// llguidance's grammar for the constraint.
    fn to_grammar(&self) -> Result<TopLevelGrammar, String> {
        Ok(match self {
            Constraint::JsonObject => compact_json(json!({"type": "object"})),
            Constraint::JsonSchema(schema) => compact_json(schema.clone()),
            Constraint::Lark(lark) => TopLevelGrammar::from_lark(lark.clone()),
            Constraint::Gbnf(gbnf) => {
                TopLevelGrammar::from_lark(gbnf::gbnf_to_lark(gbnf).map_err(|e| e.to_string())?)
            }
            Constraint::Regex(rx) => TopLevelGrammar::from_regex(rx),
        })
    }
}

/// The schema's grammar, with no optional whitespace unless the schema's
/// `x-guidance` options ask for it: a model free to add whitespace can
/// spend its whole budget on it.
fn compact_json(mut schema: Value) -> TopLevelGrammar {
    if let Value::Object(map) = &mut schema {
        map.entry("x-guidance")
            .or_insert_with(|| json!({"whitespace_flexible": false}));
    }
    TopLevelGrammar::from_json_schema(schema)
}

/// The engine's grammar compiler: llguidance's parser factory over the
/// engine's vocabulary (built once; every request's matcher shares it).
pub(crate) struct GrammarEnv {
    factory: ParserFactory,
}

impl std::fmt::Debug for GrammarEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let vocab = self.factory.tok_env().tok_trie().vocab_size();
        f.debug_struct("GrammarEnv").field("vocab", &vocab).finish()
    }
}

impl GrammarEnv {
    /// The environment of `tokenizer`; `eog` are the tokens that end a
    /// completed grammar (a model without any cannot be constrained).
    pub(crate) fn new(tokenizer: &Tokenizer, eog: &[u32]) -> Result<Self, EngineError> {
        if eog.is_empty() {
            return Err(EngineError::ConstraintUnsupported {
                detail: "the model defines no end-of-generation token, which constrained \
                         decoding needs to end the output"
                    .into(),
            });
        }
        let env: TokEnv = Arc::new(vocab::VocabEnv::new(tokenizer, eog));
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| EngineError::ConstraintUnsupported {
                detail: format!("llguidance could not index the vocabulary: {e}"),
            })?;
        factory.quiet();
        Ok(GrammarEnv { factory })
    }

    /// Compiles `constraint` into a fresh matcher at the start of the output.
    pub(crate) fn compile(&self, constraint: &Constraint) -> Result<Grammar, EngineError> {
        let kind = constraint.kind();
        let bad = |detail: String| EngineError::BadGrammar { kind, detail };
        let grammar = constraint.to_grammar().map_err(bad)?;
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| bad(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(bad(e));
        }
        Ok(Grammar {
            matcher,
            fed: 0,
            end: None,
        })
    }
}

/// How a grammar ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum GrammarEnd {
    /// The output is complete: nothing more can follow.
    Complete,
    /// The matcher refused a token or failed (never expected: the mask is
    /// applied to every sampled token).
    Failed(String),
}

/// One request's grammar state: the matcher and how many of the request's
/// output tokens it has consumed.
pub(crate) struct Grammar {
    matcher: Matcher,
    /// Output tokens consumed so far. The scheduler keeps a request's
    /// output across preemption, so this only grows: a recomputed request
    /// feeds nothing twice.
    fed: usize,
    end: Option<GrammarEnd>,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammar")
            .field("fed", &self.fed)
            .field("end", &self.end)
            .finish()
    }
}

impl Grammar {
    /// The tokens allowed next: a bit per token of the tokenizer's
    /// vocabulary (ids past it are never allowed). Errors when the matcher
    /// cannot go on.
    pub(crate) fn mask(&mut self) -> Result<SimpleVob, String> {
        self.matcher
            .compute_mask()
            .map_err(|e| format!("the grammar cannot continue: {e}"))
    }

    /// Consumes the output tokens not yet seen (`output` is the request's
    /// whole output so far); returns whether the grammar has ended.
    pub(crate) fn advance(&mut self, output: &[u32]) -> bool {
        if self.end.is_some() {
            return true;
        }
        let new = output.get(self.fed..).unwrap_or(&[]);
        self.fed = self.fed.max(output.len());
        if let Err(e) = self.matcher.consume_tokens(new) {
            self.end = Some(GrammarEnd::Failed(format!(
                "the grammar refused a sampled token: {e}"
            )));
        } else if self.matcher.is_stopped() {
            self.end = Some(GrammarEnd::Complete);
        }
        self.end.is_some()
    }

    /// How the grammar ended, if it has.
    pub(crate) fn end(&self) -> Option<&GrammarEnd> {
        self.end.as_ref()
    }
}

/// Whether `mask` allows `token` (ids outside the mask are not allowed).
pub(crate) fn allows(mask: &SimpleVob, token: u32) -> bool {
    (token as usize) < mask.len() && mask.is_allowed(token)
}
