//! Go's `text/template` syntax, the part alert templates use: text and `{{ }}` actions with
//! `{{-`/`-}}` trimming and comments; pipelines with declarations (`$x :=`, `$k, $v :=`) and
//! assignments (`$x =`); commands of fields (`.A.B`, `$x.A`, `(pipe).A`), variables,
//! literals and function calls; `if`/`else if`/`else`, `range` (with `else`, `break`,
//! `continue`), `with`/`else with`, `define`/`template`/`block`.

use super::TemplateError;

#[derive(Debug, Clone)]
pub(crate) enum Node {
    Text(String),
    Action(Pipeline),
    If { branches: Vec<(Pipeline, Vec<Node>)>, otherwise: Vec<Node> },
    With { branches: Vec<(Pipeline, Vec<Node>)>, otherwise: Vec<Node> },
    Range { pipe: Pipeline, body: Vec<Node>, otherwise: Vec<Node> },
    Template { name: String, pipe: Option<Pipeline> },
    Break,
    Continue,
}

#[derive(Debug, Clone)]
pub(crate) struct Pipeline {
    /// Variables declared (`:=`) or assigned (`=`) from the pipeline's value.
    pub vars: Vec<String>,
    pub declare: bool,
    pub commands: Vec<Vec<Operand>>,
}

#[derive(Debug, Clone)]
pub(crate) enum Operand {
    /// `.` followed by fields (`.` alone has none).
    Dot(Vec<String>),
    Var(String, Vec<String>),
    /// A parenthesised pipeline, then fields.
    Sub(Box<Pipeline>, Vec<String>),
    Ident(String),
    Str(String),
    Int(i64),
    Float(f64),
    Bool(bool),
    Nil,
}

/// Parsed templates: the main one and those `define`d.
pub(crate) struct Parsed {
    pub main: Vec<Node>,
    pub defined: Vec<(String, Vec<Node>)>,
}

pub(crate) fn parse(src: &str) -> Result<Parsed, TemplateError> {
    let tokens = split(src)?;
    let mut p = Parser { tokens, pos: 0, defined: Vec::new(), depth: 0 };
    let (main, end) = p.list()?;
    if let Some(e) = end {
        return Err(err(format!("unexpected {{{{{e}}}}}")));
    }
    Ok(Parsed { main, defined: p.defined })
}

fn err(msg: impl Into<String>) -> TemplateError {
    TemplateError::Parse(msg.into())
}

enum Piece {
    Text(String),
    Action(String),
}

/// Splits the source into text and the insides of actions, applying the trim markers and
/// dropping comments.
fn split(src: &str) -> Result<Vec<Piece>, TemplateError> {
    let mut out = Vec::new();
    let mut rest = src;
    let mut trim_next = false;
    while !rest.is_empty() {
        let Some(open) = rest.find("{{") else {
            let t = if trim_next { rest.trim_start() } else { rest };
            out.push(Piece::Text(t.to_string()));
            break;
        };
        let mut text = &rest[..open];
        if trim_next {
            text = text.trim_start();
        }
        let mut inner = &rest[open + 2..];
        if inner.starts_with("- ") || inner.starts_with("-\t") || inner.starts_with("-\n") || inner.starts_with("-\r") {
            text = text.trim_end();
            inner = &inner[1..];
        }
        if !text.is_empty() {
            out.push(Piece::Text(text.to_string()));
        }
        let close = find_close(inner).ok_or_else(|| err("unclosed action"))?;
        let mut body = &inner[..close];
        trim_next = false;
        if body.ends_with(" -") || body.ends_with("\t-") || body.ends_with("\n-") || body.ends_with("\r-") {
            body = &body[..body.len() - 1];
            trim_next = true;
        }
        rest = &inner[close + 2..];
        let b = body.trim();
        if b.starts_with("/*") {
            if !b.ends_with("*/") {
                return Err(err("unclosed comment"));
            }
            continue;
        }
        out.push(Piece::Action(b.to_string()));
    }
    Ok(out)
}

/// The `}}` that closes an action, skipping quoted strings.
fn find_close(s: &str) -> Option<usize> {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'"' | b'\'' => {
                let q = b[i];
                i += 1;
                while i < b.len() && b[i] != q {
                    if b[i] == b'\\' {
                        i += 1;
                    }
                    i += 1;
                }
            }
            b'`' => {
                i += 1;
                while i < b.len() && b[i] != b'`' {
                    i += 1;
                }
            }
            b'}' if b.get(i + 1) == Some(&b'}') => return Some(i),
            _ => {}
        }
        i += 1;
    }
    None
}

struct Parser {
    tokens: Vec<Piece>,
    pos: usize,
    defined: Vec<(String, Vec<Node>)>,
    depth: usize,
}

