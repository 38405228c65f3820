//! The Prometheus histogram method of `bench`: scrape a named histogram of every replica
//! before and after the measurement window and take the bucket deltas, as a Grafana panel
//! does with `rate(NAME_bucket[...])` and `histogram_quantile`.
//!
//! Each replica serves its metrics on `http://127.0.0.1:$GPUSHARE_BENCH_METRICS_PORT/metrics`
//! in the Prometheus text format (as the official clients write it) or OpenMetrics. Of the
//! histogram `NAME` the lines `NAME_bucket{…,le="…"}`, `NAME_count` and `NAME_sum` are read;
//! everything else on the page is ignored. A histogram with labels (say `method="get"` and
//! `method="post"`) is summed over all its label sets, which must all have the same bucket
//! bounds.
//!
//! **Units.** Prometheus names a metric in base units, so a latency histogram is in seconds
//! (`request_latency_seconds`): its bucket bounds are multiplied by 1000 into milliseconds.
//! Only when the name ends in `_milliseconds` or `_ms` are the bounds taken as milliseconds
//! as they are. Any other name is taken as seconds.
//!
//! The percentiles of the bucket deltas are computed in [`super::stats`], from
//! [`Latencies::Buckets`]; the rate is the count delta over the window's length.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::Duration;

use super::stats::Latencies;

/// One histogram, summed over its label sets.
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    /// The number of observations (`NAME_count`).
    pub count: u64,
    /// The sum of the observations (`NAME_sum`), in the histogram's own unit; 0 where the
    /// page has no `NAME_sum` (OpenMetrics allows leaving it out).
    pub sum: f64,
    /// (upper bound `le`, cumulative count), in the histogram's own unit, ascending; the
    /// last bound is `+Inf` (`f64::INFINITY`).
    pub buckets: Vec<(f64, u64)>,
}

impl Histogram {
    /// The buckets in milliseconds for [`super::stats`]: the bounds × 1000, unless `name`
    /// (the histogram's name) ends in `_milliseconds` or `_ms`, when they are taken as
    /// they are (see the module documentation). [`Latencies::None`] where nothing was
    /// observed.
    pub fn latencies_ms(&self, name: &str) -> Latencies {
        if self.buckets.last().is_none_or(|&(_, n)| n == 0) {
            return Latencies::None;
        }
        let in_ms = name.ends_with("_milliseconds") || name.ends_with("_ms");
        Latencies::Buckets(
            self.buckets
                .iter()
                .map(|&(le, n)| (if in_ms { le } else { seconds_to_ms(le) }, n))
                .collect(),
        )
    }

    /// Observations per second over a window of `seconds`: `count / seconds`; 0 for a
    /// window that is not a positive number of seconds.
    pub fn rate(&self, seconds: f64) -> f64 {
        if seconds > 0.0 && seconds.is_finite() { self.count as f64 / seconds } else { 0.0 }
    }
}

/// `s` × 1000, exact in decimal: a bound written `0.003` becomes `3`, not
/// `3.0000000000000004`. The shortest decimal form of `s` that reads back as `s` (what
/// `{:e}` writes) has its exponent raised by 3 and is read again.
fn seconds_to_ms(s: f64) -> f64 {
    if !s.is_finite() {
        return s;
    }
    let text = format!("{s:e}");
    text.split_once('e')
        .and_then(|(mantissa, exp)| {
            let exp: i32 = exp.parse().ok()?;
            format!("{mantissa}e{}", exp + 3).parse().ok()
        })
        .unwrap_or(s * 1000.0)
}

/// The most a metrics page may weigh; bigger ones are an error rather than a memory hog.
const MAX_PAGE_BYTES: u64 = 32 << 20;

/// What Prometheus itself asks for (OpenMetrics first, then the classic text format); not
/// the protobuf format, which this module does not read.
const ACCEPT: &str = "application/openmetrics-text;version=1.0.0,\
    application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

/// Scrapes `http://127.0.0.1:{port}/metrics` and reads the histogram `name` from it.
///
/// Blocking (call it from `spawn_blocking`); `timeout` bounds the connection and the whole
/// exchange. No proxy from the environment is used and no redirect is followed. Any
/// failure (nothing listening, a timeout, a status other than 200, a page without the
/// histogram or with a malformed line of it) is a one-line error naming the address.
pub fn scrape(port: u16, name: &str, timeout: Duration) -> Result<Histogram, String> {
    let source = format!("127.0.0.1:{port}");
    let url = format!("http://{source}/metrics");
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .proxy(None)
        .max_redirects(0)
        .http_status_as_error(false)
        .timeout_connect(Some(timeout))
        .timeout_global(Some(timeout))
        .build()
        .into();
    let one_line = |e: ureq::Error| {
        let why = match e {
            ureq::Error::Timeout(_) => format!("no answer within {timeout:?}"),
            ureq::Error::Io(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                "nothing listens there (connection refused)".into()
            }
            e => e.to_string().replace('\n', " "),
        };
        format!("scraping {url}: {why}")
    };
    let mut response = agent.get(&url).header("Accept", ACCEPT).call().map_err(one_line)?;
    let status = response.status();
    if status != ureq::http::StatusCode::OK {
        return Err(format!("scraping {url}: the server answered {status}"));
    }
    let page = response
        .body_mut()
        .with_config()
        .limit(MAX_PAGE_BYTES)
        .read_to_string()
        .map_err(one_line)?;
    parse(&page, name, &source)
}

