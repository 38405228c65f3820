//! TOML → [`Profile`], with every error tied to a line and column.
//!
//! serde and the `toml` crate do the syntax and the field names (`deny_unknown_fields`
//! turns typos into errors); the values whose meaning is ours (selectors, MIG layouts,
//! sizes, ranges) are read from spanned values and checked here.

use std::collections::BTreeMap;
use std::ops::Range;

use gpushare_proto::MPS_MAX_CLIENTS;
use serde::Deserialize;
use toml::Spanned;

use super::{
    GpuRule, Location, MAX_LIST_ITEMS, MAX_MIG_INSTANCES, MAX_RULES, MigKey, MigLayout,
    MpsSettings, Profile, ProfileError, Selector, Sharing, check_size,
};
use crate::catalog;
use crate::node::TimeSliceInterval;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProfile {
    name: Option<Spanned<String>>,
    description: Option<String>,
    #[serde(default)]
    gpu: Vec<Spanned<RawRule>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    select: Spanned<toml::Value>,
    device_filter: Option<Spanned<toml::Value>>,
    mig: Option<Spanned<toml::Value>>,
    sharing: Option<Spanned<RawSharing>>,
    #[serde(default)]
    instance_sharing: BTreeMap<String, Spanned<RawSharing>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
enum RawSharing {
    Exclusive,
    TimeSlicing(RawTimeSlicing),
    Mps(RawMps),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTimeSlicing {
    interval: Option<String>,
    replicas: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMps {
    replicas: Option<u32>,
    active_thread_percentage: Option<u32>,
    pinned_memory_limit: Option<toml::Value>,
    max_clients: Option<u32>,
}

/// Parses and validates a profile. `origin` names the text in errors (a path or
/// `built-in:<name>`); a text without `name` is named after `default_name` (a file's stem),
/// made valid by [`name_from_stem`].
pub fn parse_profile(
    text: &str,
    origin: &str,
    default_name: Option<&str>,
) -> Result<Profile, ProfileError> {
    check_size(text, origin)?;
    let cx = Context { lines: LineIndex::new(text), origin };
    let raw: RawProfile = toml::from_str(text).map_err(|e| {
        let span = e.span().unwrap_or(0..0);
        cx.error(&span, e.message().trim().replace('\n', " "))
    })?;

    let (name, name_span) = match &raw.name {
        Some(n) => (n.get_ref().clone(), n.span()),
        None => match default_name {
            Some(d) => (name_from_stem(d), 0..0),
            None => return Err(cx.error(&(0..0), "missing `name`".into())),
        },
    };
    if !is_valid_name(&name) {
        return Err(cx.error(
            &name_span,
            format!(
                "invalid profile name {name:?}: use 1-64 characters of a-z, 0-9, '.', '_' and '-', starting with a letter or digit"
            ),
        ));
    }
    if raw.gpu.is_empty() {
        return Err(cx.error(&(0..0), "the profile has no [[gpu]] rule".into()));
    }
    if let Some(extra) = raw.gpu.get(MAX_RULES) {
        return Err(cx.error(
            &extra.span(),
            format!("more than {MAX_RULES} [[gpu]] rules, the most a profile may have"),
        ));
    }

    let rules = raw.gpu.iter().map(|r| cx.rule(r)).collect::<Result<Vec<_>, _>>()?;
    Ok(Profile { name, description: raw.description.unwrap_or_default(), rules })
}

/// The name of a profile whose text has none, after a file stem: lowercased, each run of
/// characters other than a-z, 0-9, '.', '_' and '-' made one '-', cut to 64 characters and
/// to a letter or digit at both ends (`Lab Split.toml` → `lab-split`, `<stdin>` → `stdin`),
/// else [`FALLBACK_NAME`].
pub fn name_from_stem(stem: &str) -> String {
    let mut name = String::new();
    for c in stem.chars().flat_map(char::to_lowercase) {
        if c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c) {
            name.push(c);
        } else if !name.ends_with('-') {
            name.push('-');
        }
    }
    let edge = |c: char| !c.is_ascii_alphanumeric();
    // ASCII only by now: any byte is a character boundary.
    let mut name = name.trim_start_matches(edge).to_string();
    name.truncate(64);
    match name.trim_end_matches(edge) {
        "" => FALLBACK_NAME.to_string(),
        valid => valid.to_string(),
    }
}

/// The name of a profile whose origin gives none (`-`, `<>`).
pub const FALLBACK_NAME: &str = "unnamed";

fn is_valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() <= 64
        && chars.next().is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c))
}