/// How a list of nodes ended: `end`, `else ...` (with what follows `else`), or the source.
type End = Option<String>;

impl Parser {
    fn list(&mut self) -> Result<(Vec<Node>, End), TemplateError> {
        self.depth += 1;
        if self.depth > 100 {
            return Err(err("template nests too deeply"));
        }
        let mut nodes = Vec::new();
        while self.pos < self.tokens.len() {
            let piece = std::mem::replace(&mut self.tokens[self.pos], Piece::Text(String::new()));
            self.pos += 1;
            let action = match piece {
                Piece::Text(t) => {
                    nodes.push(Node::Text(t));
                    continue;
                }
                Piece::Action(a) => a,
            };
            let (word, rest) = keyword(&action);
            match word {
                "end" => {
                    self.depth -= 1;
                    return Ok((nodes, Some("end".into())));
                }
                "else" => {
                    self.depth -= 1;
                    return Ok((nodes, Some(format!("else {rest}").trim().to_string())));
                }
                "if" | "with" => {
                    let mut branches = vec![(pipeline(rest)?, Vec::new())];
                    let mut otherwise = Vec::new();
                    loop {
                        let (body, end) = self.list()?;
                        if let Some(b) = branches.last_mut() {
                            b.1 = body;
                        }
                        match end.as_deref() {
                            Some("end") => break,
                            Some(e) if e.starts_with("else ") && keyword(&e[5..]).0 == word => {
                                branches.push((pipeline(keyword(&e[5..]).1)?, Vec::new()));
                            }
                            Some("else") => {
                                let (body, end) = self.list()?;
                                if end.as_deref() != Some("end") {
                                    return Err(err(format!("expected end after else in {word}")));
                                }
                                otherwise = body;
                                break;
                            }
                            _ => return Err(err(format!("unclosed {word}"))),
                        }
                    }
                    nodes.push(if word == "if" {
                        Node::If { branches, otherwise }
                    } else {
                        Node::With { branches, otherwise }
                    });
                }
                "range" => {
                    let pipe = pipeline(rest)?;
                    let (body, end) = self.list()?;
                    let otherwise = match end.as_deref() {
                        Some("end") => Vec::new(),
                        Some("else") => {
                            let (o, end) = self.list()?;
                            if end.as_deref() != Some("end") {
                                return Err(err("expected end after else in range"));
                            }
                            o
                        }
                        _ => return Err(err("unclosed range")),
                    };
                    nodes.push(Node::Range { pipe, body, otherwise });
                }
                "define" | "block" => {
                    let (name, after) = string_literal(rest)?;
                    let (body, end) = self.list()?;
                    if end.as_deref() != Some("end") {
                        return Err(err(format!("unclosed {word}")));
                    }
                    if word == "block" {
                        let pipe = if after.trim().is_empty() { None } else { Some(pipeline(after)?) };
                        nodes.push(Node::Template { name: name.clone(), pipe });
                    }
                    self.defined.push((name, body));
                }
                "template" => {
                    let (name, after) = string_literal(rest)?;
                    let pipe = if after.trim().is_empty() { None } else { Some(pipeline(after)?) };
                    nodes.push(Node::Template { name, pipe });
                }
                "break" => nodes.push(Node::Break),
                "continue" => nodes.push(Node::Continue),
                _ => nodes.push(Node::Action(pipeline(&action)?)),
            }
        }
        self.depth -= 1;
        Ok((nodes, None))
    }
}

fn keyword(action: &str) -> (&str, &str) {
    let end = action.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(action.len());
    let word = &action[..end];
    match word {
        "if" | "else" | "end" | "range" | "with" | "define" | "block" | "template" | "break" | "continue" => {
            (word, action[end..].trim())
        }
        _ => ("", action),
    }
}

fn string_literal(s: &str) -> Result<(String, &str), TemplateError> {
    let mut lx = Lexer::new(s);
    match lx.next()? {
        Some(Tok::Str(n)) => Ok((n, &s[lx.pos..])),
        _ => Err(err("expected a template name in quotes")),
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Dot(Vec<String>),
    Var(String, Vec<String>),
    Ident(String),
    Str(String),
    Num(String),
    Pipe,
    Open,
    /// `)` and the fields that follow it.
    Close(Vec<String>),
    Declare,
    Assign,
    Comma,
}

struct Lexer<'a> {
    s: &'a str,
    pos: usize,
}

impl<'a> Lexer<'a> {
    fn new(s: &'a str) -> Self {
        Lexer { s, pos: 0 }
    }

    fn fields(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        let b = self.s.as_bytes();
        while self.pos < b.len() && b[self.pos] == b'.' {
            let start = self.pos + 1;
            let mut end = start;
            while end < b.len() && (b[end].is_ascii_alphanumeric() || b[end] == b'_') {
                end += 1;
            }
            if end == start {
                break;
            }
            out.push(self.s[start..end].to_string());
            self.pos = end;
        }
        out
    }