/// After − before, bucket by bucket: what a replica observed between two scrapes.
///
/// An error where a count went down (the replica restarted between the scrapes, so the
/// window is lost) or the bucket bounds changed.
pub fn delta(before: &Histogram, after: &Histogram) -> Result<Histogram, String> {
    let bounds = |h: &Histogram| h.buckets.iter().map(|&(le, _)| le).collect::<Vec<_>>();
    if bounds(before) != bounds(after) {
        return Err(format!(
            "the histogram's bucket bounds changed between the scrapes ({} → {})",
            show_bounds(&bounds(before)),
            show_bounds(&bounds(after))
        ));
    }
    let went_down = |what: &str, b: u64, a: u64| {
        format!(
            "the histogram's {what} went down between the scrapes ({b} → {a}): \
             did the replica restart?"
        )
    };
    let count = after
        .count
        .checked_sub(before.count)
        .ok_or_else(|| went_down("count", before.count, after.count))?;
    let buckets = before
        .buckets
        .iter()
        .zip(&after.buckets)
        .map(|(&(le, b), &(_, a))| {
            a.checked_sub(b)
                .map(|n| (le, n))
                .ok_or_else(|| went_down(&format!("bucket le={}", show_le(le)), b, a))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Histogram { count, sum: after.sum - before.sum, buckets })
}

/// Reads the histogram `name` from a metrics page in the Prometheus text format or
/// OpenMetrics, summed over its label sets; `source` (the address) goes into the errors.
///
/// This is [`scrape`] without the HTTP. A small hand-written parser rather than a crate:
/// the usual one, `prometheus-parse` (0.2), matches a sample line with the regular
/// expression `name(\{[^}]+\})?\s+value(\s+timestamp)?`, which cuts a label value with a
/// `}` in it short and takes an OpenMetrics exemplar (`… 3 # {trace_id="…"} 0.07`) for a
/// timestamp, and it brings regex, chrono, itertools and lazy_static along; the other
/// candidates are 0.1 releases (`prom_text_format_parser`, `prometheus-exposition-format-rs`
/// on nom). Only three line shapes of one metric are needed here.
pub fn parse(page: &str, name: &str, source: &str) -> Result<Histogram, String> {
    let bucket_name = format!("{name}_bucket");
    let count_name = format!("{name}_count");
    let sum_name = format!("{name}_sum");
    let mut series: BTreeMap<LabelSet, Series> = BTreeMap::new();
    let mut histograms_there = BTreeSet::new();
    let mut declared_type = None;

    for (index, raw) in page.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            let mut words = comment.split_whitespace();
            match (words.next(), words.next(), words.next()) {
                (Some("EOF"), None, None) => break,
                (Some("TYPE"), Some(metric), Some(kind)) => {
                    if kind == "histogram" {
                        histograms_there.insert(metric.to_string());
                    }
                    if metric == name {
                        declared_type = Some(kind.to_string());
                    }
                }
                _ => {}
            }
            continue;
        }
        let bad = |why: &str| {
            format!(
                "line {} of the metrics of {source} is malformed ({why}): {}",
                index + 1,
                shorten(line)
            )
        };
        // Only lines that may be this histogram's are parsed: those beginning with its
        // name, and those with the name quoted inside the braces (`{"name",…}`).
        if !line.starts_with(name) && !line.starts_with('{') {
            continue;
        }
        let sample = match parse_sample(line) {
            Ok(sample) => sample,
            Err(_) if !line.starts_with(name) => continue,
            Err(why) => {
                // A malformed line of another metric that begins like this one is not ours.
                let metric = line.split(['{', ' ', '\t']).next().unwrap_or_default();
                if metric == bucket_name || metric == count_name || metric == sum_name {
                    return Err(bad(why));
                }
                continue;
            }
        };
        let part = if sample.name == bucket_name {
            Part::Bucket
        } else if sample.name == count_name {
            Part::Count
        } else if sample.name == sum_name {
            Part::Sum
        } else {
            continue;
        };
        let value: f64 = parse_float(sample.value).ok_or_else(|| bad("the value is no number"))?;
        let mut le = None;
        let mut labels = Vec::new();
        for (label, v) in sample.labels {
            if label == "le" {
                le = Some(v);
            } else {
                labels.push((label, v));
            }
        }
        labels.sort();
        let entry = series.entry(LabelSet(labels)).or_default();
        match part {
            Part::Bucket => {
                let le = le.ok_or_else(|| bad("a bucket without an `le` label"))?;
                let le = parse_float(&le).ok_or_else(|| bad("`le` is no number"))?;
                let n = as_count(value).ok_or_else(|| bad("the count is no whole number"))?;
                entry.buckets.push((le, n));
            }
            Part::Count => {
                entry.count =
                    Some(as_count(value).ok_or_else(|| bad("the count is no whole number"))?);
            }
            Part::Sum => entry.sum = Some(value),
        }
    }

    if series.is_empty() {
        if let Some(kind) = declared_type.filter(|kind| kind != "histogram") {
            return Err(format!(
                "`{name}` in the metrics of {source} is a {}, not a histogram",
                shorten(&kind)
            ));
        }
        return Err(format!(
            "no histogram `{name}` in the metrics of {source} (histograms there: {})",
            list_some(&histograms_there)
        ));
    }

    let mut total: Option<(LabelSet, Histogram)> = None;
    for (labels, s) in series {
        let h = s.finish().map_err(|why| {
            format!(
                "the histogram `{name}{}` in the metrics of {source} {why}",
                shorten_labels(&labels)
            )
        })?;
        match &mut total {
            None => total = Some((labels, h)),
            Some((first, sum)) => {
                let bounds =
                    |h: &Histogram| h.buckets.iter().map(|&(le, _)| le).collect::<Vec<_>>();
                if bounds(sum) != bounds(&h) {
                    return Err(format!(
                        "the histogram `{name}{}` in the metrics of {source} has other \
                         bucket bounds than `{name}{}` ({} vs {}), so they cannot be summed",
                        shorten_labels(&labels),
                        shorten_labels(first),
                        show_bounds(&bounds(&h)),
                        show_bounds(&bounds(sum))
                    ));
                }
                sum.count = sum.count.saturating_add(h.count);
                sum.sum += h.sum;
                for (into, &(_, n)) in sum.buckets.iter_mut().zip(&h.buckets) {
                    into.1 = into.1.saturating_add(n);
                }
            }
        }
    }
    // `series` was not empty, so `total` is set.
    total.map(|(_, h)| h).ok_or_else(|| format!("no histogram `{name}` in the metrics of {source}"))
}

