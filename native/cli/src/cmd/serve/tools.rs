//! Tool calling: offering OpenAI's `tools` to the model in the form its
//! chat template knows, holding the output to a call where `tool_choice`
//! asks for one, and reading the calls back out of the text.
//!
//! Templates that render `tools` themselves are used as they are, and the
//! reply is parsed in the format they teach: Hermes / Qwen
//! (`<tool_call>{json}</tool_call>`), Llama 3.x (a bare
//! `{"name", "parameters"}` object) or Mistral (`[TOOL_CALLS][...]`).
//! For any other template (SmolLM2's, Gemma's, the built-ins) the tools are
//! described in the system message and the reply is held, by a JSON Schema,
//! to `{"tool_calls": [...]}` or `{"response": "..."}`, which works with
//! any instruction-tuned model: llama.cpp's generic tool format.

use hearth::engine::{ChatMessage, Constraint, Prompt};
use hearth::model::chat::ChatTemplate;
use serde_json::{json, Value};

use super::error::ApiError;

/// The tool format a template teaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    /// `<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>`.
    Hermes,
    /// `{"name": ..., "parameters": ...}` (Llama 3.1 / 3.2).
    Llama3,
    /// `[TOOL_CALLS][{"name": ..., "arguments": ...}]`.
    Mistral,
    /// Tools described in the system message, JSON reply (any template).
    Generic,
}

impl ToolFormat {
    /// The format of `template` (none: generic).
    pub fn of(template: Option<&ChatTemplate>) -> Self {
        let Some(t) = template.filter(|t| t.supports_tools()) else {
            return ToolFormat::Generic;
        };
        let src = t.source().unwrap_or("");
        if src.contains("<tool_call>") {
            ToolFormat::Hermes
        } else if src.contains("[TOOL_CALLS]") {
            ToolFormat::Mistral
        } else if src.contains("<|python_tag|>") || src.contains("\"parameters\": ") {
            ToolFormat::Llama3
        } else {
            ToolFormat::Generic
        }
    }
}

/// What `tool_choice` asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides.
    Auto,
    /// The model must call some tool.
    Required,
    /// The model must call this one.
    Named(String),
}

/// The tools of a request and how they are offered.
#[derive(Debug, Clone)]
pub struct ToolPlan {
    /// The format used.
    pub format: ToolFormat,
    /// What the model must do.
    pub choice: ToolChoice,
    /// The functions, validated (`{"type": "function", "function": {...}}`).
    pub tools: Vec<Value>,
    /// At most one call when false (`parallel_tool_calls`, default false
    /// as in llama-server).
    pub parallel: bool,
}

/// The plan for `tools` / `tool_choice`; `None` when no tool is offered
/// (none given, or `tool_choice: "none"`).
pub fn plan(
    tools: Option<&[Value]>,
    choice: Option<&Value>,
    parallel: Option<bool>,
    format: ToolFormat,
) -> Result<Option<ToolPlan>, ApiError> {
    let tools = tools.unwrap_or(&[]);
    let choice = match choice {
        None => ToolChoice::Auto,
        Some(Value::String(s)) if s == "none" => return Ok(None),
        Some(Value::String(s)) if s == "auto" => ToolChoice::Auto,
        Some(Value::String(s)) if s == "required" => ToolChoice::Required,
        Some(v) => match v.pointer("/function/name").and_then(Value::as_str) {
            Some(name) => ToolChoice::Named(name.to_string()),
            None => {
                return Err(ApiError::bad_param(
                    "tool_choice",
                    "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}",
                ))
            }
        },
    };
    if tools.is_empty() {
        if choice == ToolChoice::Auto {
            return Ok(None);
        }
        return Err(ApiError::bad_param(
            "tool_choice",
            "tool_choice asks for a call but no tools were given",
        ));
    }
    for (i, t) in tools.iter().enumerate() {
        let kind = t.get("type").and_then(Value::as_str);
        let name = t.pointer("/function/name").and_then(Value::as_str);
        let params = t.pointer("/function/parameters");
        if kind != Some("function")
            || name.is_none_or(str::is_empty)
            || params.is_some_and(|p| !p.is_object())
        {
            return Err(ApiError::bad_param(
                "tools",
                format!("tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ..., \"parameters\": {{...}}}}}}"),
            ));
        }
    }
    if let ToolChoice::Named(n) = &choice {
        if !tools
            .iter()
            .any(|t| t.pointer("/function/name").and_then(Value::as_str) == Some(n))
        {
            return Err(ApiError::bad_param(
                "tool_choice",
                format!("tool_choice names {n:?}, which is not among the tools"),
            ));
        }
    }
    Ok(Some(ToolPlan {
        format,
        choice,
        tools: tools.to_vec(),
        // llama-server's default: one call per reply unless asked for more.
        parallel: parallel.unwrap_or(false),
    }))
}