    fn next(&mut self) -> Result<Option<Tok>, TemplateError> {
        let b = self.s.as_bytes();
        while self.pos < b.len() && b[self.pos].is_ascii_whitespace() {
            self.pos += 1;
        }
        let Some(&c) = b.get(self.pos) else { return Ok(None) };
        let tok = match c {
            b'|' => {
                self.pos += 1;
                Tok::Pipe
            }
            b'(' => {
                self.pos += 1;
                Tok::Open
            }
            b')' => {
                self.pos += 1;
                Tok::Close(self.fields())
            }
            b',' => {
                self.pos += 1;
                Tok::Comma
            }
            b':' if b.get(self.pos + 1) == Some(&b'=') => {
                self.pos += 2;
                Tok::Declare
            }
            b'=' => {
                self.pos += 1;
                Tok::Assign
            }
            b'.' if !b.get(self.pos + 1).is_some_and(|d| d.is_ascii_digit()) => {
                if b.get(self.pos + 1).is_some_and(|d| d.is_ascii_alphabetic() || *d == b'_') {
                    Tok::Dot(self.fields())
                } else {
                    self.pos += 1;
                    Tok::Dot(Vec::new())
                }
            }
            b'$' => {
                let start = self.pos;
                self.pos += 1;
                while self.pos < b.len() && (b[self.pos].is_ascii_alphanumeric() || b[self.pos] == b'_') {
                    self.pos += 1;
                }
                let name = self.s[start..self.pos].to_string();
                Tok::Var(name, self.fields())
            }
            b'"' => {
                let start = self.pos;
                self.pos += 1;
                while self.pos < b.len() && b[self.pos] != b'"' {
                    if b[self.pos] == b'\\' {
                        self.pos += 1;
                    }
                    self.pos += 1;
                }
                if self.pos >= b.len() {
                    return Err(err("unterminated quoted string"));
                }
                self.pos += 1;
                Tok::Str(unquote(&self.s[start + 1..self.pos - 1])?)
            }
            b'`' => {
                let start = self.pos + 1;
                let end = self.s[start..].find('`').ok_or_else(|| err("unterminated raw quoted string"))? + start;
                self.pos = end + 1;
                Tok::Str(self.s[start..end].to_string())
            }
            b'\'' => {
                let start = self.pos + 1;
                let end = self.s[start..].find('\'').ok_or_else(|| err("unterminated character constant"))? + start;
                self.pos = end + 1;
                let ch = unquote(&self.s[start..end])?;
                let mut cs = ch.chars();
                match (cs.next(), cs.next()) {
                    (Some(c), None) => Tok::Num((c as u32).to_string()),
                    _ => return Err(err("malformed character constant")),
                }
            }
            c if c.is_ascii_digit() || c == b'-' || c == b'+' || c == b'.' => {
                let start = self.pos;
                self.pos += 1;
                while self.pos < b.len()
                    && (b[self.pos].is_ascii_alphanumeric()
                        || b[self.pos] == b'.'
                        || b[self.pos] == b'_'
                        || ((b[self.pos] == b'-' || b[self.pos] == b'+')
                            && matches!(b[self.pos - 1], b'e' | b'E' | b'p' | b'P')))
                {
                    self.pos += 1;
                }
                Tok::Num(self.s[start..self.pos].to_string())
            }
            c if c.is_ascii_alphabetic() || c == b'_' => {
                let start = self.pos;
                while self.pos < b.len() && (b[self.pos].is_ascii_alphanumeric() || b[self.pos] == b'_') {
                    self.pos += 1;
                }
                Tok::Ident(self.s[start..self.pos].to_string())
            }
            _ => return Err(err(format!("unexpected {:?} in action", c as char))),
        };
        Ok(Some(tok))
    }
}

/// Go's interpreted string literal escapes.
fn unquote(s: &str) -> Result<String, TemplateError> {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('r') => out.push('\r'),
            Some('\\') => out.push('\\'),
            Some('"') => out.push('"'),
            Some('\'') => out.push('\''),
            Some('a') => out.push('\x07'),
            Some('b') => out.push('\x08'),
            Some('f') => out.push('\x0c'),
            Some('v') => out.push('\x0b'),
            Some(k @ ('x' | 'u' | 'U')) => {
                let n = match k {
                    'x' => 2,
                    'u' => 4,
                    _ => 8,
                };
                let hex: String = chars.by_ref().take(n).collect();
                let v = u32::from_str_radix(&hex, 16).map_err(|_| err("invalid escape in string"))?;
                out.push(char::from_u32(v).ok_or_else(|| err("invalid escape in string"))?);
            }
            _ => return Err(err("invalid escape in string")),
        }
    }
    Ok(out)
}

