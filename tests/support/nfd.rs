//! The check of node-feature-discovery feature files (issue 40): what NFD v0.19.0's
//! `local` source makes of a file in `features.d`, and whether every label in it would
//! reach the node, by NFD's rules plus two of gpushare's own.
//!
//! NFD's rules (kubernetes-sigs/node-feature-discovery tag v0.19.0, file:line):
//! - a file whose name starts with `.` is skipped, so a writer renames a dot-file into
//!   place (source/local/local.go:266-271; docs/usage/customization-guide.md:243-249);
//!   only regular files are read (local.go:311), of at most 65536 bytes, else ignored
//!   whole (local.go:63-64, 311-314; guide:291-292);
//! - lines split on `\n` and trimmed (local.go:199-200, 322); empty lines skipped; a line
//!   starting with `#` is a comment, unless it starts with `# +`: a directive
//!   `expiry-time=<RFC 3339>` (the time trimmed; it holds for every later line until the
//!   next one, and a line whose time is before now is dropped), `no-label` or
//!   `no-feature` (the next line only), anything else an error (local.go:157-186,
//!   202-234; guide:296-325);
//! - `key` or `key=value`, split at the first `=`, a missing value is `true`
//!   (local.go:217-250; guide:278-285); a key written twice: the last wins (local.go:241-249);
//! - the worker keeps a label only if the key is a Kubernetes qualified name and the value
//!   a label value (pkg/nfd-worker/nfd-worker.go:818-831: apimachinery's
//!   `validation.IsQualifiedName` and `IsValidLabelValue`, v0.35.3 in NFD's go.mod; the
//!   same text is vendored at apimachinery v0.36.3 in k8s-device-plugin v0.20.0,
//!   pkg/api/validate/content/kube.go:24-94 and dns.go:23-101): a key is `[prefix/]name`
//!   with one `/` at most, the prefix a lowercase RFC 1123 subdomain of at most 253
//!   characters, the name 1 to 63 characters of `[A-Za-z0-9._-]` starting and ending
//!   alphanumeric; a value 0 to 63 of the same;
//! - the master refuses an unprefixed key (auto-prefixing it is deprecated, guide:351-356)
//!   and a `kubernetes.io` or `*.kubernetes.io` namespace but NFD's own
//!   (pkg/apis/nfd/validate/validate.go:95-121, pkg/nfd-master/nfd-master.go:522-554).
//!
//! Stricter here, so that a file that passes publishes exactly its lines: a directive NFD
//! cannot read, a label line already expired, or a key written twice is refused. And
//! gpushare's own rules: no key in a `kubernetes.io` or `k8s.io` namespace at all (both are
//! reserved to Kubernetes' own components), and none in `nvidia.com` or a subdomain of it
//! (such a label starts NVIDIA's components, `nvidia.com/mps.capable=true` NVIDIA's MPS
//! daemon set).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

/// The largest feature file NFD reads (local.go:64).
pub const MAX_FEATURE_FILE_SIZE: u64 = 65536;
/// The longest label name (the part after the `/`) and label value.
pub const MAX_NAME: usize = 63;
/// The longest label prefix (a DNS subdomain).
pub const MAX_PREFIX: usize = 253;

/// The feature file at `path`, checked as NFD's local source reads it in its directory
/// now: `Ok` holds the labels it publishes (key to value); `Err` every problem, one a line
/// (`<path>: line N: ...`).
pub fn check_feature_file(path: &Path) -> Result<BTreeMap<String, String>, String> {
    let shown = path.display();
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    if name.is_empty() || name.starts_with('.') {
        return Err(format!("{shown}: NFD skips a file named {name:?} (a dot-file or no name)"));
    }
    let meta = std::fs::metadata(path).map_err(|e| format!("{shown}: {e}"))?;
    if !meta.is_file() {
        return Err(format!("{shown}: not a regular file, NFD reads no lines from it"));
    }
    if meta.len() > MAX_FEATURE_FILE_SIZE {
        let size = meta.len();
        return Err(format!(
            "{shown}: {size} bytes, NFD ignores files over {MAX_FEATURE_FILE_SIZE}"
        ));
    }
    let bytes = std::fs::read(path).map_err(|e| format!("{shown}: {e}"))?;
    check_features(&bytes, SystemTime::now()).map_err(|problems| {
        problems.iter().map(|p| format!("{shown}: {p}")).collect::<Vec<_>>().join("\n")
    })
}