impl ToolPlan {
    /// The tools the model may call under `tool_choice`.
    fn allowed(&self) -> impl Iterator<Item = &Value> {
        self.tools.iter().filter(move |t| match &self.choice {
            ToolChoice::Named(n) => t.pointer("/function/name").and_then(Value::as_str) == Some(n),
            _ => true,
        })
    }

    /// The prompt: the template's own tool rendering, or the generic
    /// description in the system message.
    pub fn prompt(&self, messages: Vec<ChatMessage>) -> Prompt {
        if self.format != ToolFormat::Generic {
            return Prompt::ChatWithTools {
                messages,
                tools: self.tools.clone(),
            };
        }
        Prompt::Chat(generic_messages(
            messages,
            &self.tools,
            self.choice == ToolChoice::Auto,
        ))
    }

    /// The constraint that holds the reply to the format: always for the
    /// generic format, and for the others where a call is required.
    pub fn constraint(&self) -> Option<Constraint> {
        let calls = self
            .allowed()
            .map(|t| call_schema(t, self.format))
            .collect::<Vec<_>>();
        let one_call = json!({"anyOf": calls});
        let list = |item: Value| {
            let mut s = json!({"type": "array", "items": item, "minItems": 1});
            if !self.parallel {
                s["maxItems"] = json!(1);
            }
            s
        };
        match self.format {
            ToolFormat::Generic => {
                let call = json!({"type": "object", "properties": {"tool_calls": list(one_call)}, "required": ["tool_calls"], "additionalProperties": false});
                let schema = if self.choice == ToolChoice::Auto {
                    let reply = json!({"type": "object", "properties": {"response": {"type": "string"}}, "required": ["response"], "additionalProperties": false});
                    json!({"anyOf": [call, reply]})
                } else {
                    call
                };
                Some(Constraint::JsonSchema(schema))
            }
            _ if self.choice == ToolChoice::Auto => None,
            ToolFormat::Hermes => {
                let repeat = if self.parallel { "+" } else { "" };
                Some(Constraint::Lark(format!(
                    "start: (\"<tool_call>\\n\" call \"\\n</tool_call>\"){repeat}\ncall: %json {one_call}\n"
                )))
            }
            ToolFormat::Llama3 => Some(Constraint::JsonSchema(one_call)),
            ToolFormat::Mistral => Some(Constraint::Lark(format!(
                "start: \"[TOOL_CALLS]\" calls\ncalls: %json {}\n",
                list(one_call)
            ))),
        }
    }

    /// The calls in `text`, and what text is left for `content`. No calls:
    /// the text is the content (the generic format's `response` unwrapped).
    /// Call `i` gets the id `call_{id_base}_{i}` (`id_base`: unique to the
    /// reply and choice).
    pub fn parse(&self, text: &str, id_base: &str) -> (Option<String>, Vec<Value>) {
        let (content, calls) = match self.format {
            ToolFormat::Generic => parse_generic(text),
            ToolFormat::Hermes => parse_hermes(text),
            ToolFormat::Llama3 => parse_llama3(text),
            ToolFormat::Mistral => parse_mistral(text),
        };
        let calls = calls
            .into_iter()
            .enumerate()
            .map(|(i, (name, args))| {
                json!({
                    "id": format!("call_{id_base}_{i}"),
                    "type": "function",
                    "function": {"name": name, "arguments": args.to_string()},
                })
            })
            .collect();
        (content, calls)
    }
}

/// The JSON Schema of one call to `tool` in `format`'s key names.
fn call_schema(tool: &Value, format: ToolFormat) -> Value {
    let name = tool
        .pointer("/function/name")
        .cloned()
        .unwrap_or(Value::Null);
    let mut params = tool
        .pointer("/function/parameters")
        .cloned()
        .unwrap_or_else(|| json!({"type": "object", "properties": {}}));
    // Arguments the function does not declare are not allowed unless the
    // schema says so: a small model would otherwise invent keys forever.
    if let Some(p) = params.as_object_mut() {
        p.entry("additionalProperties").or_insert(json!(false));
    }
    let args = if format == ToolFormat::Llama3 {
        "parameters"
    } else {
        "arguments"
    };
    json!({
        "type": "object",
        "properties": {"name": {"const": name}, args: params},
        "required": ["name", args],
        "additionalProperties": false,
    })
}

