//! TOML → [`Profile`], with every error tied to a line and column.
//!
//! The `toml` crate reads the syntax into a tree of values that keep their place in the
//! text; everything else is checked here, key by key: which keys a table may have, what
//! each value must be, and the values whose meaning is ours (selectors, MIG layouts,
//! sharing, sizes, ranges). No type of ours is deserialized by serde, so no message is
//! serde's: each names the key as the profile writes it and what it wants instead.

use std::ops::Range;

use gpushare_proto::MPS_MAX_CLIENTS;
use toml::Spanned;
use toml::de::{DeTable, DeValue};

use super::{
    GpuRule, Location, MAX_LIST_ITEMS, MAX_MIG_INSTANCES, MAX_RULES, MigKey, MigLayout,
    MpsSettings, Profile, ProfileError, Selector, Sharing, check_size,
};
use crate::catalog;
use crate::node::TimeSliceInterval;

/// A value of the document and where it is.
type Value<'i> = Spanned<DeValue<'i>>;

/// The keys of the document, of a `[[gpu]]` rule and of the sharing settings.
const PROFILE_KEYS: &[&str] = &["name", "description", "gpu"];
const RULE_KEYS: &[&str] = &["select", "device_filter", "mig", "sharing", "instance_sharing"];
const TIME_SLICING_KEYS: &[&str] = &["interval", "replicas"];
const MPS_KEYS: &[&str] =
    &["replicas", "active_thread_percentage", "pinned_memory_limit", "max_clients", "multi_user"];

/// What `sharing` may be, for messages.
const SHARING_FORMS: &str = "\"exclusive\", \"mps\", \"time-slicing\", or one of them with \
                             settings: { mps = { replicas = 4 } }, { time-slicing = { interval = \"short\" } }";

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
    let root = DeTable::parse(text).map_err(|e| {
        let span = e.span().unwrap_or(0..0);
        // The parser's words are TOML's, but for its bound on nesting.
        let message = match e.message() {
            m if m.contains("recurs") => "nested too deeply".to_string(),
            m => m.split_whitespace().collect::<Vec<_>>().join(" "),
        };
        cx.error(&span, message)
    })?;
    let top = cx.keys(root.get_ref(), "the profile", PROFILE_KEYS)?;

    let (name, name_span) = match top.get("name") {
        Some(n) => (cx.string(n, "name")?.to_string(), n.span()),
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
    let description = match top.get("description") {
        Some(d) => cx.string(d, "description")?.to_string(),
        None => String::new(),
    };
    let rules: &[Value] = match top.get("gpu") {
        None => &[],
        Some(gpu) => match gpu.get_ref() {
            DeValue::Array(rules) => rules,
            other => {
                return Err(cx.error(
                    &gpu.span(),
                    format!(
                        "`gpu` holds the rules: write each as a [[gpu]] table, not {}",
                        kind(other)
                    ),
                ));
            }
        },
    };
    if rules.is_empty() {
        return Err(cx.error(&(0..0), "the profile has no [[gpu]] rule".into()));
    }
    if let Some(extra) = rules.get(MAX_RULES) {
        return Err(cx.error(
            &extra.span(),
            format!("more than {MAX_RULES} [[gpu]] rules, the most a profile may have"),
        ));
    }
    let rules = rules.iter().map(|r| cx.rule(r)).collect::<Result<Vec<_>, _>>()?;
    Ok(Profile { name, description, rules })
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

/// What a value is, in TOML's words: `an integer`, `a table`.
fn kind(value: &DeValue<'_>) -> &'static str {
    match value {
        DeValue::String(_) => "a string",
        DeValue::Integer(_) => "an integer",
        DeValue::Float(_) => "a float",
        DeValue::Boolean(_) => "a boolean",
        DeValue::Datetime(_) => "a date-time",
        DeValue::Array(_) => "an array",
        DeValue::Table(_) => "a table",
    }
}

/// A value as a message shows it: a scalar as written, else its kind.
fn shown(value: &DeValue<'_>) -> String {
    match value {
        DeValue::String(s) => format!("{s:?}"),
        DeValue::Integer(i) => i.to_string(),
        DeValue::Float(f) => f.to_string(),
        DeValue::Boolean(b) => b.to_string(),
        other => kind(other).to_string(),
    }
}

/// `` `a`, `b` or `c` `` (`and` for `conjunction` "and").
pub(crate) fn listed(names: &[&str], conjunction: &str) -> String {
    let quoted: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
    match quoted.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} {conjunction} {last}", rest.join(", ")),
        None => String::new(),
    }
}

