//! NVIDIA mig-parted configuration files (`config.yaml`) as gpushare [`Profile`]s.
//!
//! A mig-parted file holds `version: v1` and a map `mig-configs` of named configs; each
//! config is a list of entries with the keys `devices` (`all` or a list of GPU indices),
//! `mig-enabled`, `mig-devices` (MIG profile name → count) and `device-filter` (one PCI
//! device id such as `"0x20B010DE"` or a list of them). One named config becomes one
//! profile with one [`GpuRule`] per entry, in file order, and no sharing.
//!
//! The whole file is checked, as mig-parted does, before any config is taken from it: a
//! malformed entry in one config makes every config of the file unusable. Errors name
//! `origin:line:column`. MIG profile names are only checked for their shape (`<n>g.…`);
//! whether a model has them is the planner's question. A compute instance's name
//! (`1c.3g.40gb`) becomes a [`MigKey::Compute`]; the planner packs compute instances into
//! GPU instances as mig-parted does (`plan/packing.rs`). The YAML library reads the file
//! into plain nodes (any YAML is read); what each key must hold is checked here, so that
//! messages speak of the file's keys, not of the types the library was asked for.
//!
//! Semantics that differ from mig-parted: mig-parted applies *every* entry that matches a
//! GPU, in file order (so the last one wins where two disagree, after carrying out the
//! earlier ones); a gpushare profile gives each GPU the *first* rule that selects it.
//! mig-parted also skips GPUs without MIG under `devices: all` entries, where the planner
//! refuses a MIG layout on such a GPU. Subsystem-qualified device ids
//! (`0x20B010DE:0x147E10DE`, newer mig-parted) are refused: a rule filters on the device id
//! alone. Slightly more is accepted than mig-parted accepts: unquoted device ids
//! (`device-filter: 0x20B010DE`, which YAML reads as a number) and quoted counts (`"2"`).
//! Slightly less, too: `mig-enabled` takes the YAML 1.2 booleans `true` and `false` only,
//! not text (`"true"`, `"yes"`) nor YAML 1.1's `yes`, `no`, `on` and `off`. A file is one
//! YAML document. As in mig-parted, `devices: []` is accepted and selects no GPU,
//! `mig-devices: {}` with `mig-enabled: false` is accepted, and duplicate keys are errors.

use std::fmt;

use serde::Deserialize;
use serde::de::{Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::budget::BudgetBreach;
use serde_saphyr::{MessageFormatter, Spanned, UserMessageFormatter};

use super::parse::{listed, parse_pci_device_id, split_compute, too_many, too_many_instances};
use super::{
    GpuRule, Location, MAX_LIST_ITEMS, MAX_MIG_INSTANCES, MAX_MIG_PARTED_CONFIGS, MAX_RULES,
    MigKey, MigLayout, Profile, ProfileError, Selector, Sharing, check_size,
};

/// Most instances of one MIG profile an entry may ask for (as in TOML profiles).
const MAX_COUNT: i128 = 8;

/// The keys of the file and of an entry.
const FILE_KEYS: &[&str] = &["version", "mig-configs"];
const ENTRY_KEYS: &[&str] = &["devices", "mig-enabled", "mig-devices", "device-filter"];

/// The names of the file's `mig-configs`, in file order. The whole file is checked first:
/// any error in it is returned, as [`parse_mig_parted`] would return it.
pub fn config_names(text: &str, origin: &str) -> Result<Vec<String>, ProfileError> {
    let file = load(text, origin)?;
    Ok(file.configs.into_iter().map(|c| c.name).collect())
}

/// The mig-parted config `config` of the file `text` as a profile named `config`. `origin`
/// names the text in errors and in the profile's description (a path, usually). The whole
/// file is checked first; an unknown `config` is an error that lists the file's configs.
pub fn parse_mig_parted(text: &str, origin: &str, config: &str) -> Result<Profile, ProfileError> {
    let file = load(text, origin)?;
    let names: Vec<&str> = file.configs.iter().map(|c| c.name.as_str()).collect();
    // A file of one config (what `gpushare-ctl export --format mig-parted` writes) needs
    // no -c to say which.
    let only = (config.is_empty() && file.configs.len() == 1).then(|| &file.configs[0]);
    let Some(found) = only.or_else(|| file.configs.iter().find(|c| c.name == config)) else {
        let message = if config.is_empty() {
            format!(
                "a mig-parted file holds {}: choose one with -c NAME ({})",
                gpushare_proto::plural(names.len() as u64, "config"),
                some_of(&names)
            )
        } else {
            let guess = super::closest(config, &names).map(|n| format!(" (did you mean {n}?)"));
            format!(
                "no mig-parted config {config:?}{}; the file has {}",
                guess.unwrap_or_default(),
                some_of(&names)
            )
        };
        return Err(ProfileError { location: file.configs_location, message });
    };
    // mig-parted carries out every entry that matches a GPU, in file order, so the last
    // one wins; gpushare gives a GPU the first rule that selects it: reverse the entries.
    let mut rules = found.rules.clone();
    rules.reverse();
    let config = &found.name;
    Ok(Profile {
        name: config.clone(),
        description: format!("mig-parted config {config} from {origin}"),
        rules,
    })
}

/// Names to show in a one-line message: all of a short list, else the first ones and how
/// many more there are.
fn some_of(names: &[&str]) -> String {
    const SHOWN: usize = 8;
    if names.len() <= SHOWN {
        return names.join(", ");
    }
    format!("{}, … and {} more", names[..SHOWN].join(", "), names.len() - SHOWN)
}

/// A checked file: every config converted.
struct File {
    /// Where `mig-configs` is, for errors about configs the file lacks.
    configs_location: Location,
    configs: Vec<Config>,
}

struct Config {
    name: String,
    rules: Vec<GpuRule>,
}

/// A YAML node as the file has it.
enum Node {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Text(String),
    List(Vec<Spanned<Node>>),
    /// A mapping's keys and values, in file order.
    Keys(Vec<(Spanned<Node>, Spanned<Node>)>),
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct NodeVisitor;

        impl<'de> Visitor<'de> for NodeVisitor {
            type Value = Node;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any YAML value")
            }

            fn visit_bool<E>(self, v: bool) -> Result<Node, E> {
                Ok(Node::Bool(v))
            }

            fn visit_i64<E>(self, v: i64) -> Result<Node, E> {
                Ok(Node::Int(v.into()))
            }

            fn visit_u64<E>(self, v: u64) -> Result<Node, E> {
                Ok(Node::Int(v.into()))
            }

            fn visit_i128<E>(self, v: i128) -> Result<Node, E> {
                Ok(Node::Int(v))
            }

            fn visit_u128<E>(self, v: u128) -> Result<Node, E> {
                Ok(i128::try_from(v).map_or(Node::Float(v as f64), Node::Int))
            }

            fn visit_f64<E>(self, v: f64) -> Result<Node, E> {
                Ok(Node::Float(v))
            }

            fn visit_str<E>(self, v: &str) -> Result<Node, E> {
                Ok(Node::Text(v.to_owned()))
            }

            fn visit_bytes<E>(self, v: &[u8]) -> Result<Node, E> {
                Ok(Node::Text(String::from_utf8_lossy(v).into_owned()))
            }

            fn visit_unit<E>(self) -> Result<Node, E> {
                Ok(Node::Null)
            }

            fn visit_none<E>(self) -> Result<Node, E> {
                Ok(Node::Null)
            }

            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
                Node::deserialize(d)
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                Ok(Node::List(items))
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry()? {
                    entries.push(entry);
                }
                Ok(Node::Keys(entries))
            }
        }

        deserializer.deserialize_any(NodeVisitor)
    }
}

