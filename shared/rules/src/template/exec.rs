//! Executes parsed templates over [`Value`]s as Go's `text/template` does: truthiness,
//! field lookup on maps (a missing key is `<no value>`) and structs, variables scoped to
//! their block, pipelines passing their value as the next command's last argument.

use super::funcs;
use super::parse::{Node, Operand, Pipeline};
use super::{Env, TemplateError, Value};
use std::collections::BTreeMap;

/// What rendering may cost: a template that loops or recurses without end is stopped.
const MAX_OUTPUT: usize = 1 << 20;
const MAX_STEPS: usize = 1_000_000;
const MAX_DEPTH: usize = 64;
/// The most bytes of strings one rendering may produce in all (values held in variables
/// included, not only output): doubling a string in a loop stops here.
const MAX_PRODUCED: usize = 16 << 20;

pub(crate) struct Exec<'a> {
    pub env: &'a Env<'a>,
    pub defined: &'a [(String, Vec<Node>)],
    pub out: String,
    steps: usize,
    depth: usize,
    produced: usize,
    vars: Vec<(String, Value)>,
}

enum Flow {
    Normal,
    Break,
    Continue,
}

fn err(msg: impl Into<String>) -> TemplateError {
    TemplateError::Exec(msg.into())
}

impl<'a> Exec<'a> {
    pub fn new(env: &'a Env<'a>, defined: &'a [(String, Vec<Node>)], dot: &Value) -> Self {
        Exec {
            env,
            defined,
            out: String::new(),
            steps: 0,
            depth: 0,
            produced: 0,
            vars: vec![("$".into(), dot.clone())],
        }
    }

    pub fn run(&mut self, nodes: &[Node], dot: &Value) -> Result<(), TemplateError> {
        self.list(nodes, dot).map(|_| ())
    }

    fn tick(&mut self) -> Result<(), TemplateError> {
        self.steps += 1;
        if self.steps > MAX_STEPS || self.out.len() > MAX_OUTPUT {
            return Err(err("template too expensive: stopped"));
        }
        Ok(())
    }

    /// Counts a value a function produced against [`MAX_PRODUCED`].
    fn charge(&mut self, v: Value) -> Result<Value, TemplateError> {
        if let Value::Str(s) = &v {
            self.produced = self.produced.saturating_add(s.len());
            if s.len() > MAX_OUTPUT || self.produced > MAX_PRODUCED {
                return Err(err("template too expensive: stopped"));
            }
        }
        Ok(v)
    }

    fn list(&mut self, nodes: &[Node], dot: &Value) -> Result<Flow, TemplateError> {
        let mark = self.vars.len();
        let flow = self.list_inner(nodes, dot);
        self.vars.truncate(mark);
        flow
    }

    fn list_inner(&mut self, nodes: &[Node], dot: &Value) -> Result<Flow, TemplateError> {
        for n in nodes {
            self.tick()?;
            match n {
                Node::Text(t) => self.out.push_str(t),
                Node::Action(p) => {
                    let v = self.pipeline(p, dot)?;
                    if p.vars.is_empty() {
                        self.out.push_str(&v.print());
                    }
                }
                Node::If { branches, otherwise } | Node::With { branches, otherwise } => {
                    let with = matches!(n, Node::With { .. });
                    let mark = self.vars.len();
                    let mut taken = None;
                    for (cond, body) in branches {
                        let v = self.pipeline(cond, dot)?;
                        if v.truthy() {
                            taken = Some((body, v));
                            break;
                        }
                    }
                    let flow = match taken {
                        Some((body, v)) => self.list(body, if with { &v } else { dot })?,
                        None => self.list(otherwise, dot)?,
                    };
                    self.vars.truncate(mark);
                    if !matches!(flow, Flow::Normal) {
                        return Ok(flow);
                    }
                }
                Node::Range { pipe, body, otherwise } => {
                    let mark = self.vars.len();
                    let mut plain = pipe.clone();
                    plain.vars.clear();
                    let v = self.pipeline(&plain, dot)?;
                    // Counted ranges are walked, not materialised: `range 1000000` holds
                    // nothing, and every iteration is a step.
                    let items: Box<dyn Iterator<Item = (Value, Value)>> = match v {
                        Value::List(l) => Box::new(l.into_iter().enumerate().map(|(i, x)| (Value::Int(i as i64), x))),
                        Value::Map(m) => Box::new(m.into_iter().map(|(k, x)| (Value::Str(k), x))),
                        Value::Int(n) if n > MAX_STEPS as i64 => return Err(err("template too expensive: stopped")),
                        Value::Int(n) if n >= 0 => Box::new((0..n).map(|i| (Value::Int(i), Value::Int(i)))),
                        Value::Nil | Value::NoValue => Box::new(std::iter::empty()),
                        other => return Err(err(format!("range can't iterate over {}", other.print()))),
                    };
                    let mut any = false;
                    for (k, x) in items {
                        any = true;
                        self.tick()?;
                        let inner = self.vars.len();
                        match pipe.vars.as_slice() {
                            [] => {}
                            [e] => self.vars.push((e.clone(), x.clone())),
                            [i, e] => {
                                self.vars.push((i.clone(), k));
                                self.vars.push((e.clone(), x.clone()));
                            }
                            _ => return Err(err("too many variables in range")),
                        }
                        let flow = self.list(body, &x)?;
                        self.vars.truncate(inner);
                        if matches!(flow, Flow::Break) {
                            break;
                        }
                    }
                    if !any {
                        self.list(otherwise, dot)?;
                    }
                    self.vars.truncate(mark);
                }
                Node::Template { name, pipe } => {
                    let body = self
                        .defined
                        .iter()
                        .rev()
                        .find(|(n, _)| n == name)
                        .map(|(_, b)| b)
                        .ok_or_else(|| err(format!("no such template {name:?}")))?;
                    let v = match pipe {
                        Some(p) => self.pipeline(p, dot)?,
                        None => Value::Nil,
                    };
                    self.depth += 1;
                    if self.depth > MAX_DEPTH {
                        return Err(err("exceeded maximum template depth"));
                    }
                    // A template runs with its own variables: only `$`, its dot.
                    let saved = std::mem::replace(&mut self.vars, vec![("$".into(), v.clone())]);
                    let r = self.list(body, &v);
                    self.vars = saved;
                    self.depth -= 1;
                    r?;
                }
                Node::Break => return Ok(Flow::Break),
                Node::Continue => return Ok(Flow::Continue),
            }
        }
        Ok(Flow::Normal)
    }

