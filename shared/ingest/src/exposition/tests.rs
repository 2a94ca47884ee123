use super::*;
use strata_model::{is_stale, MetricType};

fn samples(page: &str, f: Format) -> Result<Vec<(Labels, f64, Option<i64>)>, ParseError> {
    let mut out = Vec::new();
    for e in Parser::new(page.as_bytes(), f) {
        if let Entry::Sample { series, value, timestamp_ms, line, .. } = e? {
            out.push((parse_series_at(series, line)?, value, timestamp_ms));
        }
    }
    Ok(out)
}

const DCGM_PAGE: &str = r#"# HELP DCGM_FI_DEV_SM_CLOCK SM clock frequency (in MHz).
# TYPE DCGM_FI_DEV_SM_CLOCK gauge
DCGM_FI_DEV_SM_CLOCK{gpu="0",UUID="GPU-604ac76c",pci_bus_id="00000000:0D:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-017",DCGM_FI_DRIVER_VERSION="550.54.15",container="",namespace="",pod=""} 1980
# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).
# TYPE DCGM_FI_DEV_POWER_USAGE gauge
DCGM_FI_DEV_POWER_USAGE{gpu="0", UUID="GPU-604ac76c", device="nvidia0"} 612.318000
# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="0"} 31035686671
DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="0"} 9223372036854775794
"#;

#[test]
fn dcgm_page_with_quirks() {
    let s = samples(DCGM_PAGE, Format::Text).unwrap();
    assert_eq!(s.len(), 4);
    // empty pod attribution labels are dropped like Prometheus drops empty labels
    assert_eq!(s[0].0.get("pod"), None);
    assert_eq!(s[0].0.get("modelName"), Some("NVIDIA H100 80GB HBM3"));
    assert_eq!(s[0].1, 1980.0);
    // a space after commas
    assert_eq!(s[1].0.get("UUID"), Some("GPU-604ac76c"));
    assert_eq!(s[1].1, 612.318);
    assert_eq!(s[2].1, 31035686671.0);
    assert_eq!(s[3].1, 9223372036854775794.0);
    assert!(s.iter().all(|x| x.2.is_none()));
}

#[test]
fn metadata_lines_first_then_samples() {
    let page = "# HELP a_metric help a\n# TYPE a_metric counter\n# HELP b gauge b\n# TYPE b gauge\na_metric 1\nb 2\n";
    let entries: Vec<_> = Parser::new(page.as_bytes(), Format::Text).collect::<Result<_, _>>().unwrap();
    assert!(entries.contains(&Entry::Type { family: "a_metric", metric_type: MetricType::Counter }));
    assert!(entries.contains(&Entry::Help { family: "b", help: "gauge b".into() }));
    assert_eq!(samples(page, Format::Text).unwrap().len(), 2);
}

#[test]
fn escapes_in_label_values_and_help() {
    let page = "# HELP m a \\\\ back\\nslash\nm{a=\"x\\\"y\",b=\"l1\\nl2\",c=\"back\\\\slash\",d=\"keep\\tthis\"} 1\n";
    let entries: Vec<_> = Parser::new(page.as_bytes(), Format::Text).collect::<Result<_, _>>().unwrap();
    assert_eq!(entries[0], Entry::Help { family: "m", help: "a \\ back\nslash".into() });
    let s = samples(page, Format::Text).unwrap();
    let l = &s[0].0;
    assert_eq!(l.get("a"), Some("x\"y"));
    assert_eq!(l.get("b"), Some("l1\nl2"));
    assert_eq!(l.get("c"), Some("back\\slash"));
    assert_eq!(l.get("d"), Some("keep\\tthis"));
}

#[test]
fn special_values_and_timestamps() {
    let page = "a NaN\nb +Inf\nc -Inf\nd 1.5e3 1700000000123\ne -0.25 -5\nf Inf\n";
    let s = samples(page, Format::Text).unwrap();
    assert!(s[0].1.is_nan());
    assert!(!is_stale(s[0].1), "a scraped NaN must not be the stale marker");
    assert_eq!(s[0].1.to_bits(), NORMAL_NAN_BITS);
    assert_eq!(s[1].1, f64::INFINITY);
    assert_eq!(s[2].1, f64::NEG_INFINITY);
    assert_eq!(s[3].1, 1500.0);
    assert_eq!(s[3].2, Some(1_700_000_000_123));
    assert_eq!(s[4].2, Some(-5));
    assert_eq!(s[5].1, f64::INFINITY);
}

