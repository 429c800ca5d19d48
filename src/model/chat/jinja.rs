//! Jinja chat templates (`tokenizer.chat_template`) rendered with minijinja,
//! set up to behave like Hugging Face's `apply_chat_template`: `trim_blocks`
//! and `lstrip_blocks` on, loop controls, Python string/dict methods,
//! `raise_exception`, `strftime_now`, and Python's `tojson` and `str()` forms.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Enumerator, Kwargs, Object, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind, State};

use super::pyfmt::{self, JsonStyle};
use super::{strftime, ChatError, ChatMessage};

/// The name the template is registered under; it appears in error locations.
const TEMPLATE_NAME: &str = "chat_template";
/// Context variable carrying the render time to `strftime_now`. Not a name
/// any template uses: templates see only the documented variables.
const NOW_VAR: &str = "__hearth_now_unix";

/// The error `raise_exception(msg)` puts in minijinja's source chain, so the
/// render error can be told apart from engine failures.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct RaisedException(String);

/// A compiled Jinja chat template.
pub(crate) struct JinjaTemplate {
    env: Environment<'static>,
    source: String,
}

impl fmt::Debug for JinjaTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JinjaTemplate").finish_non_exhaustive()
    }
}

/// Everything a render needs besides the messages.
pub(crate) struct RenderVars<'a> {
    pub add_generation_prompt: bool,
    pub bos_token: &'a str,
    pub eos_token: &'a str,
    /// Seconds since the Unix epoch for `strftime_now`; `None` makes it an error.
    pub now_unix: Option<i64>,
    /// The functions the model may call (`tools`), when offered.
    pub tools: Option<&'a [serde_json::Value]>,
}

impl JinjaTemplate {
    /// Parses and compiles `source`; syntax errors surface here, not at render.
    pub fn compile(source: &str) -> Result<Self, ChatError> {
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| ChatError::Syntax {
                detail: describe(&e),
            })?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(call_python_method);
        env.set_formatter(format_python);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(TEMPLATE_NAME, source.to_string())
            .map_err(|e| ChatError::Syntax {
                detail: describe(&e),
            })?;
        Ok(JinjaTemplate {
            env,
            source: source.to_string(),
        })
    }

    /// The template source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether the template reads the `tools` variable.
    pub fn reads_tools(&self) -> bool {
        self.env
            .get_template(TEMPLATE_NAME)
            .map(|t| t.undeclared_variables(false).contains("tools"))
            .unwrap_or(false)
    }

    /// Renders the conversation. The template sees `messages` (maps with
    /// `role` and `content`, and `tool_calls` / `tool_call_id` where a
    /// message has them), `add_generation_prompt`, `bos_token`, `eos_token`
    /// and, when offered, `tools`.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        vars: &RenderVars<'_>,
    ) -> Result<String, ChatError> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| ChatError::Render {
                detail: describe(&e),
            })?;
        let messages: Vec<Value> = messages
            .iter()
            .map(|m| Value::from_object(MessageObject::new(m)))
            .collect();
        let mut ctx: BTreeMap<String, Value> = BTreeMap::new();
        ctx.insert("messages".into(), Value::from(messages));
        ctx.insert(
            "add_generation_prompt".into(),
            Value::from(vars.add_generation_prompt),
        );
        ctx.insert("bos_token".into(), Value::from(vars.bos_token));
        ctx.insert("eos_token".into(), Value::from(vars.eos_token));
        if let Some(now) = vars.now_unix {
            ctx.insert(NOW_VAR.into(), Value::from(now));
        }
        if let Some(tools) = vars.tools {
            ctx.insert(
                "tools".into(),
                Value::from(tools.iter().map(json_value).collect::<Vec<_>>()),
            );
        }
        template.render(ctx).map_err(render_error)
    }
}

/// One chat message as a template sees it: a map with keys `role` and
/// `content` in that order (as in the Python dicts templates are written
/// for), then `tool_calls` and `tool_call_id` when the message has them.
#[derive(Debug)]
struct MessageObject {
    role: Value,
    content: Value,
    tool_calls: Option<Value>,
    tool_call_id: Option<Value>,
}