struct Context<'a> {
    lines: LineIndex<'a>,
    origin: &'a str,
}

impl Context<'_> {
    fn location(&self, offset: usize) -> Location {
        let (line, column) = self.lines.line_column(offset);
        Location { origin: self.origin.to_string(), line, column }
    }

    fn error(&self, span: &Range<usize>, message: String) -> ProfileError {
        ProfileError { location: self.location(span.start), message }
    }

    fn rule(&self, raw: &Spanned<RawRule>) -> Result<GpuRule, ProfileError> {
        let location = self.location(raw.span().start);
        let raw = raw.get_ref();
        let select = self.selector(&raw.select)?;
        let mig = match &raw.mig {
            None => MigLayout::Disabled,
            Some(m) => self.mig(m)?,
        };
        let sharing = match &raw.sharing {
            None => Sharing::Exclusive,
            Some(s) => self.sharing(s, &mig)?,
        };

        let mut instance_sharing = Vec::new();
        for (key, value) in &raw.instance_sharing {
            let MigLayout::Enabled(instances) = &mig else {
                return Err(self.error(
                    &value.span(),
                    "instance_sharing needs a MIG layout (`mig = { ... }`) in the same rule".into(),
                ));
            };
            let key = parse_mig_key(key).map_err(|m| self.error(&value.span(), m))?;
            if !instances.iter().any(|(k, _)| *k == key) {
                return Err(self.error(
                    &value.span(),
                    format!("instance_sharing names {key}, which the rule's `mig` layout does not contain"),
                ));
            }
            instance_sharing.push((key, self.sharing(value, &mig)?));
        }
        // Time-slicing is refused under MIG (see `sharing`), so MPS and time-slicing
        // cannot meet in one rule.
        let device_filter = match &raw.device_filter {
            None => Vec::new(),
            Some(v) => self.device_filter(v)?,
        };
        Ok(GpuRule { select, device_filter, location, mig, sharing, instance_sharing })
    }

    fn selector(&self, value: &Spanned<toml::Value>) -> Result<Selector, ProfileError> {
        let err = |m: String| self.error(&value.span(), m);
        match value.get_ref() {
            toml::Value::Integer(i) => {
                let i = u32::try_from(*i).map_err(|_| err(format!("select: bad GPU index {i}")))?;
                Ok(Selector::Indices(vec![(i, i)]))
            }
            toml::Value::Array(items) => {
                if items.len() > MAX_LIST_ITEMS {
                    return Err(err(format!("select: {}", too_many("GPU indices"))));
                }
                let mut ranges = Vec::new();
                for item in items {
                    match item.as_integer().and_then(|i| u32::try_from(i).ok()) {
                        Some(i) => ranges.push((i, i)),
                        None => return Err(err("select: a list holds GPU indices only".into())),
                    }
                }
                if ranges.is_empty() {
                    return Err(err("select: the list is empty".into()));
                }
                Ok(Selector::Indices(ranges))
            }
            toml::Value::String(s) => parse_selector(s).map_err(err),
            other => Err(err(format!(
                "select: expected a string or an index, found {}",
                other.type_str()
            ))),
        }
    }

    fn device_filter(&self, value: &Spanned<toml::Value>) -> Result<Vec<u32>, ProfileError> {
        let items: Vec<&toml::Value> = match value.get_ref() {
            toml::Value::Array(items) => items.iter().collect(),
            one => vec![one],
        };
        if items.len() > MAX_LIST_ITEMS {
            return Err(
                self.error(&value.span(), format!("device_filter: {}", too_many("device ids")))
            );
        }
        items
            .into_iter()
            .map(|item| {
                item.as_str().and_then(|s| parse_pci_device_id(s).ok()).ok_or_else(|| {
                    self.error(
                        &value.span(),
                        "device_filter: expected PCI device ids such as \"0x20B010DE\"".into(),
                    )
                })
            })
            .collect()
    }

    fn mig(&self, value: &Spanned<toml::Value>) -> Result<MigLayout, ProfileError> {
        let err = |m: String| self.error(&value.span(), m);
        match value.get_ref() {
            toml::Value::Boolean(false) => Ok(MigLayout::Disabled),
            toml::Value::String(s) if s == "disabled" => Ok(MigLayout::Disabled),
            toml::Value::Table(table) => {
                let mut instances = Vec::new();
                for (key, count) in table {
                    let key = parse_mig_key(key).map_err(&err)?;
                    let count = count
                        .as_integer()
                        .and_then(|c| u32::try_from(c).ok())
                        .filter(|&c| c <= 8)
                        .ok_or_else(|| err(format!("mig: the count of {key} must be a whole number from 0 to 8")))?;
                    if count > 0 {
                        instances.push((key, count));
                    }
                }
                let total: u64 = instances.iter().map(|(_, c)| u64::from(*c)).sum();
                if total > MAX_MIG_INSTANCES {
                    return Err(err(format!("mig: {}", too_many_instances(total, "rule"))));
                }
                Ok(MigLayout::Enabled(instances))
            }
            _ => Err(err(
                "mig: expected \"disabled\" or a table of instance counts such as { \"1g\" = 2, \"3g.20gb\" = 1 }".into(),
            )),
        }
    }

    /// The sharing of a whole GPU or, under a MIG layout `mig`, of its instances.
    fn sharing(
        &self,
        value: &Spanned<RawSharing>,
        mig: &MigLayout,
    ) -> Result<Sharing, ProfileError> {
        let err = |m: String| self.error(&value.span(), m);
        let in_range = |what: &str, v: Option<u32>, lo: u32, hi: u32| match v {
            Some(x) if !(lo..=hi).contains(&x) => {
                Err(err(format!("{what} must be from {lo} to {hi}, not {x}")))
            }
            _ => Ok(v),
        };
        match value.get_ref() {
            RawSharing::Exclusive => Ok(Sharing::Exclusive),
            // The driver's time-slice interval (nvidia-smi compute-policy) is per whole GPU;
            // under MIG it would be accepted and silently not apply.
            RawSharing::TimeSlicing(_) if *mig != MigLayout::Disabled => Err(err(
                "time-slicing needs MIG off: the time-slice interval is the whole GPU's, and MIG \
                 instances do not have one; share them with mps, or write mig = \"disabled\""
                    .into(),
            )),
            RawSharing::TimeSlicing(ts) => {
                let interval = match &ts.interval {
                    None => TimeSliceInterval::Default,
                    Some(name) => TimeSliceInterval::from_name(name).ok_or_else(|| {
                        err(format!(
                            "time-slicing interval {name:?}: use default, short, medium or long"
                        ))
                    })?,
                };
                let replicas = in_range("time-slicing replicas", ts.replicas, 1, 256)?;
                Ok(Sharing::TimeSlicing { interval, replicas })
            }
            RawSharing::Mps(mps) => {
                let pinned_memory_limit_bytes = match &mps.pinned_memory_limit {
                    None => None,
                    Some(v) => Some(
                        parse_size(v).map_err(|m| err(format!("mps pinned_memory_limit: {m}")))?,
                    ),
                };
                Ok(Sharing::Mps(MpsSettings {
                    replicas: in_range("mps replicas", mps.replicas, 1, MPS_MAX_CLIENTS)?,
                    active_thread_percentage: in_range(
                        "mps active_thread_percentage",
                        mps.active_thread_percentage,
                        1,
                        100,
                    )?,
                    pinned_memory_limit_bytes,
                    max_clients: in_range("mps max_clients", mps.max_clients, 1, MPS_MAX_CLIENTS)?,
                }))
            }
        }
    }
}

