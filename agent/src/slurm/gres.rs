//! A node's `Gres=` as slurmctld says it, as counts comparable with what gpushare's
//! gres.conf asks for.

use std::collections::BTreeMap;
use std::fmt;

/// A node's GRES as counts: `gpu:<type>` per GPU type, and `mps` and `shard` summed over
/// their types (slurmctld names a shared GRES by the GPU type it sits on, `mps:h100:200`,
/// where slurm.conf and slurmd's `--conf` say `mps:200`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Gres(BTreeMap<String, u64>);

impl Gres {
    /// The counts of a `Gres=` text (`gpu:h100:2(S:0-1),mps:h100:200`; `(null)` or empty:
    /// none). A part without a count counts 1.
    pub fn parse(text: &str) -> Gres {
        let mut counts = BTreeMap::new();
        let (mut depth, mut part) = (0u32, String::new());
        let mut parts = Vec::new();
        for c in text.trim().chars() {
            match c {
                '(' => depth += 1,
                ')' => depth = depth.saturating_sub(1),
                ',' if depth == 0 => parts.push(std::mem::take(&mut part)),
                c if depth == 0 => part.push(c),
                _ => {}
            }
        }
        parts.push(part);
        for part in parts.iter().map(|p| p.trim()).filter(|p| !p.is_empty() && *p != "(null)") {
            let words: Vec<&str> = part.split(':').collect();
            let (count, named) = match words.last().and_then(|w| count_of(w)) {
                Some(n) if words.len() > 1 => (n, &words[..words.len() - 1]),
                _ => (1, &words[..]),
            };
            let key = match named {
                ["gpu", kind, ..] => format!("gpu:{kind}"),
                [name, ..] => (*name).to_string(),
                [] => continue,
            };
            *counts.entry(key).or_insert(0) += count;
        }
        Gres(counts)
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A count as Slurm prints it: `200`, or with a suffix for a multiple of 1024 (`1K`).
fn count_of(word: &str) -> Option<u64> {
    let (digits, scale) = match word.char_indices().last()? {
        (at, 'K') => (&word[..at], 1u64 << 10),
        (at, 'M') => (&word[..at], 1 << 20),
        (at, 'G') => (&word[..at], 1 << 30),
        _ => (word, 1),
    };
    digits.parse::<u64>().ok()?.checked_mul(scale)
}

impl fmt::Display for Gres {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("(none)");
        }
        let parts: Vec<String> = self.0.iter().map(|(k, n)| format!("{k}:{n}")).collect();
        f.write_str(&parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurmctld_s_gres_and_a_node_line_s_compare_as_counts() {
        let slurm = Gres::parse("gpu:1g.10gb:2,gpu:h100:1(S:0-1),mps:h100:100,mps:a100:100");
        let ours = Gres::parse("gpu:1g.10gb:2,gpu:h100:1,mps:200");
        assert_eq!(slurm, ours);
        assert_eq!(ours.to_string(), "gpu:1g.10gb:2,gpu:h100:1,mps:200");
        assert!(Gres::parse("(null)").is_empty() && Gres::parse("").is_empty());
        assert_ne!(Gres::parse("gpu:h100:2"), Gres::parse("gpu:h100:2,shard:h100:8"));
        assert_eq!(Gres::parse("gpu"), Gres::parse("gpu:1"));
        assert_eq!(Gres::parse("shard:h100:1K"), Gres::parse("shard:1024"));
    }
}
