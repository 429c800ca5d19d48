//! Python-compatible text forms of template values.
//!
//! Chat templates are written against Hugging Face's renderer, which is
//! Jinja2 in Python: `{{ x }}` prints `str(x)` (`True`, `None`, `['a', 1]`)
//! and the `tojson` filter is `json.dumps(x, ensure_ascii=False, ...)` (with
//! `", "` and `": "` separators). minijinja's own forms differ (`true`,
//! `none`, `["a", 1]`, compact HTML-safe JSON), and those differences reach
//! the prompt, so this module reproduces the Python forms.

use std::fmt::Write;

use minijinja::value::{Value, ValueKind};
use minijinja::{Error, ErrorKind};

/// Layout options of Python's `json.dumps`.
#[derive(Debug, Clone)]
pub(crate) struct JsonStyle {
    /// Spaces per nesting level; `None` writes everything on one line.
    pub indent: Option<usize>,
    /// Separator between items (`", "` on one line, `","` when indented).
    pub item_sep: String,
    /// Separator between a key and its value (`": "`).
    pub key_sep: String,
    /// Escape every non-ASCII character as `\uXXXX` (surrogate pairs above U+FFFF).
    pub ensure_ascii: bool,
    /// Order map keys by their text.
    pub sort_keys: bool,
}

impl JsonStyle {
    /// `json.dumps` defaults for the given indent (the defaults depend on it).
    pub fn new(indent: Option<usize>) -> Self {
        JsonStyle {
            indent,
            item_sep: if indent.is_some() { "," } else { ", " }.to_string(),
            key_sep: ": ".to_string(),
            ensure_ascii: false,
            sort_keys: false,
        }
    }
}

/// `json.dumps(value)` with the given layout. Undefined values serialize as
/// `null`; objects that are neither sequences nor maps are an error, as in Python.
pub(crate) fn to_json(value: &Value, style: &JsonStyle) -> Result<String, Error> {
    let mut out = String::new();
    write_json(&mut out, value, style, 0)?;
    Ok(out)
}

fn write_json(
    out: &mut String,
    value: &Value,
    style: &JsonStyle,
    depth: usize,
) -> Result<(), Error> {
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_number(out, value, true),
        ValueKind::String => {
            write_json_str(out, value.as_str().unwrap_or_default(), style.ensure_ascii)
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            write_container(out, style, depth, '[', ']', &items, |out, item, d| {
                write_json(out, item, style, d)
            })?;
        }
        ValueKind::Map => {
            let mut pairs = Vec::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                pairs.push((json_key(&key)?, item));
            }
            if style.sort_keys {
                pairs.sort_by(|a, b| a.0.cmp(&b.0));
            }
            write_container(out, style, depth, '{', '}', &pairs, |out, (k, v), d| {
                write_json_str(out, k, style.ensure_ascii);
                out.push_str(&style.key_sep);
                write_json(out, v, style, d)
            })?;
        }
        kind => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: a {kind} value is not JSON serializable"),
            ))
        }
    }
    Ok(())
}

/// Writes `open item sep item ... close`, one item per line when indented.
fn write_container<T>(
    out: &mut String,
    style: &JsonStyle,
    depth: usize,
    open: char,
    close: char,
    items: &[T],
    mut write_item: impl FnMut(&mut String, &T, usize) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if items.is_empty() {
        out.push(close);
        return Ok(());
    }
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(&style.item_sep);
        }
        if let Some(indent) = style.indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', indent * (depth + 1)));
        }
        write_item(out, item, depth + 1)?;
    }
    if let Some(indent) = style.indent {
        out.push('\n');
        out.extend(std::iter::repeat_n(' ', indent * depth));
    }
    out.push(close);
    Ok(())
}

/// Map keys become strings the way `json.dumps` converts them.
fn json_key(key: &Value) -> Result<String, Error> {
    Ok(match key.kind() {
        ValueKind::String => key.as_str().unwrap_or_default().to_string(),
        ValueKind::Bool => if key.is_true() { "true" } else { "false" }.to_string(),
        ValueKind::None | ValueKind::Undefined => "null".to_string(),
        ValueKind::Number => {
            let mut s = String::new();
            write_number(&mut s, key, true);
            s
        }
        kind => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: keys must be str, int, float, bool or None, not {kind}"),
            ))
        }
    })
}

/// A JSON string literal as Python's encoder writes it.
fn write_json_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && !c.is_ascii()) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Integers as digits; floats as Python's `repr(float)` (`1.0`, `1e+20`,
/// `1e-05`), or JSON's `NaN`/`Infinity` spellings when `json` is set.
fn write_number(out: &mut String, value: &Value, json: bool) {
    if value.is_integer() {
        let _ = write!(out, "{value}");
        return;
    }
    let x = f64::try_from(value.clone()).unwrap_or(f64::NAN);
    out.push_str(&python_float_repr(x, json));
}

