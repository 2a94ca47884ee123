//! Alert templates: Go's `text/template` language with Prometheus' functions, written
//! here so that labels and annotations expand to the same text Prometheus gives (its
//! float printing, `<no value>` for a missing label, its errors). A template is parsed
//! when its rule is loaded, so a bad one is a load error naming the rule; rendering is
//! bounded in steps and output.

mod exec;
pub mod format;
mod funcs;
mod parse;

use std::collections::BTreeMap;
use std::sync::Arc;

pub use funcs::{humanize, humanize_duration, sample};

#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum TemplateError {
    #[error("template: {0}")]
    Parse(String),
    #[error("template: {0}")]
    Exec(String),
}

/// One sample of a template's `query`: labels and value.
#[derive(Debug, Clone, PartialEq)]
pub struct QuerySample {
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A value in a template.
#[derive(Debug, Clone)]
pub enum Value {
    Nil,
    /// A missing map key: prints `<no value>`.
    NoValue,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Map(BTreeMap<String, Value>),
    List(Vec<Value>),
    Struct(Arc<exec::Fields>),
    Sample(Arc<QuerySample>),
}

impl Value {
    pub fn truthy(&self) -> bool {
        match self {
            Value::Nil | Value::NoValue => false,
            Value::Bool(b) => *b,
            Value::Int(i) => *i != 0,
            Value::Float(f) => *f != 0.0,
            Value::Str(s) => !s.is_empty(),
            Value::Map(m) => !m.is_empty(),
            Value::List(l) => !l.is_empty(),
            Value::Struct(_) | Value::Sample(_) => true,
        }
    }

    /// Go's `%v`.
    pub fn print(&self) -> String {
        match self {
            Value::Nil => "<nil>".into(),
            Value::NoValue => "<no value>".into(),
            Value::Bool(b) => b.to_string(),
            Value::Int(i) => i.to_string(),
            Value::Float(f) => format::format_g(*f, None, false),
            Value::Str(s) => s.clone(),
            Value::Map(m) => {
                let items: Vec<String> = m.iter().map(|(k, v)| format!("{k}:{}", v.print())).collect();
                format!("map[{}]", items.join(" "))
            }
            Value::List(l) => {
                let items: Vec<String> = l.iter().map(Value::print).collect();
                format!("[{}]", items.join(" "))
            }
            Value::Struct(s) => {
                let items: Vec<String> = s.values().map(Value::print).collect();
                format!("{{{}}}", items.join(" "))
            }
            Value::Sample(s) => {
                let items: Vec<String> = s.labels.iter().map(|(k, v)| format!("{k}:{v}")).collect();
                format!("{{map[{}] {}}}", items.join(" "), format::format_g(s.value, None, false))
            }
        }
    }

    /// Go's name for the type, as its errors print it.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Nil | Value::NoValue => "<nil>",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Float(_) => "float64",
            Value::Str(_) => "string",
            Value::Map(_) => "map[string]string",
            Value::List(_) => "template.queryResult",
            Value::Struct(_) => "struct",
            Value::Sample(_) => "*template.sample",
        }
    }
}

/// A query function for templates: the instant vector of `query` at the evaluation time.
pub type QueryFn<'a> = &'a (dyn Fn(&str) -> Result<Vec<QuerySample>, String> + Sync);

/// What rendering can reach besides its data.
#[derive(Default, Clone, Copy)]
pub struct Env<'a> {
    pub query: Option<QueryFn<'a>>,
    pub external_url: &'a str,
}

/// A parsed template.
pub struct Template {
    parsed: parse::Parsed,
}

impl Template {
    pub fn parse(src: &str) -> Result<Template, TemplateError> {
        Ok(Template { parsed: parse::parse(src)? })
    }

    pub fn render(&self, env: &Env, dot: &Value) -> Result<String, TemplateError> {
        let mut x = exec::Exec::new(env, &self.parsed.defined, dot);
        x.run(&self.parsed.main, dot)?;
        Ok(x.out)
    }
}

/// The variables Prometheus defines before an alert's label or annotation template.
const ALERT_DEFS: &str =
    "{{$labels := .Labels}}{{$externalLabels := .ExternalLabels}}{{$externalURL := .ExternalURL}}{{$value := .Value}}";

/// An alert's label or annotation template, parsed with Prometheus' variables in front.
pub fn parse_alert_template(text: &str) -> Result<Template, TemplateError> {
    Template::parse(&format!("{ALERT_DEFS}{text}"))
}