/// The 1-based line and column of byte `offset` in `text` (clamped to the text, and to
/// the start of the character it falls in). For one offset; [`LineIndex`] for many.
pub fn line_column(text: &str, offset: usize) -> (usize, usize) {
    LineIndex::new(text).line_column(offset)
}

/// Where the lines of a text start: found once per text, so that locating every rule
/// costs a binary search each rather than a scan from the start (quadratic in rules).
pub(crate) struct LineIndex<'a> {
    text: &'a str,
    starts: Vec<usize>,
}

impl<'a> LineIndex<'a> {
    pub(crate) fn new(text: &'a str) -> Self {
        let starts =
            std::iter::once(0).chain(text.match_indices('\n').map(|(i, _)| i + 1)).collect();
        LineIndex { text, starts }
    }

    /// As [`line_column`].
    pub(crate) fn line_column(&self, offset: usize) -> (usize, usize) {
        let mut offset = offset.min(self.text.len());
        while !self.text.is_char_boundary(offset) {
            offset -= 1;
        }
        // `starts[0]` is 0, so at least one line starts at or before any offset.
        let line = self.starts.partition_point(|&start| start <= offset);
        let column = self.text[self.starts[line - 1]..offset].chars().count() + 1;
        (line, column)
    }
}

/// `more than 256 <what>, the most a list may hold`.
pub(crate) fn too_many(what: &str) -> String {
    format!("more than {MAX_LIST_ITEMS} {what}, the most a list may hold")
}