/// Which line of a histogram.
enum Part {
    Bucket,
    Count,
    Sum,
}

/// The labels of one series other than `le`, sorted by name.
#[derive(Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
struct LabelSet(Vec<(String, String)>);

impl std::fmt::Display for LabelSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.is_empty() {
            return Ok(());
        }
        f.write_str("{")?;
        for (i, (label, value)) in self.0.iter().enumerate() {
            let sep = if i == 0 { "" } else { "," };
            write!(f, "{sep}{label}={value:?}")?;
        }
        f.write_str("}")
    }
}

/// The lines of one label set, as read.
#[derive(Default)]
struct Series {
    buckets: Vec<(f64, u64)>,
    count: Option<u64>,
    sum: Option<f64>,
}

impl Series {
    /// Checks the buckets (an `le="+Inf"` one, no bound twice, cumulative counts) and makes
    /// the histogram; the error completes "the histogram `…` in the metrics of … ".
    fn finish(mut self) -> Result<Histogram, String> {
        if self.buckets.is_empty() {
            return Err("has no buckets (`_bucket` lines)".into());
        }
        self.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        if self.buckets.iter().any(|(le, _)| le.is_nan()) {
            return Err("has a bucket le=\"NaN\"".into());
        }
        for pair in self.buckets.windows(2) {
            if pair[0].0 == pair[1].0 {
                return Err(format!("has the bucket le=\"{}\" twice", show_le(pair[0].0)));
            }
            if pair[0].1 > pair[1].1 {
                return Err(format!(
                    "has buckets that are not cumulative (le=\"{}\" {} > le=\"{}\" {})",
                    show_le(pair[0].0),
                    pair[0].1,
                    show_le(pair[1].0),
                    pair[1].1
                ));
            }
        }
        let inf = match self.buckets.last() {
            Some(&(le, n)) if le == f64::INFINITY => n,
            _ => return Err("has no bucket le=\"+Inf\"".into()),
        };
        Ok(Histogram {
            count: self.count.unwrap_or(inf),
            sum: self.sum.unwrap_or(0.0),
            buckets: self.buckets,
        })
    }
}

/// A sample line: `name{labels} value [timestamp] [# {exemplar} value [timestamp]]`, the
/// name possibly quoted inside the braces instead (`{"name",labels}`).
struct Sample<'a> {
    name: String,
    labels: Vec<(String, String)>,
    value: &'a str,
}

