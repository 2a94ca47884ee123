//! Where a call's or an aggregation's arguments start in the query text, so annotations
//! can end with Prometheus' position suffix (`... "foo" (1:6)`).
//!
//! The parser keeps no positions, so they are read again from its own lexer: every
//! annotation Prometheus positions refers to an argument of a function call or the
//! parameter or operand of an aggregation, and an argument starts at the first token after
//! its call's `(` or after a comma at that call's bracket level (a parenthesised argument
//! at its `(`, a negative number at its sign, as Prometheus' ranges start). Calls and
//! aggregations appear in the text in the order a pre-order walk of the tree meets them
//! (an aggregation's parameter before its operand, a binary expression's left side before
//! its right), so the n-th call site of the text is the n-th call node of the tree. When
//! the counts disagree nothing is positioned: an annotation without a suffix beats one that
//! points at the wrong place.

use promql_parser::parser::token::*;
use promql_parser::parser::Expr;
use std::collections::HashMap;

/// Byte offsets of argument starts, keyed by the address of the argument's node in the
/// tree they were computed for.
#[derive(Debug, Default)]
pub struct ArgPositions {
    starts: HashMap<usize, usize>,
}

/// The key of a node: its address, stable while the tree is borrowed.
pub fn node_key(e: &Expr) -> usize {
    e as *const Expr as usize
}

impl ArgPositions {
    /// Positions of `tree`'s arguments in `query`, the text it was parsed from.
    pub fn of(query: &str, tree: &Expr) -> ArgPositions {
        let (Some(sites), nodes) = (call_sites(query), call_nodes(tree)) else { return ArgPositions::default() };
        if sites.len() != nodes.len() {
            return ArgPositions::default();
        }
        let mut starts = HashMap::new();
        for (site, args) in sites.iter().zip(nodes) {
            if site.len() != args.len() {
                return ArgPositions::default();
            }
            for (&start, arg) in site.iter().zip(args) {
                starts.insert(node_key(arg), start);
            }
        }
        ArgPositions { starts }
    }

    /// Prometheus' suffix for an annotation about the argument `key`: ` (line:column)`,
    /// both counted from 1, the column in bytes as Go counts it.
    pub fn suffix(&self, query: &str, key: usize) -> Option<String> {
        let &start = self.starts.get(&key)?;
        let before = query.get(..start)?;
        let line = 1 + before.bytes().filter(|&b| b == b'\n').count();
        let column = start - before.rfind('\n').map_or(0, |i| i + 1) + 1;
        Some(format!(" ({line}:{column})"))
    }
}

/// The argument nodes of every call and aggregation, in the order of their call sites.
fn call_nodes(tree: &Expr) -> Vec<Vec<&Expr>> {
    let mut out = Vec::new();
    // Children pushed in reverse so they are visited left to right.
    let mut todo = vec![tree];
    while let Some(e) = todo.pop() {
        match e {
            Expr::Aggregate(a) => {
                out.push(a.param.as_deref().into_iter().chain([&*a.expr]).collect());
                todo.push(&a.expr);
                todo.extend(a.param.as_deref());
            }
            Expr::Call(c) => {
                out.push(c.args.args.iter().map(|a| &**a).collect());
                todo.extend(c.args.args.iter().rev().map(|a| &**a));
            }
            Expr::Unary(u) => todo.push(&u.expr),
            Expr::Binary(b) => todo.extend([&*b.rhs, &*b.lhs]),
            Expr::Paren(p) => todo.push(&p.expr),
            Expr::Subquery(s) => todo.push(&s.expr),
            Expr::MatrixSelector(_)
            | Expr::VectorSelector(_)
            | Expr::NumberLiteral(_)
            | Expr::StringLiteral(_)
            | Expr::Extension(_) => {}
        }
    }
    out
}

/// The argument starts of every call site in the text, in text order: a function name or
/// an aggregation operator followed by `(` (an aggregation's `by (...)`/`without (...)`
/// may stand between). `None` when the text does not lex.
fn call_sites(query: &str) -> Option<Vec<Vec<usize>>> {
    use lrpar::{Lexeme, Lexer};
    let lexer = promql_parser::parser::lexer(query).ok()?;
    let tokens: Vec<(TokenId, usize)> =
        lexer.iter().filter_map(Result::ok).map(|l| (l.tok_id(), l.span().start())).collect();
    let mut sites = Vec::new();
    for (i, &(tok, _)) in tokens.iter().enumerate() {
        let call = tok == T_IDENTIFIER;
        let aggregation = TokenType::new(tok).is_aggregator();
        if !call && !aggregation {
            continue;
        }
        let mut open = i + 1;
        if aggregation && matches!(tokens.get(open), Some(&(T_BY | T_WITHOUT, _))) {
            open = skip_group(&tokens, open + 1)?;
        }
        if tokens.get(open).map(|t| t.0) != Some(T_LEFT_PAREN) {
            // A label or metric name that happens to be spelt as a function or operator.
            continue;
        }
        sites.push(arg_starts(&tokens, open));
    }
    Some(sites)
}