/// A feature file's contents, read as NFD's local source reads them at `now`: `Ok` holds
/// the labels it publishes, `Err` every problem (`line N: ...`).
pub fn check_features(
    bytes: &[u8],
    now: SystemTime,
) -> Result<BTreeMap<String, String>, Vec<String>> {
    let mut problems = Vec::new();
    if bytes.len() as u64 > MAX_FEATURE_FILE_SIZE {
        problems
            .push(format!("{} bytes, NFD ignores files over {MAX_FEATURE_FILE_SIZE}", bytes.len()));
    }
    let now = nanos_since_epoch(now);
    let mut labels = BTreeMap::new();
    // NFD starts with "expires now", which `Before(now)` does not drop.
    let mut expiry = now;
    let mut no_label = false;
    for (i, raw) in bytes.split(|&b| b == b'\n').enumerate() {
        let at = i + 1;
        let text = String::from_utf8_lossy(raw);
        let line = text.trim();
        if line.is_empty() {
            continue;
        }
        if line.starts_with('#') {
            match directive(line) {
                Ok(None) => {}
                Ok(Some(Directive::Expiry(nanos))) => expiry = nanos,
                Ok(Some(Directive::NoLabel)) => no_label = true,
                // Features are not labels: nothing here depends on them.
                Ok(Some(Directive::NoFeature)) => {}
                Err(e) => problems.push(format!("line {at}: {e}")),
            }
            continue;
        }
        if expiry < now {
            problems.push(format!("line {at}: expired (NFD drops it): {line}"));
            continue;
        }
        let (key, value) = line.split_once('=').unwrap_or((line, "true"));
        if !no_label {
            match check_label(key, value) {
                Ok(()) if labels.contains_key(key) => {
                    problems.push(format!("line {at}: {key:?} written twice (NFD keeps the last)"))
                }
                Ok(()) => {
                    labels.insert(key.to_string(), value.to_string());
                }
                Err(e) => problems.push(format!("line {at}: {e}")),
            }
        }
        // A directive holds for one feature line (local.go:232-234).
        no_label = false;
    }
    if problems.is_empty() { Ok(labels) } else { Err(problems) }
}

/// A directive line's meaning.
enum Directive {
    /// `# +expiry-time=<RFC 3339>`, in nanoseconds since the epoch.
    Expiry(i128),
    NoLabel,
    NoFeature,
}

/// A line starting with `#`: `None` for a comment, else the directive (local.go:157-186).
fn directive(line: &str) -> Result<Option<Directive>, String> {
    let Some(directive) = line.strip_prefix("# +") else { return Ok(None) };
    let (key, value) = match directive.split_once('=') {
        Some((key, value)) => (key, Some(value)),
        None => (directive, None),
    };
    match key {
        "expiry-time" => {
            let Some(value) = value else {
                return Err(format!("{line:?}: should be '# +expiry-time=value'"));
            };
            let nanos = parse_rfc3339(value.trim())
                .ok_or_else(|| format!("{line:?}: the expiry time is not RFC 3339"))?;
            Ok(Some(Directive::Expiry(nanos)))
        }
        "no-label" => Ok(Some(Directive::NoLabel)),
        "no-feature" => Ok(Some(Directive::NoFeature)),
        other => Err(format!("unknown feature file directive {other:?}")),
    }
}