/// The refusal of a MIG layout of `total` instances in one `rule` (or entry).
pub(crate) fn too_many_instances(total: u64, rule: &str) -> String {
    format!(
        "{total} instances in one {rule}, more than any GPU holds ({MAX_MIG_INSTANCES} at most)"
    )
}

/// Parses a selector string: `all`, `first-half`, `second-half`, `2`, `0-3`, `0,2,5-7`, a
/// model key (`a100-40gb`) or a GPU UUID (`GPU-…`).
pub fn parse_selector(s: &str) -> Result<Selector, String> {
    let s = s.trim();
    match s {
        "all" => return Ok(Selector::All),
        "first-half" => return Ok(Selector::FirstHalf),
        "second-half" => return Ok(Selector::SecondHalf),
        _ => {}
    }
    if s.len() > 4 && s.get(..4).is_some_and(|p| p.eq_ignore_ascii_case("GPU-")) {
        return Ok(Selector::Uuid(s.to_string()));
    }
    if let Some(model) = catalog::model_by_key(s) {
        return Ok(Selector::Model(model.key));
    }
    if s.starts_with(|c: char| c.is_ascii_digit()) {
        if s.split(',').nth(MAX_LIST_ITEMS).is_some() {
            return Err(format!("select: {}", too_many("GPU indices")));
        }
        let mut ranges = Vec::new();
        for part in s.split(',') {
            let part = part.trim();
            let (lo, hi) = part.split_once('-').unwrap_or((part, part));
            match (lo.trim().parse::<u32>(), hi.trim().parse::<u32>()) {
                (Ok(lo), Ok(hi)) if lo <= hi => ranges.push((lo, hi)),
                _ => return Err(format!("select: bad index or range {part:?} in {s:?}")),
            }
        }
        return Ok(Selector::Indices(ranges));
    }
    let models: Vec<&str> = catalog::models().iter().map(|m| m.key).collect();
    Err(format!(
        "select: unknown selector {s:?}: use all, first-half, second-half, an index (2), a range (0-3), a list (0,2,5), a GPU UUID or a model ({})",
        models.join(", ")
    ))
}