/// An integer value as a `u32`, or `None` for any other value or an integer out of range.
fn as_u32(value: &DeValue<'_>) -> Option<u32> {
    match value {
        DeValue::Integer(i) => u32::from_str_radix(i.as_str(), i.radix()).ok(),
        _ => None,
    }
}

/// The keys of a table, every one of them checked to be known.
struct Keys<'t, 'i>(&'t DeTable<'i>);

impl<'t, 'i> Keys<'t, 'i> {
    fn get(&self, key: &str) -> Option<&'t Value<'i>> {
        self.0.iter().find(|(k, _)| k.get_ref() == key).map(|(_, v)| v)
    }
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

    /// `table`, refused at its first key that is not one of `known`; `place` names the
    /// table in the message (`a [[gpu]] rule`).
    fn keys<'t, 'i>(
        &self,
        table: &'t DeTable<'i>,
        place: &str,
        known: &[&str],
    ) -> Result<Keys<'t, 'i>, ProfileError> {
        match table.iter().find(|(k, _)| !known.contains(&k.get_ref().as_ref())) {
            Some((key, _)) => Err(self.error(
                &key.span(),
                format!(
                    "unknown key `{}` in {place}: use {}",
                    key.get_ref().escape_debug(),
                    listed(known, "or")
                ),
            )),
            None => Ok(Keys(table)),
        }
    }

    /// A table value of `what`, or an error naming it.
    fn table<'t, 'i>(
        &self,
        value: &'t Value<'i>,
        what: &str,
        example: &str,
    ) -> Result<&'t DeTable<'i>, ProfileError> {
        match value.get_ref() {
            DeValue::Table(table) => Ok(table),
            other => Err(self.error(
                &value.span(),
                format!("{what}: expected a table such as {example}, found {}", kind(other)),
            )),
        }
    }

    fn string<'t>(&self, value: &'t Value<'_>, what: &str) -> Result<&'t str, ProfileError> {
        match value.get_ref() {
            DeValue::String(s) => Ok(s),
            other => Err(self
                .error(&value.span(), format!("{what}: expected a string, found {}", kind(other)))),
        }
    }

    /// `true` or `false`.
    fn boolean(&self, value: &Value<'_>, what: &str) -> Result<bool, ProfileError> {
        match value.get_ref() {
            DeValue::Boolean(b) => Ok(*b),
            other => Err(self.error(
                &value.span(),
                format!("{what} must be true or false, not {}", shown(other)),
            )),
        }
    }

    /// A whole number within `lo..=hi`.
    fn whole(&self, value: &Value<'_>, what: &str, lo: u32, hi: u32) -> Result<u32, ProfileError> {
        as_u32(value.get_ref()).filter(|n| (lo..=hi).contains(n)).ok_or_else(|| {
            self.error(
                &value.span(),
                format!(
                    "{what} must be a whole number from {lo} to {hi}, not {}",
                    shown(value.get_ref())
                ),
            )
        })
    }

    fn rule(&self, value: &Value<'_>) -> Result<GpuRule, ProfileError> {
        let location = self.location(value.span().start);
        let DeValue::Table(table) = value.get_ref() else {
            return Err(self.error(
                &value.span(),
                format!("a [[gpu]] rule is a table, not {}", kind(value.get_ref())),
            ));
        };
        let raw = self.keys(table, "a [[gpu]] rule", RULE_KEYS)?;
        let select = raw.get("select").ok_or_else(|| {
            self.error(
                &value.span(),
                "a [[gpu]] rule needs `select`: the GPUs it applies to (\"all\", 2, \"0-3\", ...)"
                    .into(),
            )
        })?;
        let select = self.selector(select)?;
        let mig = match raw.get("mig") {
            None => MigLayout::Disabled,
            Some(m) => self.mig(m)?,
        };
        let sharing = match raw.get("sharing") {
            None => Sharing::Exclusive,
            Some(s) => self.sharing(s, &mig, "sharing")?,
        };

        let mut instance_sharing = Vec::new();
        if let Some(per_kind) = raw.get("instance_sharing") {
            let example = "{ \"3g\" = { mps = {} } }";
            for (key, value) in self.table(per_kind, "instance_sharing", example)? {
                let key = parse_mig_key(key.get_ref()).map_err(|m| self.error(&value.span(), m))?;
                let named = match &mig {
                    MigLayout::Enabled(instances) => instances.iter().any(|(k, _)| *k == key),
                    // Which sizes a balanced layout holds depends on the GPU: slice keys.
                    MigLayout::Balanced => matches!(key, MigKey::Slices(_)),
                    MigLayout::Disabled => {
                        return Err(self.error(
                            &value.span(),
                            "instance_sharing needs a MIG layout (`mig = { ... }` or `mig = \"balanced\"`) in the same rule"
                                .into(),
                        ));
                    }
                };
                if !named {
                    return Err(self.error(
                        &value.span(),
                        format!("instance_sharing names {key}, which the rule's `mig` layout does not contain"),
                    ));
                }
                let what = format!("instance_sharing.\"{key}\"");
                instance_sharing.push((key, self.sharing(value, &mig, &what)?));
            }
        }
        // Time-slicing is refused under MIG (see `sharing`), so MPS and time-slicing
        // cannot meet in one rule.
        let device_filter = match raw.get("device_filter") {
            None => Vec::new(),
            Some(v) => self.device_filter(v)?,
        };
        Ok(GpuRule { select, device_filter, location, mig, sharing, instance_sharing })
    }