/// Most levels of nesting a file may have: mig-parted's own need 5 (`mig-configs`, a
/// config, an entry, `mig-devices`). Reading any YAML into nodes recurses once a level.
const MAX_DEPTH: usize = 10;

/// YAML as the file is read: one document, YAML 1.2 booleans only (`yes` and `on` stay
/// text), nesting bounded by [`MAX_DEPTH`], the library's bounds on aliases and size.
fn yaml_options() -> serde_saphyr::Options {
    let mut options = serde_saphyr::Options::default();
    options.strict_booleans = true;
    options.budget.get_or_insert_with(Default::default).max_depth = MAX_DEPTH;
    options
}

/// A YAML error in the file's words. Syntax errors keep the YAML parser's wording, which
/// is about YAML itself; what the library says in terms of its own API is said here.
fn yaml_message(error: &serde_saphyr::Error) -> String {
    use serde_saphyr::Error as E;
    let message = match error.without_snippet() {
        E::MultipleDocuments { .. } => {
            "a second YAML document starts here: a mig-parted file is one document".to_string()
        }
        E::Budget { breach: BudgetBreach::Depth { .. }, .. } => {
            "nested too deeply for a mig-parted file".to_string()
        }
        E::Budget { .. } => "too many nodes, aliases or anchors for a mig-parted file".to_string(),
        E::DuplicateMappingKey { key: Some(key), .. } => format!("duplicate key `{key}`"),
        E::DuplicateMappingKey { key: None, .. } => "duplicate key".to_string(),
        // The parser's bound on flow nesting (`[[[[…`).
        other => match UserMessageFormatter.format_message(other) {
            m if m.contains("recursion") => "nested too deeply for a mig-parted file".to_string(),
            m => m.into_owned(),
        },
    };
    message.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Parses and checks the whole file.
fn load(text: &str, origin: &str) -> Result<File, ProfileError> {
    check_size(text, origin)?;
    let cx = Context { origin, text };
    let root: Spanned<Node> =
        serde_saphyr::from_str_with_options(text, yaml_options()).map_err(|e| {
            let location = e.location().map_or_else(|| cx.start(), |l| cx.location(&l));
            ProfileError { location, message: yaml_message(&e) }
        })?;
    let top = cx.keys(&root, "the file", "`version: v1` and `mig-configs:`", FILE_KEYS)?;

    let Some(version) = top.get("version") else {
        return Err(cx.error_at(
            cx.start(),
            "missing `version` (mig-parted files start with `version: v1`)",
        ));
    };
    if !matches!(&version.value, Node::Text(v) if v == "v1") {
        let message = match cx.scalar(version) {
            Some(v) => format!("unsupported version {v:?}: only v1 is known"),
            None => format!("version: expected v1, found {}", cx.shown(version)),
        };
        return Err(cx.error(&version.referenced, message));
    }
    let Some(configs) = top.get("mig-configs") else {
        return Err(cx.error_at(cx.start(), "missing `mig-configs`"));
    };
    let Node::Keys(named) = &configs.value else {
        return Err(cx.error(
            &configs.referenced,
            format!(
                "`mig-configs` holds named configs (`all-balanced:` and its entries), not {}",
                cx.shown(configs)
            ),
        ));
    };
    if named.is_empty() {
        return Err(cx.error(&configs.referenced, "`mig-configs` holds no config"));
    }
    if let Some((name, _)) = named.get(MAX_MIG_PARTED_CONFIGS) {
        return Err(cx.error(
            &name.referenced,
            format!(
                "more than {MAX_MIG_PARTED_CONFIGS} configs in `mig-configs`, the most a file may hold"
            ),
        ));
    }
    let configs_location = cx.location(&configs.referenced);
    let configs = named
        .iter()
        .map(|(name, entries)| {
            let name_text = cx.name(name, "a config name")?;
            let Node::List(entries) = &entries.value else {
                return Err(cx.error(
                    &entries.referenced,
                    format!(
                        "config {name_text:?}: expected a list of entries (`- devices: all`), found {}",
                        cx.shown(entries)
                    ),
                ));
            };
            if entries.is_empty() {
                return Err(
                    cx.error(&name.referenced, format!("config {name_text:?} has no entries"))
                );
            }
            if let Some(extra) = entries.get(MAX_RULES) {
                return Err(cx.error(
                    &extra.referenced,
                    format!(
                        "config {name_text:?}: more than {MAX_RULES} entries, the most a config may hold"
                    ),
                ));
            }
            let rules = entries.iter().map(|e| cx.rule(e)).collect::<Result<Vec<_>, _>>()?;
            Ok(Config { name: name_text, rules })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(File { configs_location, configs })
}

/// The values of a mapping's keys, every key checked to be known. A key given no value
/// (`device-filter:`) counts as left out.
struct Fields<'n>(Vec<(&'n str, &'n Spanned<Node>)>);

impl<'n> Fields<'n> {
    fn get(&self, key: &str) -> Option<&'n Spanned<Node>> {
        self.0.iter().find(|(k, v)| *k == key && !matches!(v.value, Node::Null)).map(|(_, v)| *v)
    }
}

struct Context<'a> {
    origin: &'a str,
    text: &'a str,
}

impl Context<'_> {
    fn location(&self, at: &serde_saphyr::Location) -> Location {
        let n = |v: u64| usize::try_from(v).unwrap_or(usize::MAX).max(1);
        Location { origin: self.origin.to_string(), line: n(at.line()), column: n(at.column()) }
    }

    fn start(&self) -> Location {
        Location { origin: self.origin.to_string(), line: 1, column: 1 }
    }

    fn error(&self, at: &serde_saphyr::Location, message: impl Into<String>) -> ProfileError {
        self.error_at(self.location(at), message)
    }

    fn error_at(&self, location: Location, message: impl Into<String>) -> ProfileError {
        ProfileError { location, message: message.into() }
    }

    /// A scalar as the file writes it (`0x20B010DE`, not the number YAML reads).
    fn source<'n>(&'n self, node: &'n Spanned<Node>) -> Option<&'n str> {
        let span = node.defined.span();
        let start = usize::try_from(span.byte_offset()?).ok()?;
        let len = usize::try_from(span.byte_len()?).ok()?;
        self.text.get(start..start.checked_add(len)?).map(str::trim).filter(|s| !s.is_empty())
    }

    /// A scalar's text: text as it is, numbers and booleans as written; `None` for the rest.
    fn scalar(&self, node: &Spanned<Node>) -> Option<String> {
        match &node.value {
            Node::Text(s) => Some(s.clone()),
            Node::Int(_) | Node::Float(_) | Node::Bool(_) => {
                Some(self.source(node).map_or_else(|| self.shown(node), str::to_string))
            }
            Node::Null | Node::List(_) | Node::Keys(_) => None,
        }
    }

    /// A node as a message shows it: a scalar as written, else what it is.
    fn shown(&self, node: &Spanned<Node>) -> String {
        match &node.value {
            Node::Null => "nothing".into(),
            Node::Bool(b) => b.to_string(),
            Node::Int(i) => self.source(node).map_or_else(|| i.to_string(), str::to_string),
            Node::Float(f) => self.source(node).map_or_else(|| f.to_string(), str::to_string),
            Node::Text(s) => format!("{s:?}"),
            Node::List(_) => "a list".into(),
            Node::Keys(_) => "a mapping".into(),
        }
    }

    /// A scalar quoted as text (`"v2"`), else what it is.
    fn quoted(&self, node: &Spanned<Node>) -> String {
        self.scalar(node).map_or_else(|| self.shown(node), |s| format!("{s:?}"))
    }

    /// A mapping key naming something (`what`): a scalar, as text.
    fn name(&self, key: &Spanned<Node>, what: &str) -> Result<String, ProfileError> {
        self.scalar(key).ok_or_else(|| {
            self.error(&key.referenced, format!("{what} is text, not {}", self.shown(key)))
        })
    }

    /// The fields of a mapping (`place`, shaped like `example`), every key one of `known`.
    fn keys<'n>(
        &self,
        node: &'n Spanned<Node>,
        place: &str,
        example: &str,
        known: &[&str],
    ) -> Result<Fields<'n>, ProfileError> {
        let entries: &[(Spanned<Node>, Spanned<Node>)] = match &node.value {
            Node::Keys(entries) => entries,
            Node::Null => &[],
            _ => {
                return Err(self.error(
                    &node.referenced,
                    format!("{place} holds keys such as {example}, not {}", self.shown(node)),
                ));
            }
        };
        let mut fields = Vec::new();
        for (key, value) in entries {
            let name = match &key.value {
                Node::Text(name) if known.contains(&name.as_str()) => name.as_str(),
                _ => {
                    return Err(self.error(
                        &key.referenced,
                        format!(
                            "unknown key {} in {place}: use {}",
                            self.quoted(key),
                            listed(known, "or")
                        ),
                    ));
                }
            };
            fields.push((name, value));
        }
        Ok(Fields(fields))
    }

    fn rule(&self, entry: &Spanned<Node>) -> Result<GpuRule, ProfileError> {
        let at = &entry.referenced;
        let raw = self.keys(entry, "an entry", "`devices: all`", ENTRY_KEYS)?;
        let devices = raw.get("devices").ok_or_else(|| {
            self.error(at, "missing `devices`: write `devices: all` or a list of GPU indices")
        })?;
        let select = self.selector(devices)?;
        let enabled = raw.get("mig-enabled").ok_or_else(|| {
            self.error(at, "missing `mig-enabled`: write `mig-enabled: true` or `false`")
        })?;
        let Node::Bool(enabled_value) = enabled.value else {
            return Err(self.error(
                &enabled.referenced,
                format!("mig-enabled: expected true or false, found {}", self.shown(enabled)),
            ));
        };
        let mig = match (enabled_value, raw.get("mig-devices")) {
            (false, Some(devices)) if !matches!(&devices.value, Node::Keys(k) if k.is_empty()) => {
                return Err(self.error(
                    &devices.referenced,
                    "mig-devices given with `mig-enabled: false`: remove them or enable MIG",
                ));
            }
            (false, _) => MigLayout::Disabled,
            (true, None) => {
                return Err(self.error(
                    &enabled.referenced,
                    "`mig-enabled: true` needs `mig-devices` (`mig-devices: {}` for MIG on without instances)",
                ));
            }
            (true, Some(devices)) => self.layout(devices)?,
        };
        let device_filter = match raw.get("device-filter") {
            None => Vec::new(),
            Some(filter) => self.device_filter(filter)?,
        };
        Ok(GpuRule {
            select,
            device_filter,
            location: self.location(at),
            mig,
            sharing: Sharing::Exclusive,
            instance_sharing: Vec::new(),
        })
    }

    fn selector(&self, devices: &Spanned<Node>) -> Result<Selector, ProfileError> {
        match &devices.value {
            Node::Text(all) if all == "all" => Ok(Selector::All),
            Node::List(items) if items.len() > MAX_LIST_ITEMS => {
                Err(self
                    .error(&devices.referenced, format!("devices: {}", too_many("GPU indices"))))
            }
            Node::List(items) => items
                .iter()
                .map(|item| {
                    match item.value {
                        Node::Int(i) => u32::try_from(i).ok().map(|i| (i, i)),
                        _ => None,
                    }
                    .ok_or_else(|| {
                        self.error(
                            &item.referenced,
                            format!("devices: bad GPU index {}", self.shown(item)),
                        )
                    })
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Selector::Indices),
            _ => Err(self.error(
                &devices.referenced,
                format!(
                    "devices: expected `all` or a list of GPU indices, found {}",
                    self.shown(devices)
                ),
            )),
        }
    }

    fn layout(&self, devices: &Spanned<Node>) -> Result<MigLayout, ProfileError> {
        let Node::Keys(counts) = &devices.value else {
            return Err(self.error(
                &devices.referenced,
                format!(
                    "mig-devices: expected MIG profile names and counts such as {{\"1g.5gb\": 2}}, found {}",
                    self.shown(devices)
                ),
            ));
        };
        let mut instances = Vec::new();
        for (name, count) in counts {
            let name = match self.scalar(name) {
                Some(text) if is_mig_name(&text) => text,
                _ => {
                    return Err(self.error(
                        &name.referenced,
                        format!(
                            "mig-devices: {} is not a MIG profile name such as \"1g.5gb\" or \"3g.20gb\"",
                            self.quoted(name)
                        ),
                    ));
                }
            };
            // Quoted counts ("2") are taken too.
            let value = match &count.value {
                Node::Int(n) => Some(*n),
                Node::Text(t) => t.trim().parse::<i128>().ok(),
                _ => None,
            };
            let Some(value) = value.filter(|n| (0..=MAX_COUNT).contains(n)) else {
                return Err(self.error(
                    &count.referenced,
                    format!(
                        "mig-devices: the count of {} must be a whole number from 0 to {MAX_COUNT}, not {}",
                        name.escape_debug(),
                        self.shown(count)
                    ),
                ));
            };
            if value > 0 {
                let value = u32::try_from(value).unwrap_or(u32::MAX);
                // `1c.3g.40gb`: compute instances of 1 slice in 3g.40gb instances.
                let key = match split_compute(&name) {
                    Some((compute, instance)) => {
                        MigKey::compute(compute, MigKey::Name(instance.to_string()))
                    }
                    None => MigKey::Name(name),
                };
                instances.push((key, value));
            }
        }
        let total: u64 = instances.iter().map(|(_, c)| u64::from(*c)).sum();
        if total > MAX_MIG_INSTANCES {
            return Err(self.error(
                &devices.referenced,
                format!("mig-devices: {}", too_many_instances(total, "entry")),
            ));
        }
        Ok(MigLayout::Enabled(instances))
    }

    fn device_filter(&self, filter: &Spanned<Node>) -> Result<Vec<u32>, ProfileError> {
        let parse = |item: &Spanned<Node>| {
            let Some(text) = self.scalar(item) else {
                return Err(self.error(
                    &item.referenced,
                    format!(
                        "device-filter: expected a PCI device id such as \"0x20B010DE\" or a list of them, found {}",
                        self.shown(item)
                    ),
                ));
            };
            if text.contains(':') {
                return Err(self.error(
                    &item.referenced,
                    format!(
                        "device-filter: {text:?}: subsystem-qualified ids are not supported; \
                         give the device id alone (\"0x20B010DE\")"
                    ),
                ));
            }
            parse_pci_device_id(&text)
                .map_err(|m| self.error(&item.referenced, format!("device-filter: {m}")))
        };
        match &filter.value {
            Node::List(items) if items.len() > MAX_LIST_ITEMS => Err(self
                .error(&filter.referenced, format!("device-filter: {}", too_many("device ids")))),
            Node::List(items) => items.iter().map(parse).collect(),
            _ => parse(filter).map(|id| vec![id]),
        }
    }
}