/// Parses a PCI device id as mig-parted writes it (`0x20B010DE`).
pub fn parse_pci_device_id(text: &str) -> Result<u32, String> {
    let trimmed = text.trim();
    trimmed
        .strip_prefix("0x")
        .or_else(|| trimmed.strip_prefix("0X"))
        .ok_or(())
        .and_then(|hex| u32::from_str_radix(hex, 16).map_err(|_| ()))
        .map_err(|_| format!("{text:?} is not a PCI device id such as 0x20B010DE"))
}

/// Parses a MIG key: `3g` or an exact name like `3g.20gb` / `1g.5gb+me`.
pub fn parse_mig_key(key: &str) -> Result<MigKey, String> {
    let bad = || {
        format!(
            "mig: {key:?} is not a MIG profile: write a slice count (\"3g\") or a profile name (\"3g.20gb\", \"1g.5gb+me\")"
        )
    };
    let (slices, rest) = key.split_once('g').ok_or_else(bad)?;
    let slices: u8 = slices.parse().map_err(|_| bad())?;
    if !(1..=8).contains(&slices) {
        return Err(bad());
    }
    if rest.is_empty() {
        return Ok(MigKey::Slices(slices));
    }
    let size = rest.strip_prefix('.').ok_or_else(bad)?;
    let size = size.strip_suffix("+me").unwrap_or(size);
    let digits = size.strip_suffix("gb").ok_or_else(bad)?;
    if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit()) {
        return Err(bad());
    }
    Ok(MigKey::Name(key.to_string()))
}