#[test]
fn text_format_tolerates_comments_blank_lines_and_crlf() {
    let page = "# just a comment\n\n  # indented comment\r\nm{a=\"1\",} 3\r\n";
    let s = samples(page, Format::Text).unwrap();
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].0.get("a"), Some("1"));
}

#[test]
fn openmetrics_page() {
    let page = "# TYPE energy counter\n# UNIT energy joules\n# HELP energy Energy.\nenergy_total{gpu=\"0\"} 17.5 1700000000.123 # {trace_id=\"abc\"} 1.0 1700000000.1\nenergy_created{gpu=\"0\"} 1600000000\n# EOF\n";
    let entries: Vec<_> = Parser::new(page.as_bytes(), Format::OpenMetrics).collect::<Result<_, _>>().unwrap();
    assert!(entries.contains(&Entry::Unit { family: "energy", unit: "joules" }));
    assert!(entries.contains(&Entry::Type { family: "energy", metric_type: MetricType::Counter }));
    let s = samples(page, Format::OpenMetrics).unwrap();
    assert_eq!(s[0].0.metric_name(), Some("energy_total"));
    assert_eq!(s[0].1, 17.5);
    assert_eq!(s[0].2, Some(1_700_000_000_123));
    assert_eq!(s[1].0.metric_name(), Some("energy_created"));
}

#[test]
fn openmetrics_timestamps_truncate_like_prometheus() {
    // 1764374400.015 * 1000 is 1764374400014.9998 in binary floating point; Prometheus keeps 14.
    let page = "m 1 1764374400.015\n# EOF\n";
    let s = samples(page, Format::OpenMetrics).unwrap();
    assert_eq!(s[0].2, Some((1764374400.015f64 * 1000.0) as i64));
}

#[test]
fn openmetrics_requires_eof_and_nothing_after_it() {
    assert!(samples("m 1\n", Format::OpenMetrics).is_err());
    let e = samples("m 1\n# EOF\nm 2\n", Format::OpenMetrics).unwrap_err();
    assert_eq!(e.line, 3);
    assert!(samples("# TYPE m untyped\nm 1\n# EOF\n", Format::OpenMetrics).is_err());
}

#[test]
fn bad_pages_fail_with_line_and_reason() {
    let cases = [
        ("ok 1\nthis is garbage\n", 2, "value"),
        ("ok 1\nm{a=\"unterminated} 1\n", 2, "unterminated"),
        ("m{a=\"1\" 1\n", 1, "expected"),
        ("m{=\"1\"} 1\n", 1, "label name"),
        ("m 1 notatime\n", 1, "timestamp"),
        ("m abc\n", 1, "invalid value"),
        ("m\n", 1, "space"),
        ("{a=\"1\"} 1\n", 1, "metric name"),
        ("m 1 2 3\n", 1, "unexpected"),
        ("# TYPE m bogus\n", 1, "metric type"),
    ];
    for (page, line, reason) in cases {
        let e = samples(page, Format::Text).expect_err(page);
        assert_eq!(e.line, line, "{page:?}: {e}");
        assert!(e.reason.contains(reason), "{page:?}: {e}");
    }
}

#[test]
fn duplicate_label_names_are_rejected_when_building_labels() {
    assert!(parse_series(b"m{a=\"1\",a=\"2\"}").is_err());
}

