//! Series selectors (`match[]`, `foo{a="b"}`) parsed with `promql-parser` into matchers.

use promql_parser::label::MatchOp as PMatchOp;
use promql_parser::parser::{Expr, VectorSelector};
use strata_model::matcher::{MatchOp, Matcher};
use strata_model::METRIC_NAME;

#[derive(Debug, thiserror::Error)]
pub enum SelectorError {
    #[error("'or' inside a selector is not supported yet")]
    OrMatchers,
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Parse(#[from] crate::ParseError),
    #[error("{0:?} is not a series selector")]
    NotASelector(String),
    #[error("{0:?}: a series selector takes no offset or @ modifier")]
    Modifier(String),
    #[error("vector selector must contain at least one non-empty matcher")]
    MatchesEverything,
}

/// The matchers of a parsed vector selector, the metric name included.
pub fn matchers_of(vs: &VectorSelector) -> Result<Vec<Matcher>, SelectorError> {
    if !vs.matchers.or_matchers.is_empty() {
        return Err(SelectorError::OrMatchers);
    }
    let mut out = Vec::new();
    if let Some(name) = &vs.name {
        out.push(Matcher::eq(METRIC_NAME, name));
    }
    for m in &vs.matchers.matchers {
        let op = match m.op {
            PMatchOp::Equal => MatchOp::Equal,
            PMatchOp::NotEqual => MatchOp::NotEqual,
            PMatchOp::Re(_) => MatchOp::Regex,
            PMatchOp::NotRe(_) => MatchOp::NotRegex,
        };
        out.push(Matcher::new(op, &m.name, &m.value).map_err(|e| SelectorError::Invalid(e.to_string()))?);
    }
    Ok(out)
}

/// Parses a series selector; anything but a plain vector selector is an error.
pub fn parse_selector(s: &str) -> Result<Vec<Matcher>, SelectorError> {
    let expr = crate::parse(s)?;
    let Expr::VectorSelector(vs) = expr else {
        return Err(SelectorError::NotASelector(s.to_string()));
    };
    if vs.offset.is_some() || vs.at.is_some() {
        return Err(SelectorError::Modifier(s.to_string()));
    }
    let out = matchers_of(&vs)?;
    if out.iter().all(|m| m.matches("")) {
        return Err(SelectorError::MatchesEverything);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors() {
        let m = parse_selector(r#"DCGM_FI_DEV_GPU_UTIL{gpu=~"1|2",Hostname!="x"}"#).unwrap();
        assert_eq!(m.len(), 3);
        assert_eq!(m[0].value, "DCGM_FI_DEV_GPU_UTIL");
        assert!(m[1].matches("2") || m[2].matches("2"));
        assert!(parse_selector("rate(x[5m])").is_err());
        assert!(parse_selector(r#"{a=~".*"}"#).is_err());
        assert!(parse_selector("x{").is_err());
        assert!(parse_selector(r#"{__name__="up"}"#).is_ok());
    }
}