/// The index after the bracketed group opening at `open` (a grouping's label list).
fn skip_group(tokens: &[(TokenId, usize)], open: usize) -> Option<usize> {
    if tokens.get(open)?.0 != T_LEFT_PAREN {
        return None;
    }
    let close = tokens[open..].iter().position(|t| t.0 == T_RIGHT_PAREN)?;
    Some(open + close + 1)
}

/// The start of each argument of the call whose `(` is token `open`.
fn arg_starts(tokens: &[(TokenId, usize)], open: usize) -> Vec<usize> {
    let mut starts = Vec::new();
    let mut depth = 0usize;
    let mut expect_arg = true;
    for &(tok, at) in &tokens[open + 1..] {
        match tok {
            T_LEFT_PAREN | T_LEFT_BRACKET | T_LEFT_BRACE | T_OPEN_HIST => {
                if depth == 0 && expect_arg {
                    starts.push(at);
                    expect_arg = false;
                }
                depth += 1;
                continue;
            }
            T_RIGHT_PAREN | T_RIGHT_BRACKET | T_RIGHT_BRACE | T_CLOSE_HIST => {
                if depth == 0 {
                    break;
                }
                depth -= 1;
                continue;
            }
            T_COMMA if depth == 0 => {
                expect_arg = true;
                continue;
            }
            _ => {}
        }
        if depth == 0 && expect_arg {
            starts.push(at);
            expect_arg = false;
        }
    }
    starts
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The suffix of argument `arg` of the `n`-th call node (pre-order).
    fn suffix(q: &str, n: usize, arg: usize) -> Option<String> {
        let tree = crate::parse(q).unwrap();
        let positions = ArgPositions::of(q, &tree);
        let key = node_key(call_nodes(&tree)[n][arg]);
        positions.suffix(q, key)
    }

    #[test]
    fn arguments_are_positioned_as_prometheus_prints_them() {
        // Suffixes as Prometheus 3 prints them for these queries' annotations.
        assert_eq!(suffix("rate(foo[5m])", 0, 0).as_deref(), Some(" (1:6)"));
        assert_eq!(suffix("sum(rate(foo[5m]))", 1, 0).as_deref(), Some(" (1:10)"));
        assert_eq!(suffix("quantile(-0.5, foo)", 0, 0).as_deref(), Some(" (1:10)"));
        assert_eq!(suffix("histogram_quantile(0.9, rate(x_bucket[5m]))", 0, 1).as_deref(), Some(" (1:25)"));
        assert_eq!(suffix("sum by (job) (\n  rate( ( foo )[5m:] ))", 1, 0).as_deref(), Some(" (2:9)"));
        assert_eq!(suffix("sum(x) by (job) + topk(3, rate(y[1m]))", 1, 0).as_deref(), Some(" (1:24)"));
        assert_eq!(suffix("sum(x) by (job) + topk(3, rate(y[1m]))", 1, 1).as_deref(), Some(" (1:27)"));
        assert_eq!(suffix("sum(x) by (job) + topk(3, rate(y[1m]))", 2, 0).as_deref(), Some(" (1:32)"));
    }

    #[test]
    fn names_spelt_as_functions_and_at_modifiers_are_no_call_sites() {
        // A metric named `rate`, a label named `sum`, `@ start()`, a comment and a string.
        let q = "rate{sum=\"rate(\"} @ start() + sum by (sum, count) (rate(x[5m] @ end())) # rate(y)\n";
        assert_eq!(suffix(q, 1, 0).as_deref(), Some(" (1:57)"));
    }

    #[test]
    fn a_mismatch_positions_nothing() {
        let q = "rate(foo[5m])";
        let other = crate::parse("sum(rate(foo[5m]))").unwrap();
        let positions = ArgPositions::of(q, &other);
        assert!(positions.starts.is_empty());
    }
}