fn parse_sample(line: &str) -> Result<Sample<'_>, &'static str> {
    let name_end = line
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(line.len());
    let mut name = line[..name_end].to_string();
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(after_brace) = rest.strip_prefix('{') {
        let (quoted_name, list, after) = parse_labels(after_brace)?;
        if let Some(quoted) = quoted_name {
            if !name.is_empty() {
                return Err("a metric name both before and inside the braces");
            }
            name = quoted;
        }
        labels = list;
        rest = after;
    }
    if name.is_empty() {
        return Err("no metric name");
    }
    if !rest.starts_with([' ', '\t']) {
        return Err("no blank between the name or labels and the value");
    }
    // The value is the first field; a timestamp and an exemplar (`# {…} v [t]`) may follow.
    let value = rest.split_whitespace().next().ok_or("no value")?;
    Ok(Sample { name, labels, value })
}

/// The labels after a `{`: (a quoted metric name if one stands among them, the labels,
/// what follows the `}`). Values unescape `\\`, `\"` and `\n`.
type Labels<'a> = (Option<String>, Vec<(String, String)>, &'a str);

fn parse_labels(mut s: &str) -> Result<Labels<'_>, &'static str> {
    let mut quoted_name = None;
    let mut labels = Vec::new();
    loop {
        s = s.trim_start();
        if let Some(after) = s.strip_prefix('}') {
            return Ok((quoted_name, labels, after));
        }
        let label = if let Some(after_quote) = s.strip_prefix('"') {
            let (text, after) = parse_quoted(after_quote)?;
            s = after.trim_start();
            if !s.starts_with('=') {
                // A bare quoted string is the metric name (Prometheus 3 UTF-8 names).
                if quoted_name.is_some() {
                    return Err("two quoted metric names");
                }
                quoted_name = Some(text);
                s = match s.strip_prefix(',') {
                    Some(after) => after,
                    None if s.starts_with('}') => s,
                    None => return Err("no `,` or `}` after a label"),
                };
                continue;
            }
            text
        } else {
            let end = s.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(s.len());
            if end == 0 {
                return Err("a label without a name");
            }
            let text = s[..end].to_string();
            s = s[end..].trim_start();
            text
        };
        s = s.strip_prefix('=').ok_or("no `=` after a label name")?.trim_start();
        let after_quote = s.strip_prefix('"').ok_or("a label value not in quotes")?;
        let (value, after) = parse_quoted(after_quote)?;
        labels.push((label, value));
        s = after.trim_start();
        s = match s.strip_prefix(',') {
            Some(after) => after,
            None if s.starts_with('}') => s,
            None => return Err("no `,` or `}` after a label"),
        };
    }
}

/// A quoted string after its opening `"`: (the text unescaped, what follows the closing `"`).
fn parse_quoted(s: &str) -> Result<(String, &str), &'static str> {
    let mut text = String::new();
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Ok((text, &s[i + 1..])),
            '\\' => match chars.next() {
                Some((_, 'n')) => text.push('\n'),
                Some((_, '\\')) => text.push('\\'),
                Some((_, '"')) => text.push('"'),
                Some((_, other)) => {
                    // The classic format keeps an unknown escape as it is.
                    text.push('\\');
                    text.push(other);
                }
                None => return Err("a label value without its closing quote"),
            },
            c => text.push(c),
        }
    }
    Err("a label value without its closing quote")
}

/// A value or `le` bound: a float, `+Inf`, `-Inf` or `NaN`.
fn parse_float(s: &str) -> Option<f64> {
    s.parse().ok()
}

/// A count as the clients write it (`7`, `7.0`, `1.2345e+07`): a whole number ≥ 0.
fn as_count(v: f64) -> Option<u64> {
    // `u64::MAX as f64` is 2^64, itself out of range.
    (v >= 0.0 && v.fract() == 0.0 && v < u64::MAX as f64).then_some(v as u64)
}

/// A bound as Prometheus writes it (`+Inf`, `0.005`).
fn show_le(le: f64) -> String {
    if le == f64::INFINITY { "+Inf".into() } else { le.to_string() }
}

fn show_bounds(bounds: &[f64]) -> String {
    let shown: Vec<String> = bounds.iter().map(|&le| show_le(le)).collect();
    shorten(&shown.join(", "))
}

/// At most ten names, then how many more.
fn list_some(names: &BTreeSet<String>) -> String {
    if names.is_empty() {
        return "none".into();
    }
    let mut out = String::new();
    for (i, n) in names.iter().take(10).enumerate() {
        let sep = if i == 0 { "" } else { ", " };
        let _ = write!(out, "{sep}{}", shorten(n));
    }
    if names.len() > 10 {
        let _ = write!(out, " and {} more", names.len() - 10);
    }
    out
}