/// Whether `name` looks like a MIG profile name: `<n>g.` and more (`1g.5gb`,
/// `1g.5gb+me`, `1g.24gb+gfx`), or a compute instance's, `<n>c.` before it (`1c.3g.40gb`).
fn is_mig_name(name: &str) -> bool {
    let name = split_compute(name).map_or(name, |(_, instance)| instance);
    let Some((slices, rest)) = name.split_once("g.") else {
        return false;
    };
    !rest.is_empty() && slices.parse::<u8>().is_ok_and(|n| (1..=8).contains(&n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog;
    use crate::catalog::parse_node_spec as parse_spec;
    use crate::gpu::GpuBackend;
    use crate::gpu::sim::{SimBackend, SimOptions};
    use crate::node::NodeState;
    use crate::plan::{self, PlanOptions};

    fn loc(line: usize, column: usize) -> Location {
        Location { origin: "t.yaml".into(), line, column }
    }

    const SMALL: &str = r#"version: v1
mig-configs:
  mixed:
    - devices: all
      mig-enabled: false
    - devices: [0, 1]
      device-filter: "0x20B010DE"
      mig-enabled: true
      mig-devices:
        "1g.5gb": 2
        "2g.10gb": 1
        "3g.20gb": 1
        "7g.40gb": 0

  on-empty:
    - device-filter: ["0x233010DE", "0x20b010de"]
      devices: all
      mig-enabled: true
      mig-devices: {}
"#;

    fn node(spec: &str) -> NodeState {
        NodeState::of_gpus(
            SimBackend::new(&parse_spec(spec).unwrap(), SimOptions::default()).observe().unwrap(),
        )
    }

    #[test]
    fn small_config_round_trip() {
        assert_eq!(config_names(SMALL, "t.yaml").unwrap(), ["mixed", "on-empty"]);
        let p = parse_mig_parted(SMALL, "t.yaml", "mixed").unwrap();
        assert_eq!(
            p,
            Profile {
                name: "mixed".into(),
                description: "mig-parted config mixed from t.yaml".into(),
                // Last entry first: in mig-parted the last matching entry wins.
                rules: vec![
                    GpuRule {
                        select: Selector::Indices(vec![(0, 0), (1, 1)]),
                        device_filter: vec![0x20B0_10DE],
                        location: loc(6, 7),
                        mig: MigLayout::Enabled(vec![
                            (MigKey::Name("1g.5gb".into()), 2),
                            (MigKey::Name("2g.10gb".into()), 1),
                            (MigKey::Name("3g.20gb".into()), 1),
                        ]),
                        sharing: Sharing::Exclusive,
                        instance_sharing: vec![],
                    },
                    GpuRule {
                        select: Selector::All,
                        device_filter: vec![],
                        location: loc(4, 7),
                        mig: MigLayout::Disabled,
                        sharing: Sharing::Exclusive,
                        instance_sharing: vec![],
                    },
                ],
            }
        );
        let q = parse_mig_parted(SMALL, "t.yaml", "on-empty").unwrap();
        assert_eq!(q.rules.len(), 1);
        assert_eq!(q.rules[0].device_filter, vec![0x2330_10DE, 0x20B0_10DE]);
        assert_eq!(q.rules[0].mig, MigLayout::Enabled(vec![]));
        assert_eq!(q.rules[0].location, loc(16, 7));

        // GPUs 0 and 1 get the balanced layout, 2 and 3 MIG off.
        let plan = plan::plan(&node("a100-40gb:4"), &p, &PlanOptions::default()).unwrap();
        let targets: Vec<(u32, bool, usize)> = plan
            .gpus
            .iter()
            .map(|g| (g.gpu, g.target.mig_enabled, g.target.instances.len()))
            .collect();
        assert_eq!(targets, [(0, true, 4), (1, true, 4), (2, false, 0), (3, false, 0)]);
        // A GPU the filter does not name is left alone; a node it names none of is refused.
        let plan = plan::plan(&node("a30:1,a100-40gb:1"), &q, &PlanOptions::default()).unwrap();
        assert_eq!(plan.gpus.iter().map(|g| g.gpu).collect::<Vec<_>>(), [1]);
        let e = plan::plan(&node("a30:2"), &q, &PlanOptions::default()).unwrap_err();
        assert!(e.to_string().starts_with("profile on-empty selects no GPU of this node"), "{e}");
    }

    fn err(text: &str) -> String {
        config_names(text, "t.yaml").unwrap_err().to_string()
    }

    #[test]
    fn errors_name_line_and_column() {
        let head = "version: v1\nmig-configs:\n  c:\n";
        // An unknown key in an entry.
        let e = err(&format!(
            "{head}    - devices: all\n      mig-enabled: false\n      mig-devics: {{}}\n"
        ));
        assert!(e.starts_with("t.yaml:6:7: "), "{e}");
        assert!(e.contains("mig-devics"), "{e}");
        // A bad device id in a filter list.
        let e = err(&format!(
            "{head}    - devices: all\n      device-filter: [\"0x20B010DE\", \"A100\"]\n      mig-enabled: false\n"
        ));
        assert!(
            e.starts_with("t.yaml:5:37: device-filter: \"A100\" is not a PCI device id"),
            "{e}"
        );
        // A negative count.
        let e = err(&format!(
            "{head}    - devices: all\n      mig-enabled: true\n      mig-devices:\n        \"1g.5gb\": -1\n"
        ));
        assert!(e.starts_with("t.yaml:7:19: mig-devices: the count of 1g.5gb must be"), "{e}");
        // mig-devices with MIG off.
        let e = err(&format!(
            "{head}    - devices: all\n      mig-enabled: false\n      mig-devices: {{\"1g.5gb\": 1}}\n"
        ));
        assert!(e.starts_with("t.yaml:6:20: mig-devices given with `mig-enabled: false`"), "{e}");
        // Not a MIG profile name.
        let e = err(&format!(
            "{head}    - devices: all\n      mig-enabled: true\n      mig-devices: {{\"5x\": 1}}\n"
        ));
        assert!(e.starts_with("t.yaml:6:21: mig-devices: \"5x\" is not a MIG profile name"), "{e}");
        // A bad index and a bad `devices` string.
        let e = err(&format!("{head}    - devices: [0, -2]\n      mig-enabled: false\n"));
        assert!(e.starts_with("t.yaml:4:20: devices: bad GPU index -2"), "{e}");
        let e = err(&format!("{head}    - devices: some\n      mig-enabled: false\n"));
        assert!(e.starts_with("t.yaml:4:16: devices: expected `all`"), "{e}");
        // The version.
        let e =
            err("version: v2\nmig-configs:\n  c:\n    - devices: all\n      mig-enabled: false\n");
        assert!(e.starts_with("t.yaml:1:10: unsupported version \"v2\""), "{e}");
        // YAML syntax.
        let e = err("version: v1\nmig-configs:\n  c: [\n");
        assert!(e.starts_with("t.yaml:"), "{e}");
        assert!(!e.contains('\n'), "{e}");
        // Missing fields and empty configs.
        let e = err(&format!("{head}    - devices: all\n"));
        assert!(e.starts_with("t.yaml:4:7: missing `mig-enabled`"), "{e}");
        let e = err(&format!("{head}    - devices: all\n      mig-enabled: true\n"));
        assert!(e.starts_with("t.yaml:5:20: `mig-enabled: true` needs `mig-devices`"), "{e}");
        let e = err("version: v1\nmig-configs:\n  c: []\n");
        assert!(e.starts_with("t.yaml:3:3: config \"c\" has no entries"), "{e}");
        let e = err(&format!(
            "{head}    - devices: all\n      device-filter: \"0x20B010DE:0x147E10DE\"\n      mig-enabled: false\n"
        ));
        assert!(e.contains("subsystem-qualified"), "{e}");
    }

    #[test]
    fn configs_entries_lists_and_instances_are_bounded() {
        let entry = "    - devices: all\n      mig-enabled: false\n";
        let configs = |n: usize| (0..n).map(|i| format!("  c{i}:\n{entry}")).collect::<String>();
        let file = |body: &str| format!("version: v1\nmig-configs:\n{body}");
        assert_eq!(config_names(&file(&configs(1024)), "t.yaml").unwrap().len(), 1024);
        let e = err(&file(&configs(1025)));
        assert_eq!(
            e,
            "t.yaml:3075:3: more than 1024 configs in `mig-configs`, the most a file may hold"
        );

        let entries = |n: usize| format!("  c:\n{}", entry.repeat(n));
        assert!(config_names(&file(&entries(256)), "t.yaml").is_ok());
        let e = err(&file(&entries(257)));
        assert_eq!(
            e,
            "t.yaml:516:7: config \"c\": more than 256 entries, the most a config may hold"
        );

        let one = |line: &str| file(&format!("  c:\n    - mig-enabled: true\n{line}"));
        let list = |n: usize, item: &str| vec![item; n].join(", ");
        let mig = "      mig-devices: {}\n";
        assert!(
            config_names(&one(&format!("      devices: [{}]\n{mig}", list(256, "0"))), "t.yaml")
                .is_ok()
        );
        let e = err(&one(&format!("      devices: [{}]\n{mig}", list(257, "0"))));
        assert_eq!(e, "t.yaml:5:16: devices: more than 256 GPU indices, the most a list may hold");
        let ids = |n| {
            format!(
                "      devices: all\n{mig}      device-filter: [{}]\n",
                list(n, "\"0x20B010DE\"")
            )
        };
        assert!(config_names(&one(&ids(256)), "t.yaml").is_ok());
        let e = err(&one(&ids(257)));
        assert_eq!(
            e,
            "t.yaml:7:22: device-filter: more than 256 device ids, the most a list may hold"
        );
        let e =
            err(&one("      devices: all\n      mig-devices: {\"1g.5gb\": 7, \"2g.10gb\": 2}\n"));
        assert_eq!(
            e,
            "t.yaml:6:20: mig-devices: 9 instances in one entry, more than any GPU holds (8 at most)"
        );
    }

    #[test]
    fn a_file_without_a_config_chosen_says_to_choose_one() {
        let one = "version: v1\nmig-configs:\n  exported:\n    - devices: all\n      mig-enabled: false\n";
        assert_eq!(parse_mig_parted(one, "n.yaml", "").unwrap().name, "exported");
        let e = parse_mig_parted(SMALL, "t.yaml", "").unwrap_err();
        assert_eq!(
            e.message,
            "a mig-parted file holds 2 configs: choose one with -c NAME (mixed, on-empty)"
        );
        let nvidia = include_str!("../../../tests/data/mig-parted-config-default.yaml");
        let e = parse_mig_parted(nvidia, "config.yaml", "all-balancd").unwrap_err();
        assert!(
            e.message.starts_with("no mig-parted config \"all-balancd\" (did you mean all-balanced?); the file has all-disabled, "),
            "{}",
            e.message
        );
        let e = parse_mig_parted(nvidia, "config.yaml", "").unwrap_err();
        assert!(
            e.message.starts_with("a mig-parted file holds 81 configs: choose one with -c NAME (all-disabled, all-enabled, ")
                && e.message.ends_with(", … and 73 more)"),
            "{}",
            e.message
        );
    }

    #[test]
    fn unknown_config_lists_the_known_ones() {
        let e = parse_mig_parted(SMALL, "t.yaml", "nope").unwrap_err();
        assert_eq!(e.location.line, 3, "{e}");
        assert_eq!(e.message, "no mig-parted config \"nope\"; the file has mixed, on-empty");
    }

    #[test]
    fn unquoted_device_ids_and_duplicates() {
        let entry = |filter: &str| {
            format!(
                "version: v1\nmig-configs:\n  c:\n    - devices: all\n      device-filter: {filter}\n      mig-enabled: false\n"
            )
        };
        for filter in ["0x20B010DE", "[0x20B010DE]", "\"0x20b010de\""] {
            let p = parse_mig_parted(&entry(filter), "t.yaml", "c").unwrap();
            assert_eq!(p.rules[0].device_filter, vec![0x20B0_10DE], "{filter}");
        }
        let e = err(&entry("[\"0x20B010DE\", 12]"));
        assert!(e.starts_with("t.yaml:5:37: device-filter: \"12\" is not a PCI device id"), "{e}");
        let e = err(
            "version: v1\nmig-configs:\n  c:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {\"1g.5gb\": 1, \"1g.5gb\": 2}\n",
        );
        assert_eq!(e, "t.yaml:6:34: duplicate key `1g.5gb`");
    }

    #[test]
    fn the_loose_profile_names_of_the_default_file_are_accepted() {
        let text = "version: v1\nmig-configs:\n  c:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {\"1g.24gb.gfx\": 1, \"1g.24gb-me\": 1, \"1g.5gb+me\": 1}\n";
        let p = parse_mig_parted(text, "t.yaml", "c").unwrap();
        let MigLayout::Enabled(instances) = &p.rules[0].mig else {
            panic!("MIG off");
        };
        assert_eq!(instances.len(), 3);
    }

    #[test]
    fn compute_instance_names_import_as_subdivisions() {
        let text = "version: v1\nmig-configs:\n  c:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {\"1c.3g.40gb\": 3, \"3g.40gb\": 1}\n";
        let p = parse_mig_parted(text, "t.yaml", "c").unwrap();
        let compute =
            MigKey::Compute { compute: 1, instance: Box::new(MigKey::Name("3g.40gb".into())) };
        assert_eq!(
            p.rules[0].mig,
            MigLayout::Enabled(vec![(compute, 3), (MigKey::Name("3g.40gb".into()), 1)])
        );
        let plan = plan::plan(&node("h100-80gb:1"), &p, &PlanOptions::default()).unwrap();
        let layouts: Vec<Vec<u8>> =
            plan.gpus[0].target.instances.iter().map(|i| i.compute.sizes().to_vec()).collect();
        assert_eq!(layouts, [vec![1, 1, 1], vec![3]]);
        let bad = text.replace("1c.3g.40gb", "1c.3x.40gb");
        let e = parse_mig_parted(&bad, "t.yaml", "c").unwrap_err().to_string();
        assert!(e.contains("is not a MIG profile name"), "{e}");
    }

    /// NVIDIA's shipped file: every config parses, and every config that names a model of
    /// ours plans on a simulated node of it.
    #[test]
    fn nvidia_default_file_plans_on_every_mig_model() {
        let path =
            concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/data/mig-parted-config-default.yaml");
        let text = std::fs::read_to_string(path).unwrap();
        let names = config_names(&text, path).unwrap();
        assert!(names.len() > 50, "{names:?}");
        let models: Vec<_> = catalog::models().iter().filter(|m| m.supports_mig()).collect();
        assert_eq!(models.len(), 12, "every catalog MIG model is tried");

        let mut planned: Vec<(String, &str)> = Vec::new();
        let mut naming_none = Vec::new();
        for name in &names {
            let profile = parse_mig_parted(&text, path, name).unwrap();
            assert_eq!(&profile.name, name);
            let mut named_any = false;
            for model in &models {
                let applicable: Vec<&GpuRule> = profile
                    .rules
                    .iter()
                    .filter(|r| {
                        r.device_filter.is_empty()
                            || model.pci_device_ids.iter().any(|id| r.device_filter.contains(id))
                    })
                    .collect();
                let names_model = !applicable.is_empty()
                    && applicable.iter().all(|r| {
                        r.mig.requests(model).iter().all(|(key, _)| key.resolve(model).is_some())
                    });
                if !names_model {
                    continue;
                }
                named_any = true;
                for count in [1usize, 8] {
                    let observed = node(&format!("{}:{count}", model.key));
                    // Whichever of the model's PCI ids the GPUs have, the plan must hold;
                    // with at least one of them, the config selects every GPU.
                    let mut most = 0;
                    for &id in &model.pci_device_ids {
                        let mut n = observed.clone();
                        for g in &mut n.gpus {
                            g.pci_device_id = id;
                        }
                        // Entries filter by PCI id: a variant the config does not name is
                        // refused as selecting nothing, never "nothing to do".
                        let selected = match plan::plan(&n, &profile, &PlanOptions::default()) {
                            Ok(plan) => plan.gpus.len(),
                            Err(e) if e.to_string().contains("selects no GPU") => 0,
                            Err(e) => panic!("{name} on {}:{count} ({id:#010X}): {e}", model.key),
                        };
                        most = most.max(selected);
                    }
                    assert_eq!(most, count, "{name} on {}:{count}", model.key);
                }
                planned.push((name.clone(), model.key.as_str()));
            }
            if !named_any {
                naming_none.push(name.as_str());
            }
        }

        for model in &models {
            let configs: Vec<&str> =
                planned.iter().filter(|(_, m)| *m == model.key).map(|(c, _)| c.as_str()).collect();
            println!("{}: {} configs: {}", model.key, configs.len(), configs.join(" "));
            assert!(configs.len() >= 3, "{}: {configs:?}", model.key);
            for needed in ["all-balanced", "all-disabled", "all-enabled"] {
                assert!(configs.contains(&needed), "{needed} on {}", model.key);
            }
        }
        println!(
            "{} configs, {} (config, model) pairs planned; naming none of our models ({}): {}",
            names.len(),
            planned.len(),
            naming_none.len(),
            naming_none.join(" ")
        );
    }
}
