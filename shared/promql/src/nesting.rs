//! How deep a query's syntax tree can be, read from its text before it is parsed.
//!
//! The parser, the checks, the evaluator and even dropping the tree recurse once per level,
//! and a stack overflow aborts the process (it is no panic that `catch_unwind` could stop).
//! The parser itself recurses while it builds a binary chain (it asks each operand for its
//! type, walking the operand's scalar subtree: a cost of up to nodes × depth), so the depth
//! has to be known before parsing. [`bound`] reads the parser's tokens once, with a stack
//! of open brackets: every tree level is either an operator (binary, unary, set) or
//! a bracketed node (parentheses, a call, an aggregation, a subquery), and the operators of
//! one level of brackets can nest at most one level each. So the depth of the tree is at
//! most, over the brackets along any path, the operators directly inside each bracket plus
//! two (the bracket's own node and its argument). A flat chain of 1,000 `or` terms bounds
//! at about 1,000; sibling brackets do not add up.

/// What [`bound`] measures of a query's text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// An upper bound of the syntax tree's depth.
    pub depth: usize,
    /// Tokens: an upper bound of the tree's nodes.
    pub tokens: usize,
}

/// The shape of `query`'s syntax tree, read from the parser's own lexer (iterative, so
/// it agrees with the parser on comments, strings and escapes by construction). `None`
/// when the text does not lex: the parser then fails before building anything.
pub fn bound(query: &str) -> Option<Shape> {
    use lrpar::{Lexeme, Lexer};
    use promql_parser::parser::token::*;
    let lexer = promql_parser::parser::lexer(query).ok()?;
    // Per open bracket: the operators directly inside it, and the deepest closed child.
    let mut frames: Vec<Frame> = vec![Frame::default()];
    let mut tokens = 0usize;
    for lexeme in lexer.iter() {
        let Ok(lexeme) = lexeme else { continue };
        tokens += 1;
        match lexeme.tok_id() {
            T_LEFT_PAREN | T_LEFT_BRACKET => frames.push(Frame::default()),
            T_LEFT_BRACE | T_OPEN_HIST => frames.push(Frame { matchers: true, ..Frame::default() }),
            // An unbalanced closer is the parser's error to report; it cannot deepen the tree.
            T_RIGHT_PAREN | T_RIGHT_BRACKET | T_RIGHT_BRACE | T_CLOSE_HIST if frames.len() > 1 => close(&mut frames),
            T_ADD | T_SUB | T_MUL | T_DIV | T_MOD | T_POW | T_EQLC | T_NEQ | T_GTE | T_GTR | T_LTE | T_LSS | T_LAND
            | T_LOR | T_LUNLESS | T_ATAN2 => count(&mut frames),
            _ => {}
        }
    }
    // Brackets never closed count as closed at the end.
    while frames.len() > 1 {
        close(&mut frames);
    }
    let depth = frames.pop().map_or(0, |f| f.depth()).saturating_add(1);
    Some(Shape { depth, tokens })
}

#[derive(Default)]
struct Frame {
    operators: usize,
    child: usize,
    /// A `{...}` of label matchers: its `=`, `!=`, `=~` are no tree nodes.
    matchers: bool,
}

impl Frame {
    fn depth(&self) -> usize {
        self.operators.saturating_add(self.child)
    }
}

/// Closes the innermost bracket into its parent: its node and its argument are two levels
/// (label matchers are part of their selector, no level of their own).
fn close(frames: &mut Vec<Frame>) {
    let Some(done) = frames.pop() else { return };
    if let Some(parent) = frames.last_mut() {
        if !done.matchers {
            parent.child = parent.child.max(done.depth().saturating_add(2));
        }
    }
}