    fn pipeline(&mut self, p: &Pipeline, dot: &Value) -> Result<Value, TemplateError> {
        let mut value: Option<Value> = None;
        for cmd in &p.commands {
            value = Some(self.command(cmd, dot, value)?);
        }
        let v = value.unwrap_or(Value::Nil);
        match (p.declare, p.vars.as_slice()) {
            (_, []) => {}
            (true, names) => {
                for n in names {
                    self.vars.push((n.clone(), v.clone()));
                }
            }
            (false, names) => {
                for n in names {
                    let slot = self
                        .vars
                        .iter_mut()
                        .rev()
                        .find(|(x, _)| x == n)
                        .ok_or_else(|| err(format!("undefined variable: {n}")))?;
                    slot.1 = v.clone();
                }
            }
        }
        Ok(v)
    }

    fn command(&mut self, cmd: &[Operand], dot: &Value, last: Option<Value>) -> Result<Value, TemplateError> {
        self.tick()?;
        if let Some(Operand::Ident(name)) = cmd.first() {
            if name == "and" || name == "or" {
                return self.and_or(name == "and", &cmd[1..], dot, last);
            }
            let mut args = Vec::with_capacity(cmd.len());
            for a in &cmd[1..] {
                args.push(self.operand(a, dot)?);
            }
            if let Some(l) = last {
                args.push(l);
            }
            return self.call(name, args);
        }
        if cmd.len() > 1 || last.is_some() {
            return Err(err(format!("can't give argument to non-function {:?}", cmd[0])));
        }
        self.operand(&cmd[0], dot)
    }

    /// Go's `and` and `or` (1.18 on): arguments evaluated in order until one decides, so
    /// `and (query "x") (query "x" | first)` does not run the second query on nothing.
    fn and_or(&mut self, and: bool, ops: &[Operand], dot: &Value, last: Option<Value>) -> Result<Value, TemplateError> {
        let name = if and { "and" } else { "or" };
        if ops.is_empty() && last.is_none() {
            return Err(err(format!("wrong number of args for {name}: want at least 1 got 0")));
        }
        let mut value = Value::Nil;
        for op in ops {
            value = self.operand(op, dot)?;
            if value.truthy() != and {
                return Ok(value);
            }
        }
        Ok(last.unwrap_or(value))
    }

    fn call(&mut self, name: &str, args: Vec<Value>) -> Result<Value, TemplateError> {
        let v = funcs::call(self.env, name, args)?;
        self.charge(v)
    }

    fn operand(&mut self, op: &Operand, dot: &Value) -> Result<Value, TemplateError> {
        Ok(match op {
            Operand::Dot(fields) => fields_of(dot.clone(), fields)?,
            Operand::Var(name, fields) => {
                let v = self
                    .vars
                    .iter()
                    .rev()
                    .find(|(n, _)| n == name)
                    .map(|(_, v)| v.clone())
                    .ok_or_else(|| err(format!("undefined variable: {name}")))?;
                fields_of(v, fields)?
            }
            Operand::Sub(p, fields) => {
                let v = self.pipeline(p, dot)?;
                fields_of(v, fields)?
            }
            Operand::Ident(name) => self.call(name, Vec::new())?,
            Operand::Str(s) => Value::Str(s.clone()),
            Operand::Int(i) => Value::Int(*i),
            Operand::Float(f) => Value::Float(*f),
            Operand::Bool(b) => Value::Bool(*b),
            Operand::Nil => Value::Nil,
        })
    }
}

fn fields_of(mut v: Value, fields: &[String]) -> Result<Value, TemplateError> {
    for f in fields {
        v = match v {
            Value::Map(m) => m.get(f).cloned().unwrap_or(Value::NoValue),
            Value::Struct(s) => {
                s.get(f.as_str()).cloned().ok_or_else(|| err(format!("can't evaluate field {f} in type struct")))?
            }
            Value::Sample(s) => match f.as_str() {
                "Labels" => Value::Map(s.labels.iter().map(|(k, x)| (k.clone(), Value::Str(x.clone()))).collect()),
                "Value" => Value::Float(s.value),
                _ => return Err(err(format!("can't evaluate field {f} in type *template.sample"))),
            },
            Value::Nil | Value::NoValue => return Err(err(format!("nil pointer evaluating .{f}"))),
            other => return Err(err(format!("can't evaluate field {f} in type {}", other.type_name()))),
        };
    }
    Ok(v)
}

/// A struct's fields by name.
pub(crate) type Fields = BTreeMap<&'static str, Value>;
