//! GBNF (llama.cpp's grammar format) to llguidance's Lark dialect.
//!
//! A port of llguidance's own `gbnf_to_lark.py` (MIT), which ships only for
//! Python: the same parse and the same output shape, so a grammar behaves
//! here as it does through llguidance elsewhere. The steps:
//!
//! 1. parse the rules as llama.cpp's `grammar-parser` does: a rule ends at a
//!    newline unless inside parentheses or right after `|`; `#` comments;
//!    string literals, character classes and `.` with llama.cpp's escapes
//!    (`\x`, `\u`, `\U`, `\t`, `\r`, `\n`, `\\`, `\"`, `\[`, `\]`); `*`, `+`,
//!    `?` and `{m}`, `{m,}`, `{m,n}`; `<...>` token references pass through
//!    (llguidance reads `<name>` and `<[id]>` the same way);
//! 2. `root` becomes Lark's `start`;
//! 3. every rule built only of literals, classes and other such rules
//!    becomes a Lark terminal (an upper-case name): llguidance then matches
//!    it with its lexer instead of its Earley parser, one regular language
//!    instead of a rule per character (both faster and what the Python
//!    converter does);
//! 4. names become Lark names: `-` to `_`, `camelCase` to `camel_case`,
//!    upper case for terminals, made unique where that merges two names.
//!
//! Like the Python converter this is not a drop-in replacement in every
//! corner: llguidance's lexer extends a terminal as far as it can, where
//! GBNF's character-level parse would also try stopping early. A grammar
//! that needs a terminal to stop short is refused text GBNF accepts: with
//! `ident ::= [a-z]+ ws`, `ws ::= [ \t\n]*` and a line rule ending in
//! `ident "\n"`, the terminal's `ws` takes the newline the line needs.
//! Write such a grammar in Lark ([`Constraint::Lark`](super::Constraint::Lark))
//! with the terminals where they belong.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

/// A GBNF syntax error with where it happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GbnfError {
    /// What is wrong.
    pub(crate) message: String,
    /// 1-based line and column (in characters), 0 when the error is not
    /// tied to a place.
    pub(crate) line: usize,
    /// 1-based column.
    pub(crate) column: usize,
}

impl std::fmt::Display for GbnfError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.line == 0 {
            write!(f, "{}", self.message)
        } else {
            let (line, column) = (self.line, self.column);
            write!(f, "line {line}, column {column}: {}", self.message)
        }
    }
}

/// One expression of a rule body.
#[derive(Debug, Clone, PartialEq)]
enum Node {
    /// A string literal (decoded).
    Literal(String),
    /// A regex body for `/.../` (a character class or `.`).
    Regex(String),
    /// A token reference `<...>`, copied verbatim.
    Token(String),
    /// A rule named in the GBNF source.
    Ref(String),
    /// `node{min,max}`; `max` `None` is unbounded.
    Repeat {
        node: Box<Node>,
        min: u32,
        max: Option<u32>,
    },
    /// Juxtaposition.
    Seq(Vec<Node>),
    /// `a | b`.
    Alt(Vec<Node>),
}

impl Node {
    /// Drops one-element sequences and alternations, recursively.
    fn simplify(self) -> Node {
        match self {
            Node::Seq(nodes) => {
                let mut nodes: Vec<Node> = nodes.into_iter().map(Node::simplify).collect();
                if nodes.len() == 1 {
                    nodes.remove(0)
                } else {
                    Node::Seq(nodes)
                }
            }
            Node::Alt(nodes) => {
                let mut nodes: Vec<Node> = nodes.into_iter().map(Node::simplify).collect();
                if nodes.len() == 1 {
                    nodes.remove(0)
                } else {
                    Node::Alt(nodes)
                }
            }
            Node::Repeat { node, min, max } => Node::Repeat {
                node: Box::new(node.simplify()),
                min,
                max,
            },
            other => other,
        }
    }