/// The conversation with the tools described in the system message and
/// earlier calls written as the JSON the model is asked to produce.
fn generic_messages(
    mut messages: Vec<ChatMessage>,
    tools: &[Value],
    auto: bool,
) -> Vec<ChatMessage> {
    let list: Vec<Value> = tools
        .iter()
        .filter_map(|t| t.get("function").cloned())
        .collect();
    let tools_json = serde_json::to_string_pretty(&list).unwrap_or_default();
    let how = if auto {
        "To call tools, reply with only a JSON object {\"tool_calls\": [{\"name\": <tool name>, \"arguments\": {<arguments>}}]}. To answer directly, reply with only {\"response\": <your answer>}."
    } else {
        "Reply with only a JSON object {\"tool_calls\": [{\"name\": <tool name>, \"arguments\": {<arguments>}}]}."
    };
    let text = format!("You can call these tools:\n{tools_json}\n\n{how}");
    match messages.first_mut() {
        Some(m) if m.role == "system" => m.content = format!("{}\n\n{text}", m.content),
        _ => messages.insert(0, ChatMessage::new("system", text)),
    }
    for m in &mut messages {
        if let Some(calls) = m.tool_calls.take() {
            let calls: Vec<Value> = calls
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|c| c.get("function"))
                        .map(unstring_arguments)
                        .collect()
                })
                .unwrap_or_default();
            m.content = json!({"tool_calls": calls}).to_string();
        }
        if m.role == "tool" {
            let id = m.tool_call_id.take().unwrap_or_default();
            m.content = json!({"tool_response": {"id": id, "content": m.content}}).to_string();
        }
    }
    messages
}

/// `{"name", "arguments": "<json>"}` with the arguments parsed.
fn unstring_arguments(f: &Value) -> Value {
    let args = f.get("arguments").cloned().unwrap_or(Value::Null);
    let args = args
        .as_str()
        .and_then(|s| serde_json::from_str(s).ok())
        .unwrap_or(args);
    json!({"name": f.get("name"), "arguments": args})
}

type Calls = Vec<(String, Value)>;

/// `(name, arguments)` of a call object with `args_key`.
fn call_of(v: &Value, args_key: &str) -> Option<(String, Value)> {
    let name = v.get("name")?.as_str()?.to_string();
    let args = v
        .get(args_key)
        .or_else(|| v.get("arguments"))
        .cloned()
        .unwrap_or(json!({}));
    Some((name, args))
}

fn parse_generic(text: &str) -> (Option<String>, Calls) {
    let Ok(v) = serde_json::from_str::<Value>(text.trim()) else {
        return (Some(text.to_string()), Vec::new());
    };
    if let Some(calls) = v.get("tool_calls").and_then(Value::as_array) {
        return (
            None,
            calls
                .iter()
                .filter_map(|c| call_of(c, "arguments"))
                .collect(),
        );
    }
    if let Some(r) = v.get("response").and_then(Value::as_str) {
        return (Some(r.to_string()), Vec::new());
    }
    (Some(text.to_string()), Vec::new())
}

fn parse_hermes(text: &str) -> (Option<String>, Calls) {
    let mut calls = Vec::new();
    let mut rest = String::new();
    let mut s = text;
    while let Some(start) = s.find("<tool_call>") {
        rest.push_str(&s[..start]);
        let after = &s[start + "<tool_call>".len()..];
        let (body, tail) = match after.find("</tool_call>") {
            Some(end) => (&after[..end], &after[end + "</tool_call>".len()..]),
            None => (after, ""),
        };
        match serde_json::from_str::<Value>(body.trim())
            .ok()
            .and_then(|v| call_of(&v, "arguments"))
        {
            Some(c) => calls.push(c),
            None => rest.push_str(&s[start..s.len() - tail.len()]),
        }
        s = tail;
    }
    rest.push_str(s);
    let rest = rest.trim();
    (
        if rest.is_empty() && !calls.is_empty() {
            None
        } else {
            Some(rest.to_string())
        },
        calls,
    )
}

fn parse_llama3(text: &str) -> (Option<String>, Calls) {
    let t = text.trim().trim_start_matches("<|python_tag|>").trim();
    if t.starts_with('{') {
        if let Some(c) = serde_json::from_str::<Value>(t)
            .ok()
            .and_then(|v| call_of(&v, "parameters"))
        {
            return (None, vec![c]);
        }
    }
    (Some(text.to_string()), Vec::new())
}