/// A label NFD publishes and gpushare may write: `Err` says which rule it breaks.
pub fn check_label(key: &str, value: &str) -> Result<(), String> {
    check_qualified_name(key).map_err(|e| format!("label key {key:?}: {e}"))?;
    let Some((namespace, _)) = key.split_once('/') else {
        return Err(format!("label key {key:?}: no namespace (NFD refuses unprefixed keys)"));
    };
    let within = |domain: &str| namespace == domain || namespace.ends_with(&format!(".{domain}"));
    if within("kubernetes.io") || within("k8s.io") {
        return Err(format!("label key {key:?}: {namespace} is Kubernetes' own namespace"));
    }
    if within("nvidia.com") {
        return Err(format!(
            "label key {key:?}: {namespace} is NVIDIA's (its labels start NVIDIA's components)"
        ));
    }
    check_label_value(value).map_err(|e| format!("label {key:?}: value {value:?}: {e}"))
}

/// apimachinery's `IsQualifiedName` (`IsLabelKey`).
pub fn check_qualified_name(key: &str) -> Result<(), String> {
    let parts: Vec<&str> = key.split('/').collect();
    let name = match parts[..] {
        [name] => name,
        [prefix, name] => {
            if prefix.is_empty() {
                return Err("the prefix is empty".into());
            }
            check_dns_subdomain(prefix).map_err(|e| format!("prefix {prefix:?}: {e}"))?;
            name
        }
        _ => return Err("more than one '/'".into()),
    };
    if name.is_empty() {
        return Err("the name is empty".into());
    }
    if name.len() > MAX_NAME {
        return Err(format!("the name is over {MAX_NAME} characters"));
    }
    if !is_label_word(name) {
        return Err(format!("the name {name:?} is not [A-Za-z0-9._-] alphanumeric at both ends"));
    }
    Ok(())
}