fn number(s: &str) -> Result<Operand, TemplateError> {
    let bad = || err(format!("bad number syntax: {s:?}"));
    let clean = s.replace('_', "");
    let (neg, digits) = match clean.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, clean.strip_prefix('+').unwrap_or(&clean)),
    };
    let radix = |p: &str, r: u32| -> Result<Operand, TemplateError> {
        let v = i64::from_str_radix(p, r).map_err(|_| bad())?;
        Ok(Operand::Int(if neg { -v } else { v }))
    };
    if let Some(h) = digits.strip_prefix("0x").or_else(|| digits.strip_prefix("0X")) {
        return radix(h, 16);
    }
    if let Some(o) = digits.strip_prefix("0o").or_else(|| digits.strip_prefix("0O")) {
        return radix(o, 8);
    }
    if let Some(bits) = digits.strip_prefix("0b").or_else(|| digits.strip_prefix("0B")) {
        return radix(bits, 2);
    }
    if digits.bytes().all(|c| c.is_ascii_digit()) && !digits.is_empty() {
        if digits.len() > 1 && digits.starts_with('0') {
            return radix(&digits[1..], 8);
        }
        if let Ok(v) = clean.parse::<i64>() {
            return Ok(Operand::Int(v));
        }
    }
    clean.parse::<f64>().map(Operand::Float).map_err(|_| bad())
}

fn pipeline(src: &str) -> Result<Pipeline, TemplateError> {
    let mut lx = Lexer::new(src);
    let mut toks = Vec::new();
    while let Some(t) = lx.next()? {
        toks.push(t);
        if toks.len() > 10_000 {
            return Err(err("action too long"));
        }
    }
    let mut pos = 0;
    let p = pipe_of(&toks, &mut pos, 0)?;
    if pos != toks.len() {
        return Err(err(format!("unexpected {:?} in action", toks[pos])));
    }
    Ok(p)
}

fn pipe_of(toks: &[Tok], pos: &mut usize, depth: usize) -> Result<Pipeline, TemplateError> {
    if depth > 50 {
        return Err(err("parentheses nest too deeply"));
    }
    let mut vars = Vec::new();
    let mut declare = false;
    // A declaration: `$x :=`, `$x =`, `$k, $v :=`.
    let mut look = *pos;
    let mut names = Vec::new();
    while let Some(Tok::Var(n, f)) = toks.get(look) {
        if !f.is_empty() {
            break;
        }
        names.push(n.clone());
        look += 1;
        match toks.get(look) {
            Some(Tok::Comma) => look += 1,
            Some(Tok::Declare) | Some(Tok::Assign) => {
                declare = toks[look] == Tok::Declare;
                vars = std::mem::take(&mut names);
                *pos = look + 1;
                break;
            }
            _ => break,
        }
    }
    let mut commands = Vec::new();
    let mut cmd = Vec::new();
    while let Some(t) = toks.get(*pos) {
        match t {
            Tok::Pipe => {
                if cmd.is_empty() {
                    return Err(err("missing command before |"));
                }
                commands.push(std::mem::take(&mut cmd));
                *pos += 1;
            }
            Tok::Close(_) => break,
            Tok::Open => {
                *pos += 1;
                let inner = pipe_of(toks, pos, depth + 1)?;
                let Some(Tok::Close(fields)) = toks.get(*pos) else { return Err(err("unclosed left paren")) };
                cmd.push(Operand::Sub(Box::new(inner), fields.clone()));
                *pos += 1;
            }
            Tok::Dot(f) => {
                cmd.push(Operand::Dot(f.clone()));
                *pos += 1;
            }
            Tok::Var(n, f) => {
                cmd.push(Operand::Var(n.clone(), f.clone()));
                *pos += 1;
            }
            Tok::Str(s) => {
                cmd.push(Operand::Str(s.clone()));
                *pos += 1;
            }
            Tok::Num(n) => {
                cmd.push(number(n)?);
                *pos += 1;
            }
            Tok::Ident(i) => {
                cmd.push(match i.as_str() {
                    "true" => Operand::Bool(true),
                    "false" => Operand::Bool(false),
                    "nil" => Operand::Nil,
                    _ => Operand::Ident(i.clone()),
                });
                *pos += 1;
            }
            Tok::Comma | Tok::Declare | Tok::Assign => return Err(err(format!("unexpected {t:?} in command"))),
        }
    }
    if !cmd.is_empty() {
        commands.push(cmd);
    }
    if commands.is_empty() {
        return Err(err("missing value for command"));
    }
    Ok(Pipeline { vars, declare, commands })
}
