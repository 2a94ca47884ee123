//! How deep a query's syntax tree can be, read from its text before it is parsed.
//!
//! The parser, the checks, the evaluator and even dropping the tree recurse once per level,
//! and a stack overflow aborts the process (it is no panic that `catch_unwind` could stop).
//! The parser itself recurses while it builds a binary chain (it asks each operand for its
//! type), so the depth has to be known before parsing. [`bound`] scans the text once, with
//! a stack of open brackets: every tree level is either an operator (binary, unary, set) or
//! a bracketed node (parentheses, a call, an aggregation, a subquery), and the operators of
//! one level of brackets can nest at most one level each. So the depth of the tree is at
//! most, over the brackets along any path, the operators directly inside each bracket plus
//! two (the bracket's own node and its argument). A flat chain of 1,000 `or` terms bounds
//! at about 1,000; sibling brackets do not add up.

/// An upper bound of the syntax tree's depth of `query` (it need not parse).
pub fn bound(query: &str) -> usize {
    let b = query.as_bytes();
    // Per open bracket: the operators directly inside it, and the deepest closed child.
    let mut frames: Vec<Frame> = vec![Frame::default()];
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        match c {
            b'"' | b'\'' | b'`' => i = skip_string(b, i),
            b'#' => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'(' | b'[' | b'{' => {
                frames.push(Frame { matchers: c == b'{', ..Frame::default() });
                i += 1;
            }
            b')' | b']' | b'}' => {
                // An unbalanced closer is the parser's error to report; it cannot deepen the tree.
                if frames.len() > 1 {
                    close(&mut frames);
                }
                i += 1;
            }
            _ if c.is_ascii_alphanumeric() || c == b'_' || c == b'.' || c == b':' => {
                let start = i;
                while i < b.len() && (b[i].is_ascii_alphanumeric() || matches!(b[i], b'_' | b'.' | b':')) {
                    i += 1;
                }
                let word = &b[start..i];
                // A number's exponent sign (`1e-5`) is no operator.
                let hex = word.len() > 1 && word[0] == b'0' && matches!(word[1], b'x' | b'X');
                if word[0].is_ascii_digit()
                    && !hex
                    && matches!(word.last(), Some(b'e' | b'E'))
                    && i < b.len()
                    && matches!(b[i], b'+' | b'-')
                {
                    i += 1;
                } else if [&b"and"[..], b"or", b"unless", b"atan2"].iter().any(|k| word.eq_ignore_ascii_case(k)) {
                    count(&mut frames);
                }
            }
            b'+' | b'-' | b'*' | b'/' | b'%' | b'^' | b'<' | b'>' | b'=' | b'!' => {
                // Two-character operators (`==`, `!=`, `<=`, `>=`, `=~`, `!~`) are one.
                if i + 1 < b.len() && matches!(b[i + 1], b'=' | b'~') && matches!(c, b'=' | b'!' | b'<' | b'>') {
                    i += 1;
                }
                count(&mut frames);
                i += 1;
            }
            _ => i += 1,
        }
    }
    // Brackets never closed count as closed at the end.
    while frames.len() > 1 {
        close(&mut frames);
    }
    frames.pop().map_or(0, |f| f.depth()).saturating_add(1)
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

/// The index after the string literal opening at `i` (its end, if it has none).
fn skip_string(b: &[u8], i: usize) -> usize {
    let quote = b[i];
    let mut j = i + 1;
    while j < b.len() {
        match b[j] {
            // Raw strings (backticks) have no escapes.
            b'\\' if quote != b'`' => j += 2,
            x if x == quote => return j + 1,
            _ => j += 1,
        }
    }
    b.len()
}

#[cfg(test)]
mod tests {
    use super::*;
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
            assert!(bound(q) >= depth(&e), "{q}: bound {} under depth {}", bound(q), depth(&e));
        }
        // Chains of every kind at a moderate length, against the parsed depth.
        for op in [" or ", " and ", " + ", " * ", " ^ ", " == bool ", " > "] {
            let q = vec!["x"; 300].join(op);
            let e = crate::parse(&q).expect("parses");
            assert!(bound(&q) >= depth(&e), "{op}");
        }
    }

    #[test]
    fn flat_chains_and_siblings_bound_near_their_depth() {
        let chain = vec!["rate(x{a=\"b\"}[5m])"; 1000].join(" or ");
        assert!((1000..1010).contains(&bound(&chain)), "{}", bound(&chain));
        let siblings = vec!["(a + b)"; 1000].join(" or ");
        assert!(bound(&siblings) < 1010, "{}", bound(&siblings));
        // Strings, comments and matchers add nothing.
        assert_eq!(bound("x{a=\"+++\", b!~\"-\"}"), bound("x"));
        assert_eq!(bound("x # + + +"), bound("x"));
    }

    #[test]
    fn deep_inputs_bound_deep() {
        let n = 100_000;
        assert!(bound(&format!("{}x{}", "(".repeat(n), ")".repeat(n))) > n);
        assert!(bound(&"-".repeat(n)) >= n);
        assert!(bound(&format!("{}x", "abs(".repeat(n))) > n);
        assert!(bound(&vec!["x"; n].join("+")) >= n - 1);
    }
}
