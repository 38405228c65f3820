//! The profiles an agent knows: the built-ins compiled in, then the files of
//! `profiles.d/` (a file may replace a built-in of the same name).
//!
//! A file that fails to parse is left out whole and its error kept for `profiles list`
//! and the log: the agent never uses half-read configuration.

use std::collections::BTreeMap;
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

use gpushare_proto::PROFILE_MAX_BYTES;

use super::{Profile, parse_profile};

/// The built-in profiles, as TOML text parsed by the same parser as files.
pub(crate) const BUILT_IN: &[(&str, &str)] = &[
    ("all-disabled", include_str!("builtin/all-disabled.toml")),
    ("all-balanced", include_str!("builtin/all-balanced.toml")),
    ("half-balanced", include_str!("builtin/half-balanced.toml")),
    ("all-mps", include_str!("builtin/all-mps.toml")),
    ("all-time-sliced", include_str!("builtin/all-time-sliced.toml")),
];

/// Where a profile came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProfileSource {
    /// Compiled into the agent.
    BuiltIn,
    /// A file of the profile directory.
    File(PathBuf),
}

impl fmt::Display for ProfileSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProfileSource::BuiltIn => f.write_str("built-in"),
            ProfileSource::File(p) => write!(f, "{}", p.display()),
        }
    }
}

/// A profile with its source and text.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredProfile {
    /// The parsed profile.
    pub profile: Profile,
    /// Where it came from.
    pub source: ProfileSource,
    /// Its TOML text.
    pub text: String,
}

/// Every profile the agent knows, by name.
#[derive(Debug, Clone, Default)]
pub struct ProfileStore {
    profiles: BTreeMap<String, StoredProfile>,
    errors: Vec<String>,
    /// The error of each file that did not load, by the name its file stem gives it: a
    /// profile asked for by that name is refused with the file's error, not as unknown.
    broken: BTreeMap<String, String>,
}

/// Why [`ProfileStore::get`] has no profile of a name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Missing {
    /// No profile of that name, nor a file that would give it: the known names listed.
    Unknown(String),
    /// The file of that name does not load: its error.
    Broken(String),
}

impl std::fmt::Display for Missing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Missing::Unknown(why) | Missing::Broken(why) => f.write_str(why),
        }
    }
}

impl ProfileStore {
    /// The built-in profiles only.
    pub fn built_in() -> Self {
        let mut store = ProfileStore::default();
        for (name, text) in BUILT_IN {
            let profile = parse_profile(text, &format!("built-in:{name}"), None)
                .expect("built-in profiles parse (checked by tests)");
            store.profiles.insert(
                profile.name.clone(),
                StoredProfile { profile, source: ProfileSource::BuiltIn, text: text.to_string() },
            );
        }
        store
    }

    /// The built-ins plus every `*.toml` of `dir` in name order. A missing directory is
    /// not an error; an unreadable or invalid file is recorded in [`ProfileStore::errors`].
    pub fn load(dir: Option<&Path>) -> Self {
        let mut store = Self::built_in();
        let Some(dir) = dir else { return store };
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return store,
            Err(e) => {
                store.errors.push(format!("{}: {e}", dir.display()));
                return store;
            }
        };
        let mut paths: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "toml"))
            .collect();
        paths.sort();
        for path in paths {
            if let Err(e) = store.add_file(&path) {
                if let Some(stem) = path.file_stem().and_then(|s| s.to_str()) {
                    store.broken.insert(super::parse::name_from_stem(stem), e.clone());
                }
                store.errors.push(e);
            }
        }
        store
    }

    fn add_file(&mut self, path: &Path) -> Result<(), String> {
        let text = read_profile_file(path)?;
        let stem = path.file_stem().and_then(|s| s.to_str());
        let profile =
            parse_profile(&text, &path.display().to_string(), stem).map_err(|e| e.to_string())?;
        if let Some(existing) = self.profiles.get(&profile.name)
            && let ProfileSource::File(other) = &existing.source
        {
            return Err(format!(
                "{}: profile {:?} is already defined in {}",
                path.display(),
                profile.name,
                other.display()
            ));
        }
        let source = ProfileSource::File(path.to_path_buf());
        self.profiles.insert(profile.name.clone(), StoredProfile { profile, source, text });
        Ok(())
    }

    /// The profile called `name`, or a one-line error listing the known names.
    pub fn get(&self, name: &str) -> Result<&StoredProfile, Missing> {
        self.profiles.get(name).ok_or_else(|| match self.broken.get(name) {
            Some(e) => Missing::Broken(format!("profile {name:?} does not load: {e}")),
            None => {
                let known: Vec<&str> = self.profiles.keys().map(String::as_str).collect();
                let guess = super::closest(name, &known).map(|n| format!(" (did you mean {n}?)"));
                Missing::Unknown(format!(
                    "unknown profile {name:?}{}; known profiles: {}",
                    guess.unwrap_or_default(),
                    known.join(", ")
                ))
            }
        })
    }

    /// Every profile, by name.
    pub fn iter(&self) -> impl Iterator<Item = &StoredProfile> {
        self.profiles.values()
    }

    /// Files that could not be loaded, one line each with file, line and column.
    pub fn errors(&self) -> &[String] {
        &self.errors
    }
}