/// apimachinery's `IsValidLabelValue`: empty, or a label word of at most 63 characters.
pub fn check_label_value(value: &str) -> Result<(), String> {
    if value.len() > MAX_NAME {
        return Err(format!("over {MAX_NAME} characters"));
    }
    if !value.is_empty() && !is_label_word(value) {
        return Err("not [A-Za-z0-9._-] alphanumeric at both ends".into());
    }
    Ok(())
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`, the whole of `s`.
fn is_label_word(s: &str) -> bool {
    let ends = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    ends(s.chars().next())
        && ends(s.chars().last())
        && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// A lowercase RFC 1123 subdomain of at most 253 characters: dot-separated labels of
/// `[a-z0-9-]`, alphanumeric at both ends.
pub fn check_dns_subdomain(s: &str) -> Result<(), String> {
    if s.len() > MAX_PREFIX {
        return Err(format!("over {MAX_PREFIX} characters"));
    }
    let label_ok = |l: &str| {
        let end = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
        end(l.chars().next())
            && end(l.chars().last())
            && l.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    };
    if s.split('.').all(label_ok) {
        Ok(())
    } else {
        Err("not a lowercase RFC 1123 subdomain".into())
    }
}

fn nanos_since_epoch(t: SystemTime) -> i128 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as i128,
        Err(e) => -(e.duration().as_nanos() as i128),
    }
}

/// Go's `time.Parse(time.RFC3339, s)`: `YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)`, the date
/// and time in range; nanoseconds since the epoch.
pub fn parse_rfc3339(s: &str) -> Option<i128> {
    let b = s.as_bytes();
    let num = |from: usize, len: usize| -> Option<i64> {
        let part = b.get(from..from + len)?;
        part.iter()
            .all(u8::is_ascii_digit)
            .then(|| part.iter().fold(0i64, |n, d| n * 10 + i64::from(d - b'0')))
    };
    let at = |i: usize, c: u8| b.get(i) == Some(&c);
    if !(at(4, b'-') && at(7, b'-') && at(10, b'T') && at(13, b':') && at(16, b':')) {
        return None;
    }
    let (year, month, day) = (num(0, 4)?, num(5, 2)?, num(8, 2)?);
    let (hour, minute, second) = (num(11, 2)?, num(14, 2)?, num(17, 2)?);
    if !(1..=12).contains(&month) || day < 1 || day > days_in_month(year, month) {
        return None;
    }
    if hour > 23 || minute > 59 || second > 59 {
        return None;
    }
    let mut i = 19;
    let mut fraction: i128 = 0;
    if matches!(b.get(i), Some(b'.' | b',')) {
        let digits = b[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
        if digits == 0 || digits > 9 {
            return None;
        }
        let value = num(i + 1, digits)?;
        fraction = i128::from(value) * 10i128.pow(9 - digits as u32);
        i += 1 + digits;
    }
    let offset = match b.get(i..)? {
        b"Z" => 0,
        [sign @ (b'+' | b'-'), _, _, b':', _, _] => {
            let (h, m) = (num(i + 1, 2)?, num(i + 4, 2)?);
            if h > 23 || m > 59 {
                return None;
            }
            let minutes = h * 60 + m;
            if *sign == b'-' { -minutes * 60 } else { minutes * 60 }
        }
        _ => return None,
    };
    let days = days_from_civil(year, month, day);
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second - offset;
    Some(i128::from(seconds) * 1_000_000_000 + fraction)
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to the date (proleptic Gregorian; Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// 2026-01-01T00:00:00Z.
    fn now() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_767_225_600)
    }

    fn labels(text: &str) -> Result<BTreeMap<String, String>, Vec<String>> {
        check_features(text.as_bytes(), now())
    }

    #[test]
    fn rfc3339_times_read_as_go_reads_them() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_rfc3339("2026-01-01T00:00:00Z"), Some(1_767_225_600 * 1_000_000_000));
        assert_eq!(parse_rfc3339("1970-01-01T01:00:00+01:00"), Some(0));
        assert_eq!(parse_rfc3339("1969-12-31T23:00:00-01:00"), Some(0));
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00.5Z"), Some(500_000_000));
        assert!(parse_rfc3339("2024-02-29T00:00:00Z").is_some());
        for bad in [
            "",
            "2023-02-29T00:00:00Z",
            "2023-13-01T00:00:00Z",
            "2023-01-01 00:00:00Z",
            "2023-01-01T24:00:00Z",
            "2023-01-01T00:00:00",
            "2023-01-01T00:00:00+0100",
            "2023-01-01T00:00:00.Z",
            "2023-1-01T00:00:00Z",
            "2023-01-01T00:00:00Zjunk",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn good_lines_become_labels() {
        let text = "# Written by gpushare-agent; do not edit.\n\
                    \n\
                    gpushare.io/profile=half-balanced\n\
                    gpushare.io/gpu-0.mig.1g.10gb=2\n  gpushare.io/spaced=x  \r\n\
                    vendor.example.com/flag\n\
                    gpushare.io/empty=\n\
                    # a comment\n\
                    #+expiry-time=garbage is a comment\n\
                    # +no-label\n\
                    unprefixed-feature-only=yes\n\
                    # +expiry-time=2080-07-28T11:22:33Z\n\
                    gpushare.io/A_b.c-9=Z_9.a-b\n";
        let want: BTreeMap<String, String> = [
            ("gpushare.io/profile", "half-balanced"),
            ("gpushare.io/gpu-0.mig.1g.10gb", "2"),
            ("gpushare.io/spaced", "x"),
            ("vendor.example.com/flag", "true"),
            ("gpushare.io/empty", ""),
            ("gpushare.io/A_b.c-9", "Z_9.a-b"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(labels(text).unwrap(), want);
        assert_eq!(labels("").unwrap(), BTreeMap::new());
    }

    #[test]
    fn each_bad_line_alone_is_refused() {
        let long = "a".repeat(64);
        let long_prefix = format!("{}.io/x", "a".repeat(251));
        for (why, line) in [
            ("a value with '=' in it", "gpushare.io/x=a=b".to_string()),
            ("a value with a space", "gpushare.io/x=a b".to_string()),
            ("a value ending in '-'", "gpushare.io/x=a-".to_string()),
            ("a value of 64 characters", format!("gpushare.io/x={long}")),
            ("a name of 64 characters", format!("gpushare.io/{long}=1")),
            ("a prefix over 253 characters", long_prefix),
            ("a name starting with '.'", "gpushare.io/.x=1".to_string()),
            ("a space in the key", "gpushare.io/x =1".to_string()),
            ("an upper-case prefix", "Gpushare.io/x=1".to_string()),
            ("an empty prefix", "/x=1".to_string()),
            ("an empty name", "gpushare.io/=1".to_string()),
            ("two '/'", "gpushare.io/a/b=1".to_string()),
            ("no namespace", "profile=x".to_string()),
            ("kubernetes.io", "kubernetes.io/x=1".to_string()),
            ("NFD's own namespace", "feature.node.kubernetes.io/x=1".to_string()),
            ("k8s.io", "k8s.io/x=1".to_string()),
            ("nvidia.com", "nvidia.com/mps.capable=true".to_string()),
            ("a subdomain of nvidia.com", "gfd.nvidia.com/x=1".to_string()),
            ("a non-ASCII value", "gpushare.io/x=é".to_string()),
            ("a key written twice", "gpushare.io/x=1\ngpushare.io/x=2".to_string()),
            ("an unknown directive", "# +expiry=2080-01-01T00:00:00Z".to_string()),
            ("an expiry without '='", "# +expiry-time".to_string()),
            ("an expiry not RFC 3339", "# +expiry-time=2080-01-01".to_string()),
            ("an expired line", "# +expiry-time=2002-07-28T11:22:33Z\ngpushare.io/x=1".to_string()),
        ] {
            let text = format!("gpushare.io/profile=all-mps\n{line}\n");
            assert!(labels(&text).is_err(), "{why}: {line:?} passes");
        }
        // The well-formed neighbours of some of them pass.
        for line in [
            format!("gpushare.io/{}=1", "a".repeat(63)),
            format!("gpushare.io/x={}", "a".repeat(63)),
            "example.com/x=1".to_string(),
            format!("{}.io/x=1", "a".repeat(250)),
            "nvidia.community/x=1".to_string(),
            "# +expiry-time=2080-07-28T11:22:33Z\ngpushare.io/x=1".to_string(),
            "# +expiry-time= 2080-07-28T11:22:33+02:00 \ngpushare.io/x=1".to_string(),
        ] {
            let text = format!("gpushare.io/profile=all-mps\n{line}\n");
            assert!(labels(&text).is_ok(), "{line:?}: {:?}", labels(&text));
        }
    }

    #[test]
    fn an_expiry_holds_until_the_next_one() {
        let text = "# +expiry-time=2080-07-28T11:22:33Z\n\
                    gpushare.io/a=1\n\
                    # +expiry-time=2012-07-28T11:22:33Z\n\
                    gpushare.io/b=1\n\
                    gpushare.io/c=1\n\
                    # +expiry-time=2070-07-28T11:22:33Z\n\
                    gpushare.io/d=1\n";
        let problems = labels(text).unwrap_err();
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].starts_with("line 4:") && problems[1].starts_with("line 5:"));
    }

    #[test]
    fn a_file_over_64_kib_or_named_as_a_dot_file_is_refused() {
        let line = "gpushare.io/x=1\n";
        let big = format!("{}{}", "#\n".repeat(32_761), line);
        assert_eq!(big.len(), 65_538);
        assert!(check_features(big.as_bytes(), now()).is_err());
        assert!(check_features(&big.as_bytes()[2..], now()).is_ok(), "65536 bytes pass");

        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("gpushare");
        std::fs::write(&good, line).unwrap();
        assert_eq!(check_feature_file(&good).unwrap()["gpushare.io/x"], "1");
        let hidden = dir.path().join(".gpushare");
        std::fs::write(&hidden, line).unwrap();
        assert!(check_feature_file(&hidden).is_err());
        assert!(check_feature_file(dir.path()).is_err(), "a directory");
        let large = dir.path().join("large");
        std::fs::write(&large, &big).unwrap();
        assert!(check_feature_file(&large).is_err());
    }
}