fn parse_mistral(text: &str) -> (Option<String>, Calls) {
    if let Some(at) = text.find("[TOOL_CALLS]") {
        let body = text[at + "[TOOL_CALLS]".len()..].trim();
        if let Ok(Value::Array(items)) = serde_json::from_str::<Value>(body) {
            let calls: Calls = items
                .iter()
                .filter_map(|c| call_of(c, "arguments"))
                .collect();
            if !calls.is_empty() {
                let before = text[..at].trim();
                return (
                    if before.is_empty() {
                        None
                    } else {
                        Some(before.to_string())
                    },
                    calls,
                );
            }
        }
    }
    (Some(text.to_string()), Vec::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Value {
        json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})
    }

    fn plan_of(format: ToolFormat, choice: Option<Value>) -> ToolPlan {
        plan(Some(&[weather()]), choice.as_ref(), None, format)
            .unwrap()
            .unwrap()
    }

    #[test]
    fn hermes_calls_and_text_around_them() {
        let p = plan_of(ToolFormat::Hermes, None);
        let (content, calls) = p.parse("Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", "t");
        assert_eq!(content.as_deref(), Some("Let me check."));
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0]["function"]["name"], "get_weather");
        let args: Value =
            serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(args, json!({"city": "Paris"}));
        assert!(calls[0]["id"].as_str().unwrap().starts_with("call_"));
        // A broken call stays text.
        let (content, calls) = p.parse("<tool_call>{nope</tool_call>", "t");
        assert!(calls.is_empty());
        assert_eq!(content.as_deref(), Some("<tool_call>{nope</tool_call>"));
    }

    #[test]
    fn llama3_mistral_and_generic_replies() {
        let (c, calls) = plan_of(ToolFormat::Llama3, None).parse(
            "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}",
            "t",
        );
        assert_eq!((c, calls.len()), (None, 1));
        let (c, calls) = plan_of(ToolFormat::Llama3, None).parse("It is sunny.", "t");
        assert_eq!((c.as_deref(), calls.len()), (Some("It is sunny."), 0));
        let (c, calls) = plan_of(ToolFormat::Mistral, None).parse(
            "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}]",
            "t",
        );
        assert_eq!((c, calls.len()), (None, 1));
        let g = plan_of(ToolFormat::Generic, None);
        let (c, calls) = g.parse(
            "{\"tool_calls\": [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Lima\"}}]}",
            "t",
        );
        assert_eq!((c, calls.len()), (None, 1));
        let (c, calls) = g.parse("{\"response\": \"Hello\"}", "t");
        assert_eq!((c.as_deref(), calls.len()), (Some("Hello"), 0));
    }

    #[test]
    fn choices_and_bad_tools() {
        assert!(plan(
            Some(&[weather()]),
            Some(&json!("none")),
            None,
            ToolFormat::Generic
        )
        .unwrap()
        .is_none());
        assert!(plan(None, None, None, ToolFormat::Generic)
            .unwrap()
            .is_none());
        assert!(plan(None, Some(&json!("required")), None, ToolFormat::Generic).is_err());
        let named = json!({"type": "function", "function": {"name": "other"}});
        assert!(plan(Some(&[weather()]), Some(&named), None, ToolFormat::Generic).is_err());
        assert!(plan(
            Some(&[json!({"type": "function"})]),
            None,
            None,
            ToolFormat::Generic
        )
        .is_err());
        // Auto leaves native formats free; required holds them to a call.
        assert!(plan_of(ToolFormat::Hermes, None).constraint().is_none());
        assert!(matches!(
            plan_of(ToolFormat::Hermes, Some(json!("required"))).constraint(),
            Some(Constraint::Lark(_))
        ));
        assert!(matches!(
            plan_of(ToolFormat::Generic, None).constraint(),
            Some(Constraint::JsonSchema(_))
        ));
    }

    #[test]
    fn generic_prompt_describes_the_tools_in_the_system_message() {
        let p = plan_of(ToolFormat::Generic, None);
        let Prompt::Chat(m) = p.prompt(vec![ChatMessage::new("user", "hi")]) else {
            panic!("generic tools use a plain chat prompt");
        };
        assert_eq!(m[0].role, "system");
        assert!(m[0].content.contains("get_weather"));
        assert_eq!(m[1].content, "hi");
    }
}