/// Text of the page (a line, a name, a list) as an error message quotes it: cut to 120
/// characters, and every character that could change how a terminal or the journal shows
/// what follows as `?` ([`crate::sys::text::printable`]): the page is the caller's
/// program's, the message the agent's.
fn shorten(s: &str) -> String {
    const MAX: usize = 120;
    let cut = crate::sys::text::printable(s, MAX);
    if s.chars().nth(MAX).is_none() { cut } else { format!("{cut}…") }
}

/// A label set as an error message quotes it ([`shorten`]).
fn shorten_labels(labels: &LabelSet) -> String {
    shorten(&labels.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const INF: f64 = f64::INFINITY;

    fn buckets(h: &Histogram) -> Vec<(f64, u64)> {
        h.buckets.clone()
    }

    /// The classic text format as `prometheus_client` for Python (0.16) writes it: counts
    /// as floats, a `_created` gauge, the default collectors' metrics around it.
    const PYTHON_CLASSIC: &str =
        include_str!("../../../fuzz/seeds/prometheus_text/python_classic.txt");

    /// The classic text format as Go's client_golang writes it: integer counts, labels,
    /// `_sum` before `_count`, two label sets.
    const GO_CLASSIC: &str = include_str!("../../../fuzz/seeds/prometheus_text/go_classic.txt");

    /// The pages the fuzz target `prometheus_text` starts from (`fuzz/seeds/`).
    const SEEDS: [&str; 3] = [PYTHON_CLASSIC, GO_CLASSIC, OPENMETRICS];

    /// What the fuzz target `prometheus_text` (`fuzz/fuzz_targets/prometheus_text.rs`)
    /// holds of any page a replica serves: it never panics; a histogram read from it is
    /// one [`delta`] takes against itself, with latencies and a rate; and a page refused
    /// is said in one line of at most [`MOST_ERROR_CHARS`] characters with nothing of the
    /// page in it that could change how a terminal or the journal shows it.
    fn holds_for(page: &str) {
        for name in ["x", "request_latency_seconds", "rpc_duration_seconds", "lat_ms"] {
            match parse(page, name, "127.0.0.1:9101") {
                Ok(h) => {
                    let none = delta(&h, &h).unwrap();
                    assert_eq!(none.count, 0);
                    let _ = h.latencies_ms(name).percentile(99.0);
                    let _ = h.rate(1.5);
                }
                Err(e) => {
                    assert!(!e.contains('\n'), "{e:?}");
                    assert!(e.chars().count() <= MOST_ERROR_CHARS, "{} chars", e.len());
                    assert!(crate::sys::text::is_printable(&e), "{e:?}");
                }
            }
        }
    }

    /// The longest a refusal of a page may be (with a short histogram name and source).
    const MOST_ERROR_CHARS: usize = 2000;

    #[test]
    fn the_seed_pages_and_odd_ones_hold() {
        for seed in SEEDS {
            holds_for(seed);
        }
        let long = "y".repeat(100_000);
        for page in [
            // Escape sequences and bidirectional overrides where the page is quoted.
            "# TYPE \x1b]0;owned\x07 histogram\n".to_string(),
            "# TYPE x \x1b[2J\u{202E}gauge\n".to_string(),
            "x_bucket{le=\"0.1\"} \x1b[31m3\n".to_string(),
            "x_bucket{a=\"\x1b[31m\u{202E}\",le=\"0.1\"} 1\n".to_string(),
            // Page text long enough to make a message of megabytes.
            format!("# TYPE {long} histogram\n"),
            format!("# TYPE x {long}\n"),
            format!("x_bucket{{le=\"0.1\"}} {long}\n"),
            format!("x_bucket{{a=\"{long}\",le=\"0.1\"}} 1\n"),
            format!("x_bucket{{a=\"{long}\",le=\"+Inf\"}} 1\nx_bucket{{le=\"1\"}} 1\n"),
            format!(
                "x_bucket{{le=\"1\"}} 1\nx_bucket{{le=\"+Inf\"}} 1\nx_bucket{{a=\"{long}\",le=\"2\"}} 1\nx_bucket{{a=\"{long}\",le=\"+Inf\"}} 1\n"
            ),
        ] {
            holds_for(&page);
        }
    }

    /// One line of a page made of the parts of a histogram `x`: its buckets, count and sum
    /// with odd bounds, counts and labels, a `# TYPE` line or another metric.
    fn histogram_line() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let number = prop_oneof![
            Just("+Inf".to_string()),
            Just("-Inf".to_string()),
            Just("NaN".to_string()),
            Just("-0".to_string()),
            Just("1e308".to_string()),
            Just("18446744073709551615".to_string()),
            Just("9007199254740993".to_string()),
            (0u64..20).prop_map(|n| n.to_string()),
            any::<f64>().prop_map(|f| f.to_string()),
        ];
        let labels = proptest::option::of(prop_oneof![
            Just("a=\"1\",".to_string()),
            Just("a=\"2\",".to_string()),
            Just("\"x_bucket\",".to_string()),
            Just("b=\"\\\"}\",".to_string()),
        ]);
        let part = prop_oneof![
            Just("x_bucket"),
            Just("x_count"),
            Just("x_sum"),
            Just("x"),
            Just("x_bucket_total"),
            Just(""),
            Just("# TYPE x"),
        ];
        (part, labels, number.clone(), number).prop_map(|(part, labels, le, value)| {
            match (part, labels) {
                ("# TYPE x", _) => format!("# TYPE x {value}"),
                (part, Some(labels)) => format!("{part}{{{labels}le=\"{le}\"}} {value}"),
                (part, None) => format!("{part} {value}"),
            }
        })
    }

    proptest::proptest! {
        /// Pages of a histogram's parts in any order and with any figures.
        #[test]
        fn any_histogram_page_holds(lines in proptest::collection::vec(histogram_line(), 0..24)) {
            holds_for(&lines.join("\n"));
        }

        /// Arbitrary pages, and the seed pages with bytes inserted at any place.
        #[test]
        fn any_page_holds(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..400),
            cut in 0usize..5_000,
            junk in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..16),
        ) {
            holds_for(&String::from_utf8_lossy(&bytes));
            for seed in SEEDS {
                let at = cut % (seed.len() + 1);
                let mut mutated = seed.as_bytes()[..at].to_vec();
                mutated.extend_from_slice(&junk);
                mutated.extend_from_slice(&seed.as_bytes()[at..]);
                holds_for(&String::from_utf8_lossy(&mutated));
            }
        }
    }

    #[test]
    fn python_classic_format() {
        let h = parse(PYTHON_CLASSIC, "request_latency_seconds", "py").unwrap();
        assert_eq!(h.count, 5);
        assert_eq!(h.sum, 0.232);
        assert_eq!(buckets(&h), vec![(0.005, 2), (0.01, 3), (0.05, 4), (0.1, 4), (INF, 5)]);
    }

    #[test]
    fn go_classic_format_label_sets_are_summed() {
        let h = parse(GO_CLASSIC, "http_request_duration_seconds", "go").unwrap();
        assert_eq!(h.count, 33);
        assert_eq!(h.sum, 0.8125 + 1.5);
        assert_eq!(buckets(&h), vec![(0.005, 10), (0.025, 26), (0.1, 31), (INF, 33)]);
    }

    /// OpenMetrics with a unit, exemplars, timestamps, `_created` and `# EOF`, after which
    /// nothing counts.
    const OPENMETRICS: &str = include_str!("../../../fuzz/seeds/prometheus_text/openmetrics.txt");

    #[test]
    fn openmetrics_with_exemplars_timestamps_and_eof() {
        let page = OPENMETRICS;
        let h = parse(page, "rpc_duration_seconds", "om").unwrap();
        assert_eq!(h.count, 9);
        assert_eq!(h.sum, 0.125);
        assert_eq!(buckets(&h), vec![(0.01, 3), (0.1, 8), (1.0, 9), (INF, 9)]);
    }

    #[test]
    fn label_values_with_commas_quotes_braces_and_escapes() {
        let page = concat!(
            "lat_seconds_bucket{path=\"/a,b\",q=\"say \\\"hi\\\" {x}\",le=\"1\"} 1\n",
            "lat_seconds_bucket{path=\"/a,b\",q=\"say \\\"hi\\\" {x}\",le=\"+Inf\"} 2\n",
            "lat_seconds_count{q=\"say \\\"hi\\\" {x}\",path=\"/a,b\"} 2\n",
            "lat_seconds_sum{path=\"/a,b\",q=\"say \\\"hi\\\" {x}\"} 3.5\n",
            // One more label set: a backslash and a newline escaped, a trailing comma.
            "lat_seconds_bucket{path=\"C:\\\\dir\\nx\",q=\"\",le=\"1\",} 5\n",
            "lat_seconds_bucket{path=\"C:\\\\dir\\nx\",q=\"\",le=\"+Inf\",} 5\n",
            "lat_seconds_count{path=\"C:\\\\dir\\nx\",q=\"\"} 5\n",
            "lat_seconds_sum{path=\"C:\\\\dir\\nx\",q=\"\"} 0.5\n",
        );
        let h = parse(page, "lat_seconds", "esc").unwrap();
        assert_eq!(h.count, 7);
        assert_eq!(h.sum, 4.0);
        assert_eq!(buckets(&h), vec![(1.0, 6), (INF, 7)]);

        let (_, labels, rest) = parse_labels("a=\"x,\\\"y\\\\\\n\", b = \"}\" } 1").unwrap();
        assert_eq!(labels, vec![("a".into(), "x,\"y\\\n".into()), ("b".into(), "}".into())]);
        assert_eq!(rest, " 1");
    }

    #[test]
    fn quoted_utf8_metric_name() {
        let page = "{\"my.lat_seconds_bucket\",le=\"+Inf\"} 4\n{\"my.lat_seconds_count\"} 4\n";
        let h = parse(page, "my.lat_seconds", "utf8").unwrap();
        assert_eq!((h.count, buckets(&h)), (4, vec![(INF, 4)]));
    }

    #[test]
    fn count_and_sum_may_be_missing() {
        let page = "x_bucket{le=\"0.5\"} 1\nx_bucket{le=\"+Inf\"} 3\n";
        let h = parse(page, "x", "s").unwrap();
        assert_eq!((h.count, h.sum), (3, 0.0));
    }

    #[test]
    fn missing_histogram_lists_the_histograms_there() {
        let err = parse(GO_CLASSIC, "request_latency_seconds", "127.0.0.1:9101").unwrap_err();
        assert_eq!(
            err,
            "no histogram `request_latency_seconds` in the metrics of 127.0.0.1:9101 \
             (histograms there: http_request_duration_seconds)"
        );
        let err = parse("up 1\n", "x", "h:1").unwrap_err();
        assert!(err.ends_with("(histograms there: none)"), "{err}");

        let many: String = (0..15).map(|i| format!("# TYPE h{i:02} histogram\n")).collect();
        let err = parse(&many, "x", "h:1").unwrap_err();
        assert!(err.ends_with("h00, h01, h02, h03, h04, h05, h06, h07, h08, h09 and 5 more)"));
        assert!(!err.contains('\n'));
    }

    #[test]
    fn a_summary_of_that_name_is_named_as_such() {
        let page = "# TYPE x summary\nx{quantile=\"0.5\"} 0.1\nx_count 3\nx_sum 0.3\n";
        let err = parse(page, "x", "h:1").unwrap_err();
        assert!(err.contains("no buckets"), "{err}");
        let page = "# TYPE x summary\nx{quantile=\"0.5\"} 0.1\n";
        let err = parse(page, "x", "h:1").unwrap_err();
        assert_eq!(err, "`x` in the metrics of h:1 is a summary, not a histogram");
    }

    #[test]
    fn malformed_lines_of_the_histogram_are_errors() {
        for (line, why) in [
            ("x_bucket{le=\"0.1\"} many", "the value is no number"),
            ("x_bucket{le=\"0.1\" 3", "no `,` or `}` after a label"),
            ("x_bucket{le=\"0.1} 3", "closing quote"),
            ("x_bucket{le=0.1} 3", "a label value not in quotes"),
            ("x_bucket{le=\"fast\"} 3", "`le` is no number"),
            ("x_bucket{} 3", "a bucket without an `le` label"),
            ("x_bucket{le=\"0.1\"} 2.5", "the count is no whole number"),
            ("x_bucket{le=\"0.1\"} -1", "the count is no whole number"),
            ("x_count", "no blank"),
        ] {
            let page = format!("# TYPE x histogram\n{line}\nx_bucket{{le=\"+Inf\"}} 3\n");
            let err = parse(&page, "x", "h:1").unwrap_err();
            assert!(err.starts_with("line 2 of the metrics of h:1 is malformed ("), "{err}");
            assert!(err.contains(why), "{line}: {err}");
            assert!(err.ends_with(line), "{err}");
        }
        // Another metric's malformed line is not this histogram's business.
        let page = "x_total{a=\"b} 1\nxx garbage\nx_bucket{le=\"+Inf\"} 1\n";
        assert_eq!(parse(page, "x", "h:1").unwrap().count, 1);
    }

    #[test]
    fn inconsistent_buckets_are_errors() {
        let err = parse("x_bucket{le=\"0.1\"} 1\n", "x", "h:1").unwrap_err();
        assert!(err.contains("has no bucket le=\"+Inf\""), "{err}");
        let err =
            parse("x_bucket{le=\"0.1\"} 5\nx_bucket{le=\"+Inf\"} 3\n", "x", "h:1").unwrap_err();
        assert!(err.contains("not cumulative"), "{err}");
        let err = parse(
            "x_bucket{le=\"0.1\"} 1\nx_bucket{le=\"0.10\"} 1\nx_bucket{le=\"+Inf\"} 1\n",
            "x",
            "h:1",
        )
        .unwrap_err();
        assert!(err.contains("twice"), "{err}");
    }

    #[test]
    fn label_sets_with_other_bounds_are_an_error_naming_them() {
        let page = concat!(
            "x_bucket{m=\"get\",le=\"0.1\"} 1\nx_bucket{m=\"get\",le=\"+Inf\"} 1\n",
            "x_bucket{m=\"put\",le=\"0.2\"} 1\nx_bucket{m=\"put\",le=\"+Inf\"} 1\n",
        );
        let err = parse(page, "x", "127.0.0.1:9101").unwrap_err();
        assert_eq!(
            err,
            "the histogram `x{m=\"put\"}` in the metrics of 127.0.0.1:9101 has other bucket \
             bounds than `x{m=\"get\"}` (0.2, +Inf vs 0.1, +Inf), so they cannot be summed"
        );
    }

    #[test]
    fn buckets_out_of_order_are_sorted() {
        let page = "x_bucket{le=\"+Inf\"} 4\nx_bucket{le=\"1\"} 2\nx_bucket{le=\"0.5\"} 1\n";
        let h = parse(page, "x", "h:1").unwrap();
        assert_eq!(buckets(&h), vec![(0.5, 1), (1.0, 2), (INF, 4)]);
    }

    #[test]
    fn crlf_and_big_counts() {
        let page = "x_bucket{le=\"+Inf\"} 1.2345678e+07\r\nx_count 12345678\r\n";
        let h = parse(page, "x", "h:1").unwrap();
        assert_eq!((h.count, buckets(&h)), (12_345_678, vec![(INF, 12_345_678)]));
    }

    fn hist(count: u64, sum: f64, buckets: &[(f64, u64)]) -> Histogram {
        Histogram { count, sum, buckets: buckets.to_vec() }
    }

    #[test]
    fn delta_per_bucket() {
        let before = hist(5, 0.25, &[(0.01, 2), (0.1, 4), (INF, 5)]);
        let after = hist(12, 1.0, &[(0.01, 3), (0.1, 10), (INF, 12)]);
        let d = delta(&before, &after).unwrap();
        assert_eq!(d, hist(7, 0.75, &[(0.01, 1), (0.1, 6), (INF, 7)]));
        assert_eq!(d.rate(3.5), 2.0);
        assert_eq!(d.rate(0.0), 0.0);
        assert_eq!(delta(&before, &before).unwrap().count, 0);
    }

    #[test]
    fn delta_of_a_restarted_replica_is_an_error() {
        let before = hist(50, 2.0, &[(0.1, 40), (INF, 50)]);
        let after = hist(3, 0.1, &[(0.1, 3), (INF, 3)]);
        let err = delta(&before, &after).unwrap_err();
        assert_eq!(
            err,
            "the histogram's count went down between the scrapes (50 → 3): \
             did the replica restart?"
        );
        // A bucket alone going down is caught too.
        let after = hist(60, 3.0, &[(0.1, 30), (INF, 60)]);
        let err = delta(&before, &after).unwrap_err();
        assert!(err.contains("bucket le=0.1 went down between the scrapes (40 → 30)"), "{err}");
    }

    #[test]
    fn delta_with_other_bounds_is_an_error() {
        let before = hist(1, 0.0, &[(0.1, 1), (INF, 1)]);
        let after = hist(2, 0.0, &[(0.2, 1), (INF, 2)]);
        let err = delta(&before, &after).unwrap_err();
        assert_eq!(
            err,
            "the histogram's bucket bounds changed between the scrapes (0.1, +Inf → 0.2, +Inf)"
        );
    }

    #[test]
    fn latencies_in_ms_from_seconds() {
        let h = hist(6, 0.0, &[(0.001, 1), (0.0025, 2), (0.003, 3), (0.1, 4), (2.5, 5), (INF, 6)]);
        assert_eq!(
            h.latencies_ms("request_latency_seconds"),
            Latencies::Buckets(vec![
                (1.0, 1),
                (2.5, 2),
                (3.0, 3),
                (100.0, 4),
                (2500.0, 5),
                (INF, 6)
            ])
        );
        // Any name not in milliseconds is taken as seconds.
        assert_eq!(h.latencies_ms("latency"), h.latencies_ms("request_latency_seconds"));
    }

    #[test]
    fn latencies_in_ms_as_they_are() {
        let h = hist(2, 0.0, &[(2.5, 1), (INF, 2)]);
        let as_is = Latencies::Buckets(vec![(2.5, 1), (INF, 2)]);
        assert_eq!(h.latencies_ms("step_time_milliseconds"), as_is);
        assert_eq!(h.latencies_ms("step_ms"), as_is);
        assert_eq!(h.latencies_ms("step_msec"), Latencies::Buckets(vec![(2500.0, 1), (INF, 2)]));
    }

    #[test]
    fn nothing_observed_is_no_latencies() {
        let h = hist(0, 0.0, &[(0.1, 0), (INF, 0)]);
        assert_eq!(h.latencies_ms("x_seconds"), Latencies::None);
    }

    #[test]
    fn seconds_to_ms_is_exact_in_decimal() {
        for (s, ms) in [
            (0.003, 3.0),
            (0.0001, 0.1),
            (0.007, 7.0),
            (0.35, 350.0),
            (1e-9, 1e-6),
            (12.0, 12000.0),
            (0.0, 0.0),
        ] {
            assert_eq!(seconds_to_ms(s), ms, "{s}");
        }
        assert_eq!(seconds_to_ms(INF), INF);
    }
}