/// The data an alert template sees: `.Labels`, `.ExternalLabels`, `.ExternalURL`, `.Value`.
pub fn alert_data(
    labels: &strata_model::Labels,
    external: &strata_model::Labels,
    external_url: &str,
    value: f64,
) -> Value {
    let map = |l: &strata_model::Labels| {
        Value::Map(l.iter().map(|x| (x.name.to_string(), Value::Str(x.value.to_string()))).collect())
    };
    let mut f = exec::Fields::new();
    f.insert("Labels", map(labels));
    f.insert("ExternalLabels", map(external));
    f.insert("ExternalURL", Value::Str(external_url.to_string()));
    f.insert("Value", Value::Float(value));
    Value::Struct(Arc::new(f))
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_model::Labels;

    fn render(t: &str, labels: &[(&str, &str)], value: f64) -> Result<String, TemplateError> {
        let data = alert_data(&Labels::from_pairs(labels.iter().copied()), &Labels::default(), "http://x", value);
        parse_alert_template(t)?.render(&Env { query: None, external_url: "http://x" }, &data)
    }

    #[test]
    fn alert_templates_expand_as_prometheus_does() {
        let l = [("instance", "host:9100"), ("gpu", "3")];
        assert_eq!(render("{{ $labels.instance }} at {{ $value }}", &l, 1e6).unwrap(), "host:9100 at 1e+06");
        assert_eq!(render("{{ $value | humanize }}", &l, 1234567.0).unwrap(), "1.235M");
        assert_eq!(render("{{ printf \"%.2f\" $value }}", &l, 42.123).unwrap(), "42.12");
        assert_eq!(render("{{ $labels.missing }}", &l, 1.0).unwrap(), "<no value>");
        assert_eq!(render("{{ if gt $value 80.0 }}hot{{ else }}ok{{ end }}", &l, 90.0).unwrap(), "hot");
        assert_eq!(
            render("{{ if gt $value 80.0 }}hot{{ else if gt $value 50.0 }}warm{{ else }}ok{{ end }}", &l, 60.0)
                .unwrap(),
            "warm"
        );
        assert_eq!(
            render("{{ range $k, $v := $labels }}{{ $k }}={{ $v }};{{ end }}", &l, 1.0).unwrap(),
            "gpu=3;instance=host:9100;"
        );
        assert_eq!(render("{{- with $labels.gpu }} GPU {{ . }} {{- end }}", &l, 1.0).unwrap(), " GPU 3");
        assert_eq!(render("{{ $labels.instance | stripPort | toUpper }}", &l, 1.0).unwrap(), "HOST");
        assert_eq!(render("{{/* note */}}a {{- \" b\" }}", &l, 1.0).unwrap(), "a b");
        assert_eq!(render("{{ reReplaceAll \"(.*):.*\" \"$1\" $labels.instance }}", &l, 1.0).unwrap(), "host");
        assert_eq!(
            render("{{ humanizePercentage 0.1234 }} {{ humanizeDuration 3661 }}", &l, 1.0).unwrap(),
            "12.34% 1h 1m 1s"
        );
        // Go refuses to compare a float with an int constant; so does Strata.
        assert!(render("{{ if gt $value 80 }}x{{ end }}", &l, 90.0).is_err());
        assert!(render("{{ nosuch 1 }}", &l, 1.0).is_err());
        assert!(Template::parse("{{ if 1 }}").is_err());
        assert!(Template::parse("{{ \"unterminated }}").is_err());
    }

    #[test]
    fn query_results_reach_first_value_and_label() {
        let q = |e: &str| -> Result<Vec<QuerySample>, String> {
            assert_eq!(e, "up");
            Ok(vec![sample(&Labels::from_pairs([("job", "edge")]), 1.0)])
        };
        let env = Env { query: Some(&q), external_url: "" };
        let t =
            Template::parse("{{ with query \"up\" }}{{ . | first | value }} {{ . | first | label \"job\" }}{{ end }}")
                .unwrap();
        assert_eq!(t.render(&env, &Value::Nil).unwrap(), "1 edge");
        let t = Template::parse("{{ range query \"up\" }}{{ .Labels.job }}={{ .Value }}{{ end }}").unwrap();
        assert_eq!(t.render(&env, &Value::Nil).unwrap(), "edge=1");
    }

    #[test]
    fn runaway_templates_stop() {
        let t = Template::parse("{{ define \"a\" }}{{ template \"a\" }}{{ end }}{{ template \"a\" }}").unwrap();
        assert!(t.render(&Env::default(), &Value::Nil).is_err());
        let t = Template::parse("{{ range 100000000 }}xxxxxxxx{{ end }}").unwrap();
        assert!(t.render(&Env::default(), &Value::Nil).is_err());
        // Growth held in a variable, not in the output, and loops with empty bodies.
        let t = Template::parse("{{ $x := \"ab\" }}{{ range 40 }}{{ $x = print $x $x }}{{ end }}").unwrap();
        assert!(t.render(&Env::default(), &Value::Nil).is_err());
        let t = Template::parse("{{ range 1000000 }}{{ range 1000000 }}{{ end }}{{ end }}").unwrap();
        assert!(t.render(&Env::default(), &Value::Nil).is_err(), "stopped by its step budget");
    }

    #[test]
    fn and_and_or_stop_at_the_argument_that_decides() {
        let calls = std::sync::atomic::AtomicUsize::new(0);
        let q = |_: &str| -> Result<Vec<QuerySample>, String> {
            calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(Vec::new())
        };
        let env = Env { query: Some(&q), external_url: "" };
        let t =
            Template::parse("{{ if and (query \"x\") (query \"x\" | first | value) }}y{{ else }}n{{ end }}").unwrap();
        assert_eq!(t.render(&env, &Value::Nil).unwrap(), "n");
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1, "the second query never ran");
        let t = Template::parse("{{ or 0 \"\" \"b\" \"c\" }} {{ and 1 0 2 }} {{ \"p\" | or 0 }}").unwrap();
        assert_eq!(t.render(&Env::default(), &Value::Nil).unwrap(), "b 0 p");
    }
}