    fn selector(&self, value: &Value<'_>) -> Result<Selector, ProfileError> {
        let err = |m: String| self.error(&value.span(), m);
        match value.get_ref() {
            DeValue::Integer(i) => {
                let i = as_u32(value.get_ref())
                    .ok_or_else(|| err(format!("select: bad GPU index {i}")))?;
                Ok(Selector::Indices(vec![(i, i)]))
            }
            DeValue::Array(items) => {
                if items.len() > MAX_LIST_ITEMS {
                    return Err(err(format!("select: {}", too_many("GPU indices"))));
                }
                let mut ranges = Vec::new();
                for item in items.iter() {
                    match as_u32(item.get_ref()) {
                        Some(i) => ranges.push((i, i)),
                        None => return Err(err("select: a list holds GPU indices only".into())),
                    }
                }
                if ranges.is_empty() {
                    return Err(err("select: the list is empty".into()));
                }
                Ok(Selector::Indices(ranges))
            }
            DeValue::String(s) => parse_selector(s).map_err(err),
            other => {
                Err(err(format!("select: expected a string or an index, found {}", kind(other))))
            }
        }
    }

    fn device_filter(&self, value: &Value<'_>) -> Result<Vec<u32>, ProfileError> {
        let items: Vec<&DeValue<'_>> = match value.get_ref() {
            DeValue::Array(items) => items.iter().map(Spanned::get_ref).collect(),
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
                let id = match item {
                    DeValue::String(s) => parse_pci_device_id(s).ok(),
                    _ => None,
                };
                id.ok_or_else(|| {
                    self.error(
                        &value.span(),
                        "device_filter: expected PCI device ids such as \"0x20B010DE\"".into(),
                    )
                })
            })
            .collect()
    }

    fn mig(&self, value: &Value<'_>) -> Result<MigLayout, ProfileError> {
        let err = |m: String| self.error(&value.span(), m);
        match value.get_ref() {
            DeValue::Boolean(false) => Ok(MigLayout::Disabled),
            DeValue::String(s) if s == "disabled" => Ok(MigLayout::Disabled),
            DeValue::String(s) if s == "balanced" => Ok(MigLayout::Balanced),
            DeValue::Table(table) => {
                let mut instances = Vec::new();
                for (key, count) in table {
                    let key = parse_mig_key(key.get_ref()).map_err(&err)?;
                    let count = as_u32(count.get_ref()).filter(|&c| c <= 8).ok_or_else(|| {
                        err(format!(
                            "mig: the count of {key} must be a whole number from 0 to 8, not {}",
                            shown(count.get_ref())
                        ))
                    })?;
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
                "mig: expected \"disabled\", \"balanced\" or a table of instance counts such as { \"1g\" = 2, \"3g.20gb\" = 1 }".into(),
            )),
        }
    }

    /// The sharing of a whole GPU or, under a MIG layout `mig`, of its instances: a
    /// strategy's name, or a table of one strategy and its settings. `what` names the key
    /// in messages (`sharing`, `instance_sharing."3g"`).
    fn sharing(
        &self,
        value: &Value<'_>,
        mig: &MigLayout,
        what: &str,
    ) -> Result<Sharing, ProfileError> {
        let err = |m: String| self.error(&value.span(), m);
        let (strategy, settings) = match value.get_ref() {
            DeValue::String(name) => (name.as_ref(), None),
            DeValue::Table(table) => {
                let named: Vec<&str> = table.iter().map(|(k, _)| k.get_ref().as_ref()).collect();
                match named.as_slice() {
                    [] => {
                        return Err(err(format!(
                            "{what} names no strategy: write {SHARING_FORMS}"
                        )));
                    }
                    [_] => {
                        let (name, settings) = table.iter().next().expect("one strategy");
                        (name.get_ref().as_ref(), Some(settings))
                    }
                    many if many.contains(&"mps") && many.contains(&"time-slicing") => {
                        return Err(err(
                            "MPS and time-slicing cannot be mixed on one GPU (MPS needs compute mode EXCLUSIVE_PROCESS, time-slicing DEFAULT)".into(),
                        ));
                    }
                    many => {
                        return Err(err(format!(
                            "{what} names {} strategies ({}): a GPU or instance has one",
                            many.len(),
                            listed(many, "and")
                        )));
                    }
                }
            }
            other => {
                return Err(err(format!(
                    "{what}: expected {SHARING_FORMS}; found {}",
                    kind(other)
                )));
            }
        };
        let settings_of = |keys: &[&str], example: &str| match settings {
            None => Ok(None),
            Some(s) => {
                let table = self.table(s, &format!("the {strategy} settings"), example)?;
                self.keys(table, &format!("the {strategy} settings"), keys).map(Some)
            }
        };
        match strategy {
            "exclusive" => match settings.map(Spanned::get_ref) {
                None => Ok(Sharing::Exclusive),
                Some(DeValue::Table(t)) if t.is_empty() => Ok(Sharing::Exclusive),
                Some(_) => {
                    Err(err(format!("exclusive has no settings: write {what} = \"exclusive\"")))
                }
            },
            // The driver's time-slice interval (nvidia-smi compute-policy) is per whole GPU;
            // under MIG it would be accepted and silently not apply.
            "time-slicing" if *mig != MigLayout::Disabled => Err(err(
                "time-slicing needs MIG off: the time-slice interval is the whole GPU's, and MIG \
                 instances do not have one; share them with mps, or write mig = \"disabled\""
                    .into(),
            )),
            "time-slicing" => {
                let settings = settings_of(TIME_SLICING_KEYS, "{ interval = \"short\" }")?;
                let get = |key| settings.as_ref().and_then(|s| s.get(key));
                let interval = match get("interval") {
                    None => TimeSliceInterval::Default,
                    Some(v) => match v.get_ref() {
                        DeValue::String(name) => TimeSliceInterval::from_name(name),
                        _ => None,
                    }
                    .ok_or_else(|| {
                        self.error(
                            &v.span(),
                            format!(
                                "time-slicing interval {}: use default, short, medium or long",
                                shown(v.get_ref())
                            ),
                        )
                    })?,
                };
                let replicas = get("replicas")
                    .map(|v| self.whole(v, "time-slicing replicas", 1, 256))
                    .transpose()?;
                Ok(Sharing::TimeSlicing { interval, replicas })
            }
            "mps" => {
                let settings = settings_of(MPS_KEYS, "{ replicas = 4 }")?;
                let get = |key| settings.as_ref().and_then(|s| s.get(key));
                let limit =
                    |key, what, hi| get(key).map(|v| self.whole(v, what, 1, hi)).transpose();
                let pinned_memory_limit_bytes = get("pinned_memory_limit")
                    .map(|v| {
                        parse_size(v.get_ref()).map_err(|m| {
                            self.error(&v.span(), format!("mps pinned_memory_limit: {m}"))
                        })
                    })
                    .transpose()?;
                Ok(Sharing::Mps(MpsSettings {
                    replicas: limit("replicas", "mps replicas", MPS_MAX_CLIENTS)?,
                    active_thread_percentage: limit(
                        "active_thread_percentage",
                        "mps active_thread_percentage",
                        100,
                    )?,
                    pinned_memory_limit_bytes,
                    max_clients: limit("max_clients", "mps max_clients", MPS_MAX_CLIENTS)?,
                    multi_user: get("multi_user")
                        .map(|v| self.boolean(v, "mps multi_user"))
                        .transpose()?
                        .unwrap_or(false),
                }))
            }
            other => Err(err(format!("{what}: unknown strategy {other:?}: write {SHARING_FORMS}"))),
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
        return Ok(Selector::Model(&model.key));
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
    let models: Vec<&str> = catalog::models().iter().map(|m| m.key.as_str()).collect();
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

/// The compute part of a key (`1c.` of `1c.3g` and mig-parted's `1c.3g.40gb`): its
/// slices, from 1 to 8, and the rest.
pub(crate) fn split_compute(key: &str) -> Option<(u8, &str)> {
    let (compute, rest) = key.split_once("c.")?;
    if compute.is_empty() || !compute.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let compute: u8 = compute.parse().ok().filter(|c| (1..=8).contains(c))?;
    Some((compute, rest))
}

/// Parses a MIG key: `3g` or an exact name like `3g.20gb` / `1g.5gb+me`, or compute
/// instances inside such GPU instances, `1c.3g` / `1c.3g.40gb` (`3c.3g` is `3g`).
pub fn parse_mig_key(key: &str) -> Result<MigKey, String> {
    let bad = || {
        format!(
            "mig: {key:?} is not a MIG profile: write a slice count (\"3g\"), a profile name (\"3g.20gb\", \"1g.5gb+me\") or compute instances in one (\"1c.3g\", \"1c.3g.40gb\")"
        )
    };
    if key.contains("c.") {
        let (compute, rest) = split_compute(key).ok_or_else(bad)?;
        let instance = parse_instance_key(rest).map_err(|_| bad())?;
        return Ok(MigKey::compute(compute, instance));
    }
    parse_instance_key(key).map_err(|_| bad())
}

/// A GPU instance's key: `3g` or an exact name.
fn parse_instance_key(key: &str) -> Result<MigKey, ()> {
    if !key.starts_with(|c: char| c.is_ascii_digit()) {
        return Err(());
    }
    let (slices, rest) = key.split_once('g').ok_or(())?;
    let slices: u8 = slices.parse().map_err(|_| ())?;
    if !(1..=8).contains(&slices) {
        return Err(());
    }
    if rest.is_empty() {
        return Ok(MigKey::Slices(slices));
    }
    let size = rest.strip_prefix('.').ok_or(())?;
    // The variants drivers print: media extensions (`+me`, all of them `+me.all`, none
    // `-me`) and graphics (`+gfx`, RTX PRO Blackwell).
    let size = ["+me.all", "+me", "-me", "+gfx"]
        .iter()
        .find_map(|variant| size.strip_suffix(variant))
        .unwrap_or(size);
    let digits = size.strip_suffix("gb").ok_or(())?;
    if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit()) {
        return Err(());
    }
    Ok(MigKey::Name(key.to_string()))
}

/// Parses a byte size: an integer of bytes, or a string like `2GiB`, `512MiB`, `2G`, `512M`.
pub fn parse_size(value: &DeValue<'_>) -> Result<u64, String> {
    match value {
        DeValue::Integer(i) => {
            u64::from_str_radix(i.as_str(), i.radix()).ok().filter(|&n| n > 0).ok_or_else(|| {
                format!("{i} is not a size: give bytes above zero, or \"2GiB\", \"512MiB\"")
            })
        }
        DeValue::String(s) => gpushare_proto::parse_size(s),
        other => {
            Err(format!("expected a size such as \"2GiB\" or \"512MiB\", not {}", kind(other)))
        }
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
    fn mig_names_take_every_variant_drivers_print() {
        for name in ["1g.24gb+gfx", "1g.24gb-me", "1g.24gb+me.all", "1g.18gb+me", "3g.40gb"] {
            assert_eq!(parse_mig_key(name), Ok(MigKey::Name(name.to_string())), "{name}");
        }
        for bad in ["1g.24gb+foo", "1g.24gb+", "1g+gfx", "1g.gb+me"] {
            assert!(parse_mig_key(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn compute_instance_keys_read_as_subdivisions() {
        let sub = |c, instance| MigKey::Compute { compute: c, instance: Box::new(instance) };
        assert_eq!(parse_mig_key("1c.3g"), Ok(sub(1, MigKey::Slices(3))));
        assert_eq!(parse_mig_key("1c.3g.40gb"), Ok(sub(1, MigKey::Name("3g.40gb".into()))));
        assert_eq!(parse_mig_key("2c.4g.20gb+me"), Ok(sub(2, MigKey::Name("4g.20gb+me".into()))));
        // All of the instance's slices: the instance itself.
        assert_eq!(parse_mig_key("3c.3g"), Ok(MigKey::Slices(3)));
        assert_eq!(parse_mig_key("7c.7g.80gb"), Ok(MigKey::Name("7g.80gb".into())));
        assert_eq!(parse_mig_key("1c.3g").unwrap().to_string(), "1c.3g");
        for bad in ["1c.", "c.3g", "0c.3g", "9c.3g", "+1c.3g", "1c.1c.3g", "1c3g", "1c.3x"] {
            let e = parse_mig_key(bad).unwrap_err();
            assert!(e.contains("compute instances in one (\"1c.3g\""), "{bad}: {e}");
        }
        let p = parse(
            "name = \"c\"\n[[gpu]]\nselect = 0\nmig = { \"1c.3g\" = 3, \"3g\" = 1 }\n\
             instance_sharing.\"1c.3g\" = { mps = { replicas = 2 } }\n",
        )
        .unwrap();
        let rule = &p.rules[0];
        assert_eq!(
            rule.mig,
            MigLayout::Enabled(vec![(sub(1, MigKey::Slices(3)), 3), (MigKey::Slices(3), 1)])
        );
        let model = crate::catalog::simulated_model_by_key("h100-80gb").unwrap();
        let p3g = model.profile_by_name("3g.40gb").unwrap();
        // Each compute instance of the subdivision has MPS; the whole 3g not.
        assert_eq!(rule.sharing_for(p3g, Some(1)).strategy(), "mps");
        assert_eq!(rule.sharing_for(p3g, None).strategy(), "exclusive");
        // A subdivision is no part of a balanced layout.
        let e = err(
            "name = \"c\"\n[[gpu]]\nselect = 0\nmig = \"balanced\"\ninstance_sharing.\"1c.3g\" = \"mps\"\n",
        );
        assert!(e.contains("instance_sharing names 1c.3g, which the rule's `mig` layout"), "{e}");
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
        assert_eq!(
            e,
            "test.toml:4:1: unknown key `migg` in a [[gpu]] rule: use `select`, `device_filter`, \
             `mig`, `sharing` or `instance_sharing`"
        );
    }

    #[test]
    fn mps_multi_user_is_a_boolean_and_defaults_to_one_user_at_a_time() {
        let settings = |text: &str| match &parse(text).unwrap().rules[0].sharing {
            Sharing::Mps(s) => s.clone(),
            other => panic!("{other:?}"),
        };
        let head = "name = \"a\"\n[[gpu]]\nselect = 0\n";
        assert!(
            settings(&format!("{head}sharing = {{ mps = {{ multi_user = true }} }}\n")).multi_user
        );
        assert!(!settings(&format!("{head}sharing = {{ mps = {{ replicas = 4 }} }}\n")).multi_user);
        assert!(!settings(&format!("{head}sharing = \"mps\"\n")).multi_user);
        let e = err(&format!("{head}sharing = {{ mps = {{ multi_user = 1 }} }}\n"));
        assert_eq!(e, "test.toml:4:34: mps multi_user must be true or false, not 1");
        let e = err(&format!("{head}sharing = {{ mps = {{ multiuser = true }} }}\n"));
        assert!(
            e.starts_with("test.toml:4:21: unknown key `multiuser` in the mps settings"),
            "{e}"
        );
        assert!(e.contains("`multi_user`"), "{e}");
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
        assert_eq!(
            e,
            "test.toml:4:48: mps active_thread_percentage must be a whole number from 1 to 100, not 0"
        );
        let e = err("name = \"a\"\n[[gpu]]\nselect = 0\nsharing = \"mpss\"\n");
        assert!(e.starts_with("test.toml:4:11: sharing: unknown strategy \"mpss\": write "), "{e}");
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
        let size = |toml: &str| parse_size(DeValue::parse(toml).unwrap().get_ref());
        assert_eq!(size("\"2GiB\""), Ok(2 << 30));
        assert_eq!(size("\"512M\""), Ok(512 << 20));
        assert_eq!(size("4096"), Ok(4096));
        assert_eq!(size("0x1000"), Ok(4096));
        for bad in ["\"0G\"", "\"G\"", "0", "-5", "99999999999999999999", "1.5", "[]"] {
            assert!(size(bad).is_err(), "{bad}");
        }
    }
}