#[test]
fn the_strict_series_parser_refuses_what_the_tail_split_lets_through() {
    for bad in [
        &b"m{a=\"x\"}junk}"[..],
        b"m junk",
        b"m{a=\"x\" b=\"y\"}",
        b"m{a=\"x}",
        b"{a=\"1\"}",
        b"m{=\"1\"}",
        b"m{a=\"\xff\"}",
    ] {
        assert!(parse_series(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
    }
    assert!(parse_series(b"m { a = \"x\" , }").is_ok());
    // and through the parser, a line whose labels are broken still fails with its line number
    let e = samples("ok 1\nm{a=\"x\"}junk} 1\n", Format::Text).unwrap_err();
    assert_eq!(e.line, 2);
}

#[test]
fn values_and_timestamps_split_from_the_end_even_with_blanks_in_labels() {
    let s = samples("m{a=\"} 5\"} 7 9\nn{b=\"x y\"}   2\n", Format::Text).unwrap();
    assert_eq!((s[0].0.get("a"), s[0].1, s[0].2), (Some("} 5"), 7.0, Some(9)));
    assert_eq!((s[1].0.get("b"), s[1].1, s[1].2), (Some("x y"), 2.0, None));
}

#[test]
fn content_type_negotiation() {
    assert_eq!(
        Format::from_content_type(Some("application/openmetrics-text; version=1.0.0; charset=utf-8")),
        Format::OpenMetrics
    );
    assert_eq!(Format::from_content_type(Some("text/plain; version=0.0.4")), Format::Text);
    assert_eq!(Format::from_content_type(None), Format::Text);
}

/// Random pages made of syntax-heavy bytes: the parser and the series parser return
/// errors, never panic.
#[test]
fn random_byte_soup_never_panics() {
    let alphabet = b"ab_:{}=\",\\ \t\n#0123456789.eE+-NaInf\xff\xc3\xa9HELP TYPE EOF";
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..3000 {
        let len = (x % 300) as usize;
        let mut page = Vec::with_capacity(len);
        for _ in 0..len {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            page.push(alphabet[(x % alphabet.len() as u64) as usize]);
        }
        for format in [Format::Text, Format::OpenMetrics] {
            for e in Parser::new(&page, format).flatten() {
                if let Entry::Sample { series, line, .. } = e {
                    let _ = parse_series_at(series, line);
                }
            }
        }
    }
}

/// Valid pages with bytes flipped, dropped or repeated: every entry is a sample, metadata
/// or an error, and a sample's series always parses or errs, never panics.
#[test]
fn mutated_valid_pages_never_panic() {
    let page = "# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).\n# TYPE DCGM_FI_DEV_GPU_TEMP gauge\nDCGM_FI_DEV_GPU_TEMP{gpu=\"0\",UUID=\"GPU-1\",Hostname=\"n\",modelName=\"NVIDIA H100 80GB HBM3\"} 61 1764460800000\nDCGM_FI_DEV_POWER_USAGE{gpu=\"0\"} 301.123\n# TYPE e counter\n# UNIT e joules\ne_total{a=\"x\\\\y\\\"z\\n\"} 1.5e3 1764460800.5\n# EOF\n";
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for _ in 0..5000 {
        let mut b = page.as_bytes().to_vec();
        for _ in 0..(1 + next() % 4) {
            let i = (next() as usize) % b.len().max(1);
            match next() % 3 {
                0 => b[i] = next() as u8,
                1 => {
                    b.remove(i);
                }
                _ => {
                    let end = (i + (next() % 20) as usize).min(b.len());
                    let piece = b[i..end].to_vec();
                    b.splice(i..i, piece);
                }
            }
            if b.is_empty() {
                break;
            }
        }
        for format in [Format::Text, Format::OpenMetrics] {
            for e in Parser::new(&b, format).flatten() {
                if let Entry::Sample { series, line, .. } = e {
                    let _ = parse_series_at(series, line);
                }
            }
        }
    }
}

/// Edge review (issue 20): labels in any order come out sorted, many of them in descending
/// order included (sorted once, not inserted one by one: quadratic before), and a repeated
/// name is refused whatever its values, as Prometheus refuses it.
#[test]
fn labels_in_any_order_sort_and_a_repeated_name_is_refused() {
    let names: Vec<String> = (0..20_000).rev().map(|i| format!("l{i:05}")).collect();
    let line = format!("m{{{}}}", names.iter().map(|n| format!("{n}=\"v\"")).collect::<Vec<_>>().join(","));
    let labels = parse_series(line.as_bytes()).unwrap();
    assert_eq!(labels.len(), 20_001);
    assert!(labels.iter().map(|l| l.name.to_string()).collect::<Vec<_>>().windows(2).all(|w| w[0] < w[1]));
    assert!(parse_series(b"m{a=\"\",a=\"x\"}").is_err());
    assert!(parse_series(b"m{b=\"1\",a=\"2\",b=\"3\"}").is_err());
    assert_eq!(parse_series(b"m{b=\"1\",a=\"\"}").unwrap().to_string(), "m{b=\"1\"}");
}