    /// Calls `f` on every rule this node refers to.
    fn for_each_ref(&self, f: &mut dyn FnMut(&str)) {
        match self {
            Node::Ref(name) => f(name),
            Node::Repeat { node, .. } => node.for_each_ref(f),
            Node::Seq(nodes) | Node::Alt(nodes) => nodes.iter().for_each(|n| n.for_each_ref(f)),
            Node::Literal(_) | Node::Regex(_) | Node::Token(_) => {}
        }
    }

    /// Whether the node is a regular language over `terminals` (rules
    /// already known to be terminals).
    fn is_terminal(&self, terminals: &HashSet<String>) -> bool {
        match self {
            Node::Literal(_) | Node::Regex(_) => true,
            Node::Token(_) => false,
            Node::Ref(name) => terminals.contains(name),
            Node::Repeat { node, .. } => node.is_terminal(terminals),
            Node::Seq(nodes) | Node::Alt(nodes) => nodes.iter().all(|n| n.is_terminal(terminals)),
        }
    }

    /// The node in Lark syntax; `top` leaves an alternation bare (a rule body).
    fn write_lark(&self, names: &HashMap<String, String>, top: bool, out: &mut String) {
        match self {
            Node::Literal(s) => out.push_str(&json_string(s)),
            Node::Regex(rx) => {
                out.push('/');
                out.push_str(rx);
                out.push('/');
            }
            Node::Token(t) => out.push_str(t),
            Node::Ref(name) => out.push_str(names.get(name).map_or(name.as_str(), String::as_str)),
            Node::Repeat { node, min, max } => {
                let atomic = matches!(
                    **node,
                    Node::Literal(_) | Node::Regex(_) | Node::Token(_) | Node::Ref(_)
                );
                if !atomic {
                    out.push('(');
                }
                node.write_lark(names, false, out);
                if !atomic {
                    out.push(')');
                }
                match (min, max) {
                    (0, None) => out.push('*'),
                    (1, None) => out.push('+'),
                    (0, Some(1)) => out.push('?'),
                    (m, None) => {
                        let _ = write!(out, "{{{m},}}");
                    }
                    (m, Some(n)) if m == n => {
                        let _ = write!(out, "{{{m}}}");
                    }
                    (m, Some(n)) => {
                        let _ = write!(out, "{{{m},{n}}}");
                    }
                }
            }
            Node::Seq(nodes) if nodes.is_empty() => out.push_str("\"\""),
            Node::Seq(nodes) => {
                for (i, n) in nodes.iter().enumerate() {
                    if i > 0 {
                        out.push(' ');
                    }
                    n.write_lark(names, false, out);
                }
            }
            Node::Alt(nodes) => {
                if !top {
                    out.push('(');
                }
                for (i, n) in nodes.iter().enumerate() {
                    if i > 0 {
                        out.push_str(if top { "\n    | " } else { " | " });
                    }
                    n.write_lark(names, false, out);
                }
                if !top {
                    out.push(')');
                }
            }
        }
    }
}