/// Python's `repr(float)`: shortest round-trip digits, positional for
/// exponents in -4..16, else `d.ddde+XX`.
pub(crate) fn python_float_repr(x: f64, json: bool) -> String {
    if x.is_nan() {
        return if json { "NaN" } else { "nan" }.to_string();
    }
    if x.is_infinite() {
        let s = if json { "Infinity" } else { "inf" };
        return if x < 0.0 {
            format!("-{s}")
        } else {
            s.to_string()
        };
    }
    // Rust's `{:e}` gives the shortest round-trip mantissa, e.g. "1.5e20".
    let sci = format!("{x:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-4..16).contains(&exp) {
        let s = format!("{x}");
        if s.contains('.') {
            s
        } else {
            format!("{s}.0")
        }
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.abs())
    }
}

/// `str(value)` as Python prints it, for `{{ value }}`. Strings print
/// unquoted at the top level; inside containers they use `repr`.
pub(crate) fn write_python_str(out: &mut impl Write, value: &Value) -> std::fmt::Result {
    match value.kind() {
        ValueKind::Undefined => Ok(()),
        ValueKind::String => out.write_str(value.as_str().unwrap_or_default()),
        _ => write_python_repr(out, value),
    }
}

/// Python's `repr` of a value (lists as `['a', 1]`, dicts as `{'k': True}`).
fn write_python_repr(out: &mut impl Write, value: &Value) -> std::fmt::Result {
    match value.kind() {
        ValueKind::Undefined => Ok(()),
        ValueKind::None => out.write_str("None"),
        ValueKind::Bool => out.write_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number => {
            let mut s = String::new();
            write_number(&mut s, value, false);
            out.write_str(&s)
        }
        ValueKind::String => write_python_str_repr(out, value.as_str().unwrap_or_default()),
        ValueKind::Seq => {
            out.write_char('[')?;
            for (i, item) in value.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.write_str(", ")?;
                }
                write_python_repr(out, &item)?;
            }
            out.write_char(']')
        }
        ValueKind::Map => {
            out.write_char('{')?;
            for (i, key) in value.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.write_str(", ")?;
                }
                write_python_repr(out, &key)?;
                out.write_str(": ")?;
                write_python_repr(out, &value.get_item(&key).unwrap_or_default())?;
            }
            out.write_char('}')
        }
        // Iterables, callables, macros: minijinja's own form is as good as any.
        _ => write!(out, "{value}"),
    }
}

/// Python's `repr(str)`: single quotes unless the text holds `'` and no `"`.
fn write_python_str_repr(out: &mut impl Write, s: &str) -> std::fmt::Result {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.write_char(quote)?;
    for c in s.chars() {
        match c {
            '\\' => out.write_str("\\\\")?,
            '\n' => out.write_str("\\n")?,
            '\r' => out.write_str("\\r")?,
            '\t' => out.write_str("\\t")?,
            c if c == quote => {
                out.write_char('\\')?;
                out.write_char(c)?;
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => write!(out, "\\x{:02x}", c as u32)?,
            c => out.write_char(c)?,
        }
    }
    out.write_char(quote)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_repr_matches_python() {
        let cases = [
            (1.0, "1.0"),
            (2.5, "2.5"),
            (1e20, "1e+20"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (-1.5e-7, "-1.5e-07"),
            (0.1 + 0.2, "0.30000000000000004"),
        ];
        for (x, want) in cases {
            assert_eq!(python_float_repr(x, true), want, "{x}");
        }
        assert_eq!(python_float_repr(f64::NEG_INFINITY, true), "-Infinity");
    }

    #[test]
    fn repr_of_nested_values() {
        let v = Value::from(vec![
            Value::from("it's"),
            Value::from(true),
            Value::from(()),
            Value::from(3),
            Value::from("a\nb"),
        ]);
        let mut s = String::new();
        write_python_str(&mut s, &v).unwrap();
        assert_eq!(s, r#"["it's", True, None, 3, 'a\nb']"#);
    }

    #[test]
    fn json_escapes_controls_and_optionally_non_ascii() {
        let v = Value::from("é\u{1}😀");
        let mut style = JsonStyle::new(None);
        assert_eq!(to_json(&v, &style).unwrap(), "\"é\\u0001😀\"");
        style.ensure_ascii = true;
        assert_eq!(
            to_json(&v, &style).unwrap(),
            "\"\\u00e9\\u0001\\ud83d\\ude00\""
        );
    }
}