/// A profile file's text, reading no more than one byte over [`PROFILE_MAX_BYTES`] (the
/// parser refuses such a text whole) and nothing but a regular file: opening a FIFO would
/// block the agent.
fn read_profile_file(path: &Path) -> Result<String, String> {
    let failed = |e: std::io::Error| format!("{}: {e}", path.display());
    if !std::fs::metadata(path).map_err(failed)?.is_file() {
        return Err(format!("{}: not a regular file", path.display()));
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(PROFILE_MAX_BYTES as u64 + 1).read_to_end(&mut bytes))
        .map_err(failed)?;
    if bytes.len() > PROFILE_MAX_BYTES {
        return Err(format!("{}:1:1: {}", path.display(), gpushare_proto::profile_too_large()));
    }
    String::from_utf8(bytes).map_err(|_| format!("{}: it is not UTF-8 text", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{MigLayout, Selector};

    #[test]
    fn built_ins_parse_and_are_named_as_designed() {
        let store = ProfileStore::built_in();
        let names: Vec<&str> = store.iter().map(|p| p.profile.name.as_str()).collect();
        assert_eq!(
            names,
            ["all-balanced", "all-disabled", "all-mps", "all-time-sliced", "half-balanced"]
        );
        let half = &store.get("half-balanced").unwrap().profile;
        assert_eq!(half.rules[0].select, Selector::FirstHalf);
        assert_eq!(half.rules[0].mig, MigLayout::Balanced);
        assert_eq!(half.rules[1].mig, MigLayout::Disabled);
        assert!(store.get("all-mps").unwrap().profile.uses_sharing());
    }

    #[test]
    fn unknown_names_list_the_known_ones() {
        let e = ProfileStore::built_in().get("half").unwrap_err().to_string();
        assert!(e.starts_with("unknown profile \"half\"; known profiles: all-balanced, "), "{e}");
    }

    #[test]
    fn a_mistyped_name_gets_the_closest_known_one() {
        let e = ProfileStore::built_in().get("half-balance").unwrap_err().to_string();
        assert!(
            e.starts_with("unknown profile \"half-balance\" (did you mean half-balanced?); known profiles: all-balanced, "),
            "{e}"
        );
        let e = ProfileStore::built_in().get("all-mp").unwrap_err().to_string();
        assert!(e.contains("(did you mean all-mps?)"), "{e}");
    }

    #[test]
    fn files_override_built_ins_and_bad_files_are_left_out() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("all-balanced.toml"),
            "description = \"mine\"\n[[gpu]]\nselect = \"all\"\nmig = { \"7g\" = 1 }\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("broken.toml"), "name = \"broken\"\n[[gpu]]\nselect = [\n")
            .unwrap();
        std::fs::write(dir.path().join("notes.txt"), "not a profile").unwrap();
        let store = ProfileStore::load(Some(dir.path()));
        let mine = store.get("all-balanced").unwrap();
        assert_eq!(mine.profile.description, "mine");
        assert!(matches!(mine.source, ProfileSource::File(_)));
        // Asked for by name, a file that does not load answers with its own error.
        match store.get("broken") {
            Err(Missing::Broken(why)) => {
                assert!(why.starts_with("profile \"broken\" does not load: "), "{why}");
                assert!(why.contains("broken.toml:"), "{why}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(store.errors().len(), 1);
        assert!(store.errors()[0].contains("broken.toml:"), "{:?}", store.errors());
    }

    #[test]
    fn oversized_and_endless_files_are_left_out_unread() {
        let dir = tempfile::tempdir().unwrap();
        let mut big = b"[[gpu]]\nselect = \"all\"\n".to_vec();
        big.resize(gpushare_proto::PROFILE_MAX_BYTES + 1, b'#');
        std::fs::write(dir.path().join("big.toml"), big).unwrap();
        let fifo = dir.path().join("fifo.toml");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        // A FIFO nobody writes to would block the agent's start in open(2).
        let store = ProfileStore::load(Some(dir.path()));
        let big = dir.path().join("big.toml");
        assert_eq!(
            store.errors(),
            [
                format!("{}:1:1: larger than 256 KiB, the most a profile may be", big.display()),
                format!("{}: not a regular file", fifo.display()),
            ]
        );
    }

    #[test]
    fn a_nameless_file_is_named_after_its_stem_made_valid() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("Lab Split.toml"), "[[gpu]]\nselect = \"all\"\n").unwrap();
        let store = ProfileStore::load(Some(dir.path()));
        assert!(store.errors().is_empty(), "{:?}", store.errors());
        assert!(store.get("lab-split").is_ok());
    }

    #[test]
    fn a_missing_directory_is_fine() {
        let store = ProfileStore::load(Some(Path::new("/nonexistent/gpushare")));
        assert!(store.errors().is_empty());
        assert_eq!(store.iter().count(), BUILT_IN.len());
    }
}