/// `s` as a Lark string literal: llguidance reads those as JSON strings.
fn json_string(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

/// `c` for use inside a regex character class: letters and digits as they
/// are, everything else as `\x{..}`, which no class syntax or Lark's `/`
/// delimiter can misread.
fn class_char(c: char, out: &mut String) {
    if c.is_ascii_alphanumeric() {
        out.push(c);
    } else {
        let _ = write!(out, "\\x{{{:x}}}", u32::from(c));
    }
}

/// The GBNF parser: byte offsets into the source, which is walked by chars.
struct Parser<'a> {
    src: &'a str,
    pos: usize,
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<char> {
        self.src[self.pos..].chars().next()
    }

    /// The char after the next one.
    fn peek2(&self) -> Option<char> {
        self.src[self.pos..].chars().nth(1)
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += c.len_utf8();
        Some(c)
    }

    fn error(&self, message: impl Into<String>) -> GbnfError {
        let before = &self.src[..self.pos];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        GbnfError {
            message: message.into(),
            line,
            column,
        }
    }

    /// Skips blanks and `#` comments, and newlines where `newlines`.
    fn skip_space(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            match c {
                ' ' | '\t' => {
                    self.bump();
                }
                '\r' | '\n' if newlines => {
                    self.bump();
                }
                '#' => {
                    while self.peek().is_some_and(|c| c != '\r' && c != '\n') {
                        self.bump();
                    }
                }
                _ => break,
            }
        }
    }

    fn is_word_char(c: char) -> bool {
        c.is_ascii_alphanumeric() || c == '-' || c == '_'
    }

    fn parse_grammar(&mut self) -> Result<Vec<(String, Node)>, GbnfError> {
        let mut rules = Vec::new();
        self.skip_space(true);
        while self.peek().is_some() {
            rules.push(self.parse_rule()?);
            self.skip_space(true);
        }
        Ok(rules)
    }

    fn parse_rule(&mut self) -> Result<(String, Node), GbnfError> {
        let name = self.parse_name()?;
        self.skip_space(false);
        if !self.src[self.pos..].starts_with("::=") {
            return Err(self.error(format!("expected `::=` after the rule name `{name}`")));
        }
        self.pos += 3;
        self.skip_space(true);
        let body = self.parse_alternatives(false)?;
        match self.peek() {
            None | Some('\r' | '\n') => Ok((name, body)),
            Some(c) => Err(self.error(format!(
                "unexpected `{}`; a rule ends at the end of its line",
                c.escape_debug()
            ))),
        }
    }

    fn parse_name(&mut self) -> Result<String, GbnfError> {
        let start = self.pos;
        while self.peek().is_some_and(Self::is_word_char) {
            self.bump();
        }
        if self.pos == start {
            return Err(self.error("expected a rule name (letters, digits, `-`, `_`)"));
        }
        Ok(self.src[start..self.pos].to_string())
    }

    fn parse_alternatives(&mut self, nested: bool) -> Result<Node, GbnfError> {
        let mut alternatives = vec![self.parse_sequence(nested)?];
        loop {
            self.skip_space(nested);
            if self.peek() != Some('|') {
                break;
            }
            self.bump();
            self.skip_space(true);
            alternatives.push(self.parse_sequence(nested)?);
        }
        Ok(Node::Alt(alternatives))
    }

    fn parse_sequence(&mut self, nested: bool) -> Result<Node, GbnfError> {
        let mut nodes = Vec::new();
        while let Some(c) = self.peek() {
            if c == '|' || c == ')' || (!nested && (c == '\r' || c == '\n')) {
                break;
            }
            let node = match c {
                '"' => self.parse_literal()?,
                '[' => self.parse_class()?,
                '(' => self.parse_group()?,
                '<' => self.parse_token()?,
                '.' => {
                    self.bump();
                    Node::Regex("(?s:.)".to_string())
                }
                c if Self::is_word_char(c) => Node::Ref(self.parse_name()?),
                c => return Err(self.error(format!("unexpected `{}`", c.escape_debug()))),
            };
            self.skip_space(nested);
            let node = self.parse_repetition(node)?;
            if let Some(node) = node {
                nodes.push(node);
            }
            self.skip_space(nested);
        }
        Ok(Node::Seq(nodes))
    }

    fn parse_group(&mut self) -> Result<Node, GbnfError> {
        self.bump();
        self.skip_space(true);
        let inner = self.parse_alternatives(true)?;
        if self.peek() != Some(')') {
            return Err(self.error("expected `)`"));
        }
        self.bump();
        Ok(inner)
    }

    /// `<...>`: a token by name or `<[id]>`, for llguidance to resolve.
    fn parse_token(&mut self) -> Result<Node, GbnfError> {
        let start = self.pos;
        while let Some(c) = self.bump() {
            if c == '>' {
                return Ok(Node::Token(self.src[start..self.pos].to_string()));
            }
            if c == '\n' {
                break;
            }
        }
        Err(self.error("a token reference `<...>` is missing its `>`"))
    }

    /// A postfix operator on `node`, if any; `None` for `{0}`, which matches
    /// only the empty string.
    fn parse_repetition(&mut self, node: Node) -> Result<Option<Node>, GbnfError> {
        let (min, max) = match self.peek() {
            Some('*') => (0, None),
            Some('+') => (1, None),
            Some('?') => (0, Some(1)),
            Some('{') => {
                self.bump();
                self.skip_space(true);
                let min = self.parse_int()?;
                self.skip_space(true);
                let max = match self.peek() {
                    Some('}') => Some(min),
                    Some(',') => {
                        self.bump();
                        self.skip_space(true);
                        let max = match self.peek() {
                            Some(c) if c.is_ascii_digit() => Some(self.parse_int()?),
                            _ => None,
                        };
                        self.skip_space(true);
                        if self.peek() != Some('}') {
                            return Err(self.error("expected `}` to close the repetition"));
                        }
                        max
                    }
                    _ => return Err(self.error("expected `,` or `}` in the repetition")),
                };
                if max.is_some_and(|max| max < min) {
                    return Err(
                        self.error(format!("repetition {{{min},..}} has a smaller maximum"))
                    );
                }
                if max == Some(0) {
                    self.bump();
                    return Ok(None);
                }
                (min, max)
            }
            _ => return Ok(Some(node)),
        };
        self.bump();
        let node = Box::new(node);
        Ok(Some(Node::Repeat { node, min, max }))
    }

    fn parse_int(&mut self) -> Result<u32, GbnfError> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.bump();
        }
        self.src[start..self.pos]
            .parse()
            .map_err(|_| self.error("expected a repetition count"))
    }

    /// One character of a literal or class, escapes decoded.
    fn parse_char(&mut self) -> Result<char, GbnfError> {
        let Some(c) = self.bump() else {
            return Err(self.error("unexpected end of the grammar"));
        };
        if c != '\\' {
            return Ok(c);
        }
        let digits = match self.bump() {
            Some('x') => 2,
            Some('u') => 4,
            Some('U') => 8,
            Some('t') => return Ok('\t'),
            Some('r') => return Ok('\r'),
            Some('n') => return Ok('\n'),
            Some(c @ ('\\' | '"' | '[' | ']')) => return Ok(c),
            Some(c) => return Err(self.error(format!("unknown escape `\\{c}`"))),
            None => return Err(self.error("unexpected end of the grammar after `\\`")),
        };
        let start = self.pos;
        for _ in 0..digits {
            if !self.bump().is_some_and(|c| c.is_ascii_hexdigit()) {
                return Err(self.error(format!("expected {digits} hex digits in the escape")));
            }
        }
        u32::from_str_radix(&self.src[start..self.pos], 16)
            .ok()
            .and_then(char::from_u32)
            .ok_or_else(|| self.error("the escape is not a Unicode scalar value"))
    }

    fn parse_literal(&mut self) -> Result<Node, GbnfError> {
        self.bump();
        let mut s = String::new();
        loop {
            if self.peek() == Some('"') {
                self.bump();
                return Ok(Node::Literal(s));
            }
            if self.peek().is_none() {
                return Err(self.error("a string literal is missing its closing `\"`"));
            }
            s.push(self.parse_char()?);
        }
    }

    /// `[...]` / `[^...]`, as llama.cpp reads it: `a-b` is a range unless
    /// the `-` is last.
    fn parse_class(&mut self) -> Result<Node, GbnfError> {
        self.bump();
        let mut rx = String::from("[");
        if self.peek() == Some('^') {
            self.bump();
            rx.push('^');
        }
        let mut empty = true;
        loop {
            match self.peek() {
                Some(']') => break,
                None => return Err(self.error("a character class is missing its `]`")),
                Some(_) => {}
            }
            let first = self.parse_char()?;
            class_char(first, &mut rx);
            if self.peek() == Some('-') && self.peek2().is_some_and(|c| c != ']') {
                self.bump();
                let last = self.parse_char()?;
                if last < first {
                    let range = format!("{}-{}", first.escape_debug(), last.escape_debug());
                    return Err(self.error(format!("the range `{range}` is reversed")));
                }
                rx.push('-');
                class_char(last, &mut rx);
            }
            empty = false;
        }
        self.bump();
        if empty {
            return Err(self.error("an empty character class `[]` matches nothing"));
        }
        rx.push(']');
        Ok(Node::Regex(rx))
    }
}

