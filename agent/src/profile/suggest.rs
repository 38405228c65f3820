//! "Did you mean" for a MIG profile a GPU does not offer: the profile the typed name most
//! likely means on that model, judged by what profiles are, not by how they are spelled.
//!
//! A typed text that reads as a MIG profile name (NVIDIA's rule, [`crate::catalog::naming`])
//! is matched by compute slices (the same count first, then the nearest), then memory (the
//! nearest `GB`), then variant ([`variant_distance`]; a mistyped one read as the variant it
//! misspells, [`known_variant`]), and only then by spelling. Text that is no profile name
//! (`3g`, a typo past recognition) falls back to spelling alone ([`super::closest`]).

use crate::catalog::GpuModel;
use crate::catalog::naming::parse_name;

/// The profile of `model` that `typed`, a name it does not offer, most likely means.
pub(crate) fn mig_profile<'a>(typed: &str, model: &'a GpuModel) -> Option<&'a str> {
    let names: Vec<&str> = model.mig_profiles.iter().map(|p| p.name.as_str()).collect();
    let Some(want) = parse_name(typed) else {
        return super::closest(typed, &names);
    };
    let want_variant = known_variant(want.variant);
    names
        .iter()
        .filter_map(|&name| parse_name(name).map(|have| (name, have)))
        .min_by(|(a_name, a), (b_name, b)| {
            let rank = |have: &crate::catalog::naming::ParsedName<'_>| {
                (
                    // No profile has 0 slices: a `0g` says nothing of the slices meant.
                    if want.gpu_slices == 0 {
                        0
                    } else {
                        have.gpu_slices.abs_diff(want.gpu_slices)
                    },
                    have.gb.abs_diff(want.gb),
                    variant_distance(want_variant, have.variant),
                )
            };
            rank(a).cmp(&rank(b)).then_with(|| {
                // Spelling last: the more alike first (Jaro, as `closest`).
                strsim::jaro(typed, b_name).total_cmp(&strsim::jaro(typed, a_name))
            })
        })
        .map(|(name, _)| name)
}

/// The variants NVIDIA's tools name (go-nvlib's attributes after the sign).
const VARIANTS: [&str; 4] = ["+me", "+me.all", "-me", "+gfx"];