fn count(frames: &mut [Frame]) {
    if let Some(f) = frames.last_mut() {
        if !f.matchers {
            f.operators += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn depth_bound(q: &str) -> usize {
        bound(q).map_or(0, |s| s.depth)
    }
    use promql_parser::parser::Expr;

    /// The depth of a parsed tree, counted iteratively.
    fn depth(e: &Expr) -> usize {
        let mut most = 0;
        let mut todo = vec![(e, 1usize)];
        while let Some((e, d)) = todo.pop() {
            most = most.max(d);
            let d = d + 1;
            match e {
                Expr::Aggregate(a) => {
                    todo.push((&a.expr, d));
                    todo.extend(a.param.as_deref().map(|p| (p, d)));
                }
                Expr::Unary(u) => todo.push((&u.expr, d)),
                Expr::Binary(x) => todo.extend([(&*x.lhs, d), (&*x.rhs, d)]),
                Expr::Paren(p) => todo.push((&p.expr, d)),
                Expr::Subquery(s) => todo.push((&s.expr, d)),
                Expr::Call(c) => todo.extend(c.args.args.iter().map(|a| (&**a, d))),
                _ => {}
            }
        }
        most
    }

    #[test]
    fn the_bound_is_never_below_the_parsed_depth() {
        let queries = [
            "up",
            "-up",
            "- - - -1",
            "sum by (job) (rate(http_requests_total{code=~\"5..\", path!=\"/x\"}[5m])) / ignoring(code) group_left sum(up)",
            "1 + 2 * 3 ^ 4 ^ 5 - 6 % 7 == bool 8",
            "a or b and c unless d",
            "a atan2 b atan2 c",
            "max_over_time((rate(x[1m]) * 2)[1h:5m] offset -5m @ 1e3)",
            "topk(5, abs(ceil(-x)))",
            "count_values(\"v\", x)",
            "histogram_quantile(0.9, sum by (le) (rate(b[5m])))",
            "label_replace(x{a=\"(((\", b='\\'))'}, \"d\", `)))`, \"s\", \"(.*)\") # ((( comment\n + 1e-5 + 0x1F",
            "0x1e-5-0x1E-1",
            "((((x))))",
            "x[5m:]",
        ];
        for q in queries {
            let e = crate::parse(q).unwrap_or_else(|err| panic!("{q}: {err}"));
            assert!(depth_bound(q) >= depth(&e), "{q}: bound {} under depth {}", depth_bound(q), depth(&e));
        }
        // Chains of every kind at a moderate length, against the parsed depth.
        for op in [" or ", " and ", " + ", " * ", " ^ ", " == bool ", " > "] {
            let q = vec!["x"; 300].join(op);
            let e = crate::parse(&q).expect("parses");
            assert!(depth_bound(&q) >= depth(&e), "{op}");
        }
    }

    #[test]
    fn flat_chains_and_siblings_bound_near_their_depth() {
        let chain = vec!["rate(x{a=\"b\"}[5m])"; 1000].join(" or ");
        assert!((1000..1010).contains(&depth_bound(&chain)), "{}", depth_bound(&chain));
        let siblings = vec!["(a + b)"; 1000].join(" or ");
        assert!(depth_bound(&siblings) < 1010, "{}", depth_bound(&siblings));
        // Strings, comments and matchers add nothing.
        assert_eq!(depth_bound("x{a=\"+++\", b!~\"-\"}"), depth_bound("x"));
        assert_eq!(depth_bound("x # + + +"), depth_bound("x"));
    }

    /// The review's bypasses: a comment the lexer ends at a carriage return, a backslash in
    /// a raw string. The bound follows the parser's lexer, so both count.
    #[test]
    fn comments_and_strings_end_where_the_parser_says() {
        let n = 10_000;
        assert!(depth_bound(&format!("#\r{}x", "-".repeat(n))) >= n);
        assert!(
            depth_bound(&format!("`\\``+{}x", "(".repeat(n))) >= n
                || bound(&format!("`\\``+{}x", "(".repeat(n))).is_none()
        );
    }

    #[test]
    fn deep_inputs_bound_deep() {
        let n = 100_000;
        assert!(depth_bound(&format!("{}x{}", "(".repeat(n), ")".repeat(n))) > n);
        assert!(depth_bound(&"-".repeat(n)) >= n);
        // Unclosed: the lexer refuses it, so the parser builds nothing.
        let unclosed = format!("{}x", "abs(".repeat(n));
        assert!(bound(&unclosed).is_none_or(|s| s.depth > n));
        assert!(depth_bound(&format!("{}x{}", "abs(".repeat(n), ")".repeat(n))) > n);
        assert!(depth_bound(&vec!["x"; n].join("+")) >= n - 1);
    }
}