/// Parses a byte size: an integer of bytes, or a string like `2GiB`, `512MiB`, `2G`, `512M`.
pub fn parse_size(value: &toml::Value) -> Result<u64, String> {
    match value {
        toml::Value::Integer(i) if *i > 0 => Ok(*i as u64),
        toml::Value::String(s) => gpushare_proto::parse_size(s),
        _ => Err("expected a size such as \"2GiB\" or \"512MiB\"".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::GpuRef;

    fn parse(text: &str) -> Result<Profile, ProfileError> {
        parse_profile(text, "test.toml", None)
    }

    fn err(text: &str) -> String {
        parse(text).unwrap_err().to_string()
    }

    #[test]
    fn parses_a_layered_profile() {
        let p = parse(
            r#"
name = "mixed"
description = "MIG on the first half, MPS on the 3g instances"

[[gpu]]
select = "first-half"
mig = { "1g" = 2, "2g.10gb" = 1, "3g" = 1 }
instance_sharing."3g" = { mps = { replicas = 4, pinned_memory_limit = "2GiB" } }

[[gpu]]
select = "4-5,7"
sharing = { time-slicing = { interval = "short", replicas = 3 } }

[[gpu]]
select = "all"
"#,
        )
        .unwrap();
        assert_eq!(p.name, "mixed");
        assert_eq!(p.rules.len(), 3);
        let r0 = &p.rules[0];
        assert_eq!(r0.select, Selector::FirstHalf);
        assert_eq!(
            r0.mig,
            MigLayout::Enabled(vec![
                (MigKey::Slices(1), 2),
                (MigKey::Name("2g.10gb".into()), 1),
                (MigKey::Slices(3), 1)
            ])
        );
        assert_eq!(
            r0.instance_sharing,
            vec![(
                MigKey::Slices(3),
                Sharing::Mps(MpsSettings {
                    replicas: Some(4),
                    pinned_memory_limit_bytes: Some(2 << 30),
                    ..Default::default()
                })
            )]
        );
        assert_eq!(r0.location.line, 5);
        assert_eq!(p.rules[1].select, Selector::Indices(vec![(4, 5), (7, 7)]));
        assert_eq!(
            p.rules[1].sharing,
            Sharing::TimeSlicing { interval: TimeSliceInterval::Short, replicas: Some(3) }
        );
        assert_eq!(p.rules[2].mig, MigLayout::Disabled);
        assert!(p.uses_sharing());
    }

    #[test]
    fn name_defaults_to_the_file_stem() {
        let p = parse_profile("[[gpu]]\nselect = 0\n", "x/whole.toml", Some("whole")).unwrap();
        assert_eq!(p.name, "whole");
        assert!(!p.uses_sharing());
    }

    #[test]
    fn a_nameless_profile_is_named_after_its_origin() {
        let text = "[[gpu]]\nselect = \"all\"\n";
        let name = |origin: &str| crate::profile::parse_document(text, origin, "").unwrap().name;
        assert_eq!(name("<stdin>"), "stdin");
        assert_eq!(name("/etc/gpushare/Lab Split (v2).toml"), "lab-split-v2");
        assert_eq!(name("./.hidden.toml"), "hidden");
        assert_eq!(name("x/_a.b-c_.toml"), "a.b-c");
        assert_eq!(name(&format!("{}.toml", "Ab".repeat(40))), "ab".repeat(32));
        assert_eq!(name(&format!("{}.toml", "a-".repeat(40))), "a-".repeat(31) + "a");
        // Nothing usable left: a fixed name.
        for origin in ["-", "<>", "/", ".", "ü€.toml", ""] {
            assert_eq!(name(origin), "unnamed", "{origin:?}");
        }
        // A name that is written must be valid as written.
        let e =
            crate::profile::parse_document(&format!("name = \"Lab Split\"\n{text}"), "<stdin>", "")
                .unwrap_err();
        assert!(
            e.to_string().starts_with("<stdin>:1:8: invalid profile name \"Lab Split\""),
            "{e}"
        );
    }

    #[test]
    fn syntax_errors_name_line_and_column() {
        let e = err("name = \"a\"\n[[gpu]\n");
        assert!(e.starts_with("test.toml:2:7: unclosed array table"), "{e}");
        let e = err("name = \"a\"\n[[gpu]]\nselect = \"all\"\nmigg = false\n");
        assert!(e.starts_with("test.toml:4:1: unknown field `migg`"), "{e}");
    }

    #[test]
    fn value_errors_point_at_the_value() {
        let e = err("name = \"a\"\n[[gpu]]\nselect = \"halfway\"\n");
        assert!(e.starts_with("test.toml:3:10: select: unknown selector \"halfway\""), "{e}");
        let e = err("name = \"a\"\n[[gpu]]\nselect = \"all\"\nmig = { \"5x\" = 1 }\n");
        assert!(e.starts_with("test.toml:4:7: mig: \"5x\" is not a MIG profile"), "{e}");
        let e = err("name = \"a\"\n[[gpu]]\nselect = 0\nmig = { \"1g\" = 9 }\n");
        assert!(e.contains("test.toml:4:7: mig: the count of 1g must be"), "{e}");
        let e = err(
            "name = \"a\"\n[[gpu]]\nselect = 0\nsharing = { mps = { active_thread_percentage = 0 } }\n",
        );
        assert!(
            e.contains("test.toml:4:11: mps active_thread_percentage must be from 1 to 100"),
            "{e}"
        );
        let e = err("name = \"a\"\n[[gpu]]\nselect = 0\nsharing = \"mpss\"\n");
        assert!(e.starts_with("test.toml:4:11: unknown variant `mpss`"), "{e}");
        let e = err(
            "name = \"a\"\n[[gpu]]\nselect = 0\nsharing.mps = { pinned_memory_limit = \"2 parsecs\" }\n",
        );
        assert!(e.contains("unknown size unit `parsecs`"), "{e}");
    }

    #[test]
    fn instance_sharing_must_name_an_instance_of_the_layout() {
        let e = err(
            "name = \"a\"\n[[gpu]]\nselect = 0\nmig = { \"1g\" = 7 }\ninstance_sharing.\"3g\" = \"exclusive\"\n",
        );
        assert!(e.contains(":5:") && e.contains("does not contain"), "{e}");
        let e = err("name = \"a\"\n[[gpu]]\nselect = 0\ninstance_sharing.\"3g\" = \"exclusive\"\n");
        assert!(e.contains("needs a MIG layout"), "{e}");
    }

    #[test]
    fn time_slicing_needs_mig_off() {
        let head = "name = \"a\"\n[[gpu]]\nselect = 0\n";
        let why = "time-slicing needs MIG off: the time-slice interval is the whole GPU's, and \
                   MIG instances do not have one; share them with mps, or write mig = \"disabled\"";
        let e = err(&format!(
            "{head}mig = {{ \"3g\" = 2 }}\nsharing = {{ time-slicing = {{ interval = \"long\" }} }}\n"
        ));
        assert_eq!(e, format!("test.toml:5:11: {why}"));
        let e = err(&format!("{head}mig = {{}}\nsharing.time-slicing = {{}}\n"));
        assert!(e.starts_with("test.toml:5:") && e.ends_with(why), "{e}");
        let e = err(&format!(
            "{head}mig = {{ \"1g\" = 2, \"3g\" = 1 }}\ninstance_sharing.\"3g\" = {{ time-slicing = {{}} }}\n"
        ));
        assert_eq!(e, format!("test.toml:5:25: {why}"));
        let e = err(&format!(
            "{head}mig = {{ \"1g\" = 2, \"3g\" = 1 }}\nsharing.time-slicing = {{}}\ninstance_sharing.\"3g\".mps = {{}}\n"
        ));
        assert!(e.starts_with("test.toml:5:") && e.ends_with(why), "{e}");
        // MIG off, whether written or left out: the whole GPU is time-sliced.
        for mig in ["mig = \"disabled\"\n", "mig = false\n", ""] {
            let p = parse(&format!("{head}{mig}sharing.time-slicing = {{}}\n")).unwrap();
            assert_eq!(p.rules[0].sharing.strategy(), "time-slicing");
        }
    }

    #[test]
    fn names_and_rules_are_required() {
        assert!(err("[[gpu]]\nselect = 0\n").contains("missing `name`"));
        assert!(err("name = \"a\"\n").contains("no [[gpu]] rule"));
        assert!(err("name = \"Bad Name\"\n[[gpu]]\nselect = 0\n").contains("invalid profile name"));
    }

    #[test]
    fn rules_instances_and_lists_are_bounded() {
        let rules = |n: usize| "[[gpu]]\nselect = 0\n".repeat(n);
        assert_eq!(parse(&format!("name = \"a\"\n{}", rules(256))).unwrap().rules.len(), 256);
        let e = err(&format!("name = \"a\"\n{}", rules(257)));
        assert_eq!(e, "test.toml:514:1: more than 256 [[gpu]] rules, the most a profile may have");

        let head = "name = \"a\"\n[[gpu]]\nselect = 0\n";
        assert!(parse(&format!("{head}mig = {{ \"1g\" = 7, \"1g.5gb+me\" = 1 }}\n")).is_ok());
        let e = err(&format!("{head}mig = {{ \"1g\" = 4, \"2g\" = 3, \"3g\" = 2 }}\n"));
        assert_eq!(
            e,
            "test.toml:4:7: mig: 9 instances in one rule, more than any GPU holds (8 at most)"
        );

        let list = |n: u32| (0..n).map(|i| i.to_string()).collect::<Vec<_>>();
        assert!(parse(&format!("{head}\n[[gpu]]\nselect = [{}]\n", list(256).join(", "))).is_ok());
        let e = err(&format!("{head}\n[[gpu]]\nselect = [{}]\n", list(257).join(", ")));
        assert_eq!(
            e,
            "test.toml:6:10: select: more than 256 GPU indices, the most a list may hold"
        );
        let e = err(&format!("{head}\n[[gpu]]\nselect = \"{}\"\n", list(257).join(",")));
        assert_eq!(
            e,
            "test.toml:6:10: select: more than 256 GPU indices, the most a list may hold"
        );
        let ids = |n: usize| vec!["\"0x20B010DE\""; n].join(", ");
        assert!(parse(&format!("{head}device_filter = [{}]\n", ids(256))).is_ok());
        let e = err(&format!("{head}device_filter = [{}]\n", ids(257)));
        assert_eq!(
            e,
            "test.toml:4:17: device_filter: more than 256 device ids, the most a list may hold"
        );
    }

    #[test]
    fn selectors() {
        assert_eq!(parse_selector("a30").unwrap(), Selector::Model("a30-24gb"));
        assert_eq!(parse_selector("GPU-abc").unwrap(), Selector::Uuid("GPU-abc".into()));
        assert_eq!(parse_selector("0-3").unwrap(), Selector::Indices(vec![(0, 3)]));
        assert!(parse_selector("3-1").is_err());
        let gpu = |index, count, uuid| GpuRef { index, count, uuid, pci_device_id: 0, model: None };
        let s = Selector::FirstHalf;
        assert!(s.matches(&gpu(3, 8, "")) && !s.matches(&gpu(4, 8, "")));
        assert!(!s.matches(&gpu(0, 1, "")));
        assert!(Selector::SecondHalf.matches(&gpu(0, 1, "")));
        assert!(Selector::Uuid("GPU-AB".into()).matches(&gpu(0, 1, "gpu-ab")));
        assert_eq!(parse_pci_device_id("0x20B010DE"), Ok(0x20B0_10DE));
        assert!(parse_pci_device_id("A100").is_err());
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(400))]

        /// Hostile input never panics: arbitrary bytes, and valid files (the built-in
        /// profiles, NVIDIA's mig-parted config, the shipped agent.toml) with bytes
        /// inserted at any place.
        #[test]
        fn parsing_never_panics(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300),
            cut in 0usize..20_000,
            junk in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..12),
        ) {
            let text = String::from_utf8_lossy(&bytes);
            let _ = parse_profile(&text, "fuzz.toml", Some("fuzz"));
            let _ = crate::profile::migparted::parse_mig_parted(&text, "fuzz.yaml", "x");
            let _ = crate::config::AgentConfig::parse(&text, "fuzz.toml");
            let _ = line_column(&text, cut);
            let valid_files = crate::profile::store::BUILT_IN
                .iter()
                .map(|(_, t)| *t)
                .chain([MIG_PARTED_DEFAULT, SHIPPED_AGENT_TOML]);
            for valid in valid_files {
                let at = cut % (valid.len() + 1);
                let mut mutated = valid.as_bytes()[..at].to_vec();
                mutated.extend_from_slice(&junk);
                mutated.extend_from_slice(&valid.as_bytes()[at..]);
                let mutated = String::from_utf8_lossy(&mutated);
                let _ = parse_profile(&mutated, "fuzz.toml", None);
                let _ = crate::config::AgentConfig::parse(&mutated, "fuzz.toml");
                let _ = crate::profile::migparted::parse_mig_parted(&mutated, "fuzz.yaml", "all-balanced");
            }
        }
    }

    const MIG_PARTED_DEFAULT: &str =
        include_str!("../../../tests/data/mig-parted-config-default.yaml");
    const SHIPPED_AGENT_TOML: &str = include_str!("../../../etc/gpushare/agent.toml");

    #[test]
    fn non_ascii_selectors_are_errors_not_panics() {
        let e = err("name = \"a\"\n[[gpu]]\nselect = \"ab€cd\"\n");
        assert!(e.contains("unknown selector"), "{e}");
        assert_eq!(line_column("a€b", 2), (1, 2));
    }

    #[test]
    fn sizes() {
        let s = |t: &str| parse_size(&toml::Value::String(t.into()));
        assert_eq!(s("2GiB"), Ok(2 << 30));
        assert_eq!(s("512M"), Ok(512 << 20));
        assert_eq!(parse_size(&toml::Value::Integer(4096)), Ok(4096));
        assert!(s("0G").is_err());
        assert!(s("G").is_err());
    }
}