impl MessageObject {
    fn new(m: &ChatMessage) -> Self {
        MessageObject {
            role: Value::from(m.role.as_str()),
            content: Value::from(m.content.as_str()),
            tool_calls: m
                .tool_calls
                .as_ref()
                .map(|c| json_value(&arguments_as_maps(c))),
            tool_call_id: m.tool_call_id.as_deref().map(Value::from),
        }
    }
}

impl Object for MessageObject {
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        match key.as_str()? {
            "role" => Some(self.role.clone()),
            "content" => Some(self.content.clone()),
            "tool_calls" => self.tool_calls.clone(),
            "tool_call_id" => self.tool_call_id.clone(),
            _ => None,
        }
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        let keys: &'static [&'static str] = match (&self.tool_calls, &self.tool_call_id) {
            (None, None) => &["role", "content"],
            (Some(_), None) => &["role", "content", "tool_calls"],
            (None, Some(_)) => &["role", "content", "tool_call_id"],
            (Some(_), Some(_)) => &["role", "content", "tool_calls", "tool_call_id"],
        };
        Enumerator::Str(keys)
    }
}

/// OpenAI sends a call's `arguments` as a JSON string; Hugging Face
/// templates expect a map. Strings that parse as JSON objects become maps.
fn arguments_as_maps(calls: &serde_json::Value) -> serde_json::Value {
    let mut calls = calls.clone();
    if let Some(list) = calls.as_array_mut() {
        for call in list {
            let args = call
                .get_mut("function")
                .and_then(|f| f.get_mut("arguments"));
            if let Some(args) = args {
                let parsed = args
                    .as_str()
                    .and_then(|s| serde_json::from_str::<serde_json::Value>(s).ok());
                if let Some(p @ serde_json::Value::Object(_)) = parsed {
                    *args = p;
                }
            }
        }
    }
    calls
}

/// A JSON value as a template value (maps keep their key order).
fn json_value(v: &serde_json::Value) -> Value {
    use serde_json::Value as J;
    match v {
        J::Null => Value::from(()),
        J::Bool(b) => Value::from(*b),
        J::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => Value::from(i),
            (_, Some(u), _) => Value::from(u),
            (_, _, f) => Value::from(f.unwrap_or(f64::NAN)),
        },
        J::String(s) => Value::from(s.as_str()),
        J::Array(items) => Value::from(items.iter().map(json_value).collect::<Vec<_>>()),
        J::Object(map) => Value::from_object(JsonMap(
            map.iter()
                .map(|(k, v)| (k.clone(), json_value(v)))
                .collect(),
        )),
    }
}

/// A JSON object as a template map, keys in their order.
#[derive(Debug)]
struct JsonMap(Vec<(String, Value)>);

impl Object for JsonMap {
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let key = key.as_str()?;
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Values(
            self.0
                .iter()
                .map(|(k, _)| Value::from(k.as_str()))
                .collect(),
        )
    }
}

/// A minijinja error with its source chain, on one line.
fn describe(err: &Error) -> String {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text
}

/// `raise_exception` becomes [`ChatError::Raised`]; anything else is a render failure.
fn render_error(err: Error) -> ChatError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&err);
    while let Some(inner) = source {
        if let Some(raised) = inner.downcast_ref::<RaisedException>() {
            return ChatError::Raised {
                message: raised.0.clone(),
            };
        }
        source = inner.source();
    }
    ChatError::Render {
        detail: describe(&err),
    }
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message.clone())
        .with_source(RaisedException(message)))
}

fn strftime_now(state: &State, format: String) -> Result<String, Error> {
    let now = state
        .lookup(NOW_VAR)
        .and_then(|v| v.as_i64())
        .ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidOperation,
                "strftime_now: no clock on this target; give the time with ChatTemplate::with_now",
            )
        })?;
    Ok(strftime::strftime(&format, now))
}