/// The variant `typed` stands for: itself where it is one of [`VARIANTS`] (or none), else
/// the one of the same sign it is a typo of (the one nearest, within two edits: `+me.al`
/// is `+me.all`, `+em` `+me`; never across the sign, as `-gfx` is no `+gfx`); else itself
/// (as far from every variant as an unknown one).
fn known_variant(typed: &str) -> &str {
    if typed.is_empty() || VARIANTS.contains(&typed) {
        return typed;
    }
    let mut near: Vec<(usize, &'static str)> = VARIANTS
        .iter()
        .filter(|v| v[..1] == typed[..1])
        .map(|v| (strsim::osa_distance(typed, v), *v))
        .collect();
    near.sort();
    match (near.first(), near.get(1)) {
        (Some(&(edits, v)), next) if edits <= 2 && next.is_none_or(|n| n.0 > edits) => v,
        _ => typed,
    }
}

/// How far a profile of variant `have` is from the variant `typed` asked for: the same
/// variant first, then the one with the closest media engines. `-me` (no media engines)
/// is nearest the plain profile (the default, with the fewest of them) and farthest from
/// `+me`/`+me.all`; `+me` and `+me.all` (media engines added) are nearest each other;
/// `+gfx` and a variant no GPU names are nearest plain. For a plain name every variant is
/// as far (spelling decides).
fn variant_distance(typed: &str, have: &str) -> u8 {
    if typed == have {
        return 0;
    }
    let adds_media = |v: &str| v == "+me" || v == "+me.all";
    match (typed, have) {
        (t, h) if adds_media(t) && adds_media(h) => 1,
        (_, "") => 2,
        ("-me", h) if adds_media(h) => 4,
        _ => 3,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{model_by_key, simulated_model_by_key};

    fn guess(model: &str, typed: &str) -> Option<&'static str> {
        mig_profile(typed, simulated_model_by_key(model).unwrap())
    }

    #[test]
    fn the_same_slices_come_before_the_same_spelling() {
        // Spelling alone suggested 7g.40gb: the 3-slice profile is 3g.20gb.
        assert_eq!(guess("a100-40gb", "3g.40gb"), Some("3g.20gb"));
        // And 1g.20gb here: the 1-slice default is 1g.10gb.
        assert_eq!(guess("h100-80gb", "1g.5gb"), Some("1g.10gb"));
        assert_eq!(guess("h100-80gb", "1g.21gb"), Some("1g.20gb"));
        // A100-80GB names mig-parted's 40GB configs by slices: 3g.20gb → 3g.40gb.
        assert_eq!(guess("a100-80gb", "3g.20gb"), Some("3g.40gb"));
        // No 3-slice profile at all: the nearest slice count, then memory.
        assert_eq!(guess("a30-24gb", "3g.12gb"), Some("2g.12gb"));
    }

    #[test]
    fn a_variant_is_matched_by_what_it_means() {
        // `-me` (no media engines) on a model without it: the plain profile, never `+me`.
        assert_eq!(guess("h100-80gb", "1g.10gb-me"), Some("1g.10gb"));
        assert_eq!(guess("h100-80gb", "1g.11gb-me"), Some("1g.10gb"));
        // Where the model has the variant, the variant.
        assert_eq!(guess("rtx-pro-6000-bse", "1g.23gb-me"), Some("1g.24gb-me"));
        assert_eq!(guess("rtx-pro-6000-bse", "1g.23gb+me.all"), Some("1g.24gb+me.all"));
        // `+me.all` where only `+me` exists; `+gfx` where none exists.
        assert_eq!(guess("h100-80gb", "1g.10gb+me.all"), Some("1g.10gb+me"));
        assert_eq!(guess("h100-80gb", "1g.10gb+gfx"), Some("1g.10gb"));
        // A plain typo: the plain profile of that size.
        assert_eq!(guess("rtx-pro-6000-bse", "2g.47gb"), Some("2g.48gb"));
        // A driver's rename: the early GB200's names on the production board and back.
        assert_eq!(guess("gb200", "1g.24gb+me"), Some("1g.23gb+me"));
        assert_eq!(guess("gb200-early", "7g.186gb"), Some("7g.189gb"));
    }

    #[test]
    fn a_mistyped_variant_is_read_as_the_variant_it_misspells() {
        assert_eq!(guess("rtx-pro-6000-bse", "1g.24gb+me.al"), Some("1g.24gb+me.all"));
        assert_eq!(guess("rtx-pro-6000-bse", "1g.24gb+gf"), Some("1g.24gb+gfx"));
        assert_eq!(guess("h100-80gb", "1g.10gb+em"), Some("1g.10gb+me"));
        assert_eq!(guess("rtx-pro-6000-bse", "2g.48gb-m"), Some("2g.48gb-me"));
        // Never across the sign: `-gfx` (no graphics) is the plain profile, not `+gfx`.
        assert_eq!(guess("rtx-pro-6000-bse", "1g.24gb-gfx"), Some("1g.24gb"));
        // On every model: each variant profile with its last letter lost is named back.
        for model in crate::catalog::simulated_models() {
            for p in &model.mig_profiles {
                let Some(at) = p.name.find(['+', '-']) else { continue };
                let typed = &p.name[..p.name.len() - 1];
                if at + 2 > typed.len() {
                    continue;
                }
                assert_eq!(mig_profile(typed, model), Some(p.name.as_str()), "{}", model.key);
            }
        }
    }

    #[test]
    fn no_slices_say_nothing_of_the_slices_meant() {
        // `0g` is no profile on any GPU: memory decides (was 1g.36gb, the nearest count).
        assert_eq!(guess("gh200-144gb", "0g.144gb"), Some("7g.144gb"));
        assert_eq!(guess("h100-80gb", "0g.80gb"), Some("7g.80gb"));
    }

    #[test]
    fn text_that_is_no_profile_name_is_matched_by_spelling() {
        let h100 = model_by_key("h100-80gb").unwrap();
        assert_eq!(mig_profile("1g.10bg", h100), Some("1g.10gb"));
        assert_eq!(mig_profile("3g", model_by_key("a30").unwrap()), None);
        assert_eq!(mig_profile("anything", h100), None);
    }

    #[test]
    fn variants_rank_as_written_down() {
        assert_eq!(variant_distance("-me", "-me"), 0);
        assert!(variant_distance("-me", "") < variant_distance("-me", "+gfx"));
        assert!(variant_distance("-me", "+gfx") < variant_distance("-me", "+me"));
        assert!(variant_distance("+me", "+me.all") < variant_distance("+me", ""));
        assert_eq!(variant_distance("", "-me"), variant_distance("", "+me"));
    }
}