/// The Lark name of GBNF rule `name`: `-` to `_`, `camelCase` to
/// `camel_case`, upper case for terminals; a leading digit gets a prefix.
fn lark_name(name: &str, terminal: bool) -> String {
    let mut out = String::with_capacity(name.len() + 2);
    let mut prev_lower = false;
    for c in name.chars() {
        if c.is_ascii_uppercase() && prev_lower {
            out.push('_');
        }
        prev_lower = c.is_ascii_lowercase();
        out.push(if c == '-' { '_' } else { c });
    }
    if out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert_str(0, "r_");
    }
    if terminal {
        out.to_ascii_uppercase()
    } else {
        out.to_ascii_lowercase()
    }
}

/// Converts a GBNF grammar (its start rule is `root`) to llguidance's Lark.
pub(crate) fn gbnf_to_lark(src: &str) -> Result<String, GbnfError> {
    let unplaced = |message: String| GbnfError {
        message,
        line: 0,
        column: 0,
    };
    let parsed = Parser { src, pos: 0 }.parse_grammar()?;
    let mut rules: Vec<(String, Node)> = Vec::with_capacity(parsed.len());
    let mut defined = HashSet::new();
    for (name, body) in parsed {
        if !defined.insert(name.clone()) {
            return Err(unplaced(format!("rule `{name}` is defined twice")));
        }
        rules.push((name, body.simplify()));
    }
    if !defined.contains("root") {
        return Err(unplaced("there is no `root` rule to start from".into()));
    }
    for (name, body) in &rules {
        let mut missing = None;
        body.for_each_ref(&mut |r| {
            if missing.is_none() && !defined.contains(r) {
                missing = Some(r.to_string());
            }
        });
        if let Some(r) = missing {
            return Err(unplaced(format!(
                "rule `{name}` uses `{r}`, which is not defined"
            )));
        }
    }
    let mut terminals = HashSet::new();
    loop {
        let before = terminals.len();
        for (name, body) in &rules {
            if name != "root" && !terminals.contains(name) && body.is_terminal(&terminals) {
                terminals.insert(name.clone());
            }
        }
        if terminals.len() == before {
            break;
        }
    }
    let mut names = HashMap::new();
    let mut taken = HashSet::from(["start".to_string()]);
    names.insert("root".to_string(), "start".to_string());
    for (name, _) in rules.iter().filter(|(n, _)| n != "root") {
        let base = lark_name(name, terminals.contains(name));
        let mut candidate = base.clone();
        let mut n = 2;
        while !taken.insert(candidate.clone()) {
            candidate = format!("{base}_{n}");
            n += 1;
        }
        names.insert(name.clone(), candidate);
    }
    let mut out = String::new();
    for (name, body) in &rules {
        out.push_str(&names[name]);
        out.push_str(": ");
        body.write_lark(&names, true, &mut out);
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_becomes_start_and_literals_are_json_strings() {
        let lark = gbnf_to_lark("root ::= \"yes\" | \"no\\n\"\n").expect("converts");
        assert_eq!(lark, "start: \"yes\"\n    | \"no\\n\"\n");
    }

    #[test]
    fn character_rules_become_terminals() {
        let src = "root ::= ident (\",\" ident)*\nident ::= [a-zA-Z_] [a-z0-9-]*\n";
        let lark = gbnf_to_lark(src).expect("converts");
        assert_eq!(
            lark,
            "start: IDENT (\",\" IDENT)*\nIDENT: /[a-zA-Z\\x{5f}]/ /[a-z0-9\\x{2d}]/*\n"
        );
    }

    #[test]
    fn recursive_rules_stay_rules_and_names_become_lark_names() {
        let src = "root ::= list-item\nlist-item ::= \"a\" list-item? | myRule\nmyRule ::= [0-9]{2,4} \"x\"{3} \"y\"{0}\n";
        let lark = gbnf_to_lark(src).expect("converts");
        assert_eq!(
            lark,
            "start: list_item\nlist_item: \"a\" list_item?\n    | MY_RULE\nMY_RULE: /[0-9]/{2,4} \"x\"{3}\n"
        );
    }

    #[test]
    fn rules_continue_inside_parentheses_and_after_bars() {
        let src = "root ::= (\n  \"a\" # one\n  | \"b\"\n) |\n  \"c\"\n# done\n";
        let lark = gbnf_to_lark(src).expect("converts");
        assert_eq!(lark, "start: (\"a\" | \"b\")\n    | \"c\"\n");
    }

    #[test]
    fn escapes_decode_as_llamacpp_reads_them() {
        let src = "root ::= \"\\x41\\u00e9\\U0001F600\\\"\" [^\"\\\\\\x00-\\x1F] .\n";
        let lark = gbnf_to_lark(src).expect("converts");
        assert_eq!(
            lark,
            "start: \"Aé😀\\\"\" /[^\\x{22}\\x{5c}\\x{0}-\\x{1f}]/ /(?s:.)/\n"
        );
    }

    /// Whether llguidance, given `gbnf` converted, accepts exactly `text`
    /// (one token per byte).
    fn accepts(gbnf: &str, text: &str) -> bool {
        use llguidance::api::TopLevelGrammar;
        use llguidance::toktrie::ApproximateTokEnv;
        let lark = gbnf_to_lark(gbnf).expect("converts");
        let mut factory =
            llguidance::ParserFactory::new_simple(&ApproximateTokEnv::single_byte_env())
                .expect("factory");
        factory.quiet();
        let parser = factory
            .create_parser(TopLevelGrammar::from_lark(lark.clone()))
            .unwrap_or_else(|e| panic!("llguidance refused\n{lark}\n{e}"));
        let mut m = llguidance::Matcher::new(Ok(parser));
        let tokens: Vec<u32> = text.bytes().map(u32::from).collect();
        let n = m.try_consume_tokens(&tokens).expect("consume");
        n == tokens.len() && m.is_accepting().expect("accepting")
    }

    /// llama.cpp's `grammars/json.gbnf`.
    const JSON_GBNF: &str = r#"root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
"#;

    #[test]
    fn llamacpp_grammars_compile_and_match() {
        assert!(accepts(
            JSON_GBNF,
            r#"{"a": [1, -2.5e3, "x\n\u00e9"], "b": {}}"#
        ));
        assert!(accepts(JSON_GBNF, "{\n  \"k\": true}"));
        assert!(!accepts(JSON_GBNF, r#"{"a": 01x}"#));
        assert!(!accepts(JSON_GBNF, r#"[1]"#));
        let arithmetic = "root  ::= (expr \"=\" ws term \"\\n\")+\nexpr  ::= term ([-+*/] term)*\nterm  ::= ident | num | \"(\" ws expr \")\" ws\nident ::= [a-z] [a-z0-9_]* ws\nnum   ::= [0-9]+ ws\nws    ::= [ \\t\\n]*\n";
        assert!(accepts(arithmetic, "(a+1)*b2 = (c)\n"));
        // The documented difference: `ident` is a terminal ending in `ws`,
        // and llguidance's lexer extends a terminal as far as it can, so
        // its `ws` takes the newline the line needs.
        assert!(!accepts(arithmetic, "a = b\n"));
        assert!(!accepts(arithmetic, "a+ = c\n"));
        let yes_no = "root ::= \"yes\" | \"no\"";
        assert!(accepts(yes_no, "yes") && accepts(yes_no, "no"));
        assert!(!accepts(yes_no, "yesno"));
        let any = "root ::= \"<\" . . \">\"{2,}";
        assert!(accepts(any, "<\n/>>"));
        assert!(!accepts(any, "<ab>"));
    }

    #[test]
    fn errors_say_where() {
        let cases = [
            ("root ::= \"abc\n", 2),
            ("root = \"a\"\n", 1),
            ("root ::= [z-a]\n", 1),
            ("root ::= x\n", 0),
            ("item ::= \"a\"\n", 0),
            ("root ::= \"a\" )\n", 1),
            ("root ::= \"\\q\"\n", 1),
            ("root ::= \"a\"{3,1}\n", 1),
            ("root ::= \"a\"\nroot ::= \"b\"\n", 0),
        ];
        for (src, line) in cases {
            let e = gbnf_to_lark(src).expect_err(src);
            assert_eq!(e.line, line, "{src:?}: {e}");
        }
    }
}