/// Hugging Face's `tojson`: `json.dumps(x, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`. A positional argument is the indent,
/// as in Jinja2's own filter.
fn tojson(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match indent {
        Some(v) => Some(v),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    let indent = match indent {
        Some(v) if !v.is_none() => Some(usize::try_from(v)?),
        _ => None,
    };
    let mut style = JsonStyle::new(indent);
    if let Some(ascii) = kwargs.get::<Option<bool>>("ensure_ascii")? {
        style.ensure_ascii = ascii;
    }
    if let Some(sort) = kwargs.get::<Option<bool>>("sort_keys")? {
        style.sort_keys = sort;
    }
    if let Some(seps) = kwargs.get::<Option<Value>>("separators")? {
        if !seps.is_none() {
            let parts: Vec<String> = seps
                .try_iter()?
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<_>>()
                .unwrap_or_default();
            let [item, key] = <[String; 2]>::try_from(parts).map_err(|_| {
                Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: separators must be two strings (item, key)",
                )
            })?;
            style.item_sep = item;
            style.key_sep = key;
        }
    }
    kwargs.assert_all_used()?;
    Ok(Value::from_safe_string(pyfmt::to_json(value, &style)?))
}

/// Prints `{{ value }}` the way Python's `str()` does (`True`, `None`,
/// `['a', 1]`, `1e+20`); strings and other kinds print as minijinja prints them.
fn format_python(
    out: &mut minijinja::Output,
    state: &mut State,
    value: &Value,
) -> Result<(), Error> {
    match value.kind() {
        ValueKind::None | ValueKind::Bool | ValueKind::Number | ValueKind::Seq | ValueKind::Map => {
            pyfmt::write_python_str(out, value)
                .map_err(|_| Error::new(ErrorKind::WriteFailure, "formatting a value"))
        }
        _ => minijinja::escape_formatter(out, state, value),
    }
}

/// Python methods on values (`.strip()`, `.split()`, `.items()`, ...):
/// minijinja-contrib's `pycompat`, plus `str.rsplit`, which it lacks.
fn call_python_method(
    state: &mut State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    if method == "rsplit" {
        if let Some(s) = value.as_str() {
            return rsplit(s, args);
        }
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// Python's `str.rsplit(sep=None, maxsplit=-1)`.
fn rsplit(s: &str, args: &[Value]) -> Result<Value, Error> {
    let sep = match args.first() {
        Some(v) if !v.is_none() && !v.is_undefined() => Some(
            v.as_str()
                .ok_or_else(|| {
                    Error::new(ErrorKind::InvalidOperation, "rsplit: sep must be a string")
                })?
                .to_string(),
        ),
        _ => None,
    };
    let maxsplit = match args.get(1) {
        Some(v) => v.as_i64().ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidOperation,
                "rsplit: maxsplit must be an integer",
            )
        })?,
        None => -1,
    };
    let limit = usize::try_from(maxsplit).ok();
    let parts: Vec<Value> = match sep.as_deref() {
        Some("") => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "rsplit: empty separator",
            ))
        }
        Some(sep) => {
            let mut parts: Vec<&str> = match limit {
                Some(n) => s.rsplitn(n + 1, sep).collect(),
                None => s.rsplit(sep).collect(),
            };
            parts.reverse();
            parts.into_iter().map(Value::from).collect()
        }
        None => rsplit_whitespace(s, limit)
            .into_iter()
            .map(Value::from)
            .collect(),
    };
    Ok(Value::from(parts))
}

/// `str.rsplit()` without a separator: runs of whitespace split, at most
/// `limit` times from the right; the unsplit head keeps its leading space.
fn rsplit_whitespace(s: &str, limit: Option<usize>) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut rest = s.trim_end();
    while !rest.is_empty() && limit.is_none_or(|n| parts.len() < n) {
        match rest.rfind(char::is_whitespace) {
            Some(i) => {
                let ws_len = rest[i..].chars().next().map_or(1, char::len_utf8);
                parts.push(&rest[i + ws_len..]);
                rest = rest[..i].trim_end();
            }
            None => {
                parts.push(rest);
                rest = "";
            }
        }
    }
    if !rest.is_empty() {
        parts.push(rest);
    }
    parts.reverse();
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rsplit_whitespace_matches_python() {
        // Python: "  a b  c ".rsplit(None, 1) == ['  a b', 'c']; .rsplit() == ['a', 'b', 'c']
        assert_eq!(rsplit_whitespace("  a b  c ", Some(1)), vec!["  a b", "c"]);
        assert_eq!(rsplit_whitespace("  a b  c ", None), vec!["a", "b", "c"]);
        assert_eq!(rsplit_whitespace("   ", None), Vec::<&str>::new());
    }
}
