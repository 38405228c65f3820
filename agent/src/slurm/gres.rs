//! What Slurm's answers say of GRES: a node's `Gres=` as counts comparable with what
//! gpushare's gres.conf asks for, and which jobs hold GRES on a node (`squeue --json`).

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;

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
            let (count, named) = match words.last().and_then(|w| w.parse::<u64>().ok()) {
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

impl fmt::Display for Gres {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("(none)");
        }
        let parts: Vec<String> = self.0.iter().map(|(k, n)| format!("{k}:{n}")).collect();
        f.write_str(&parts.join(","))
    }
}

/// The parts of `squeue --json` (openapi v0.0.38 and later) read here.
#[derive(Deserialize)]
struct Queue {
    #[serde(default)]
    jobs: Vec<Job>,
}

#[derive(Deserialize)]
struct Job {
    job_id: u64,
    #[serde(default)]
    job_state: String,
    /// GRES per allocated node, in the order of `job_resources.allocated_nodes`.
    #[serde(default)]
    gres_detail: Vec<String>,
    #[serde(default)]
    job_resources: Option<Resources>,
}

#[derive(Deserialize)]
struct Resources {
    #[serde(default)]
    allocated_nodes: Vec<Allocated>,
}

#[derive(Deserialize)]
struct Allocated {
    #[serde(default)]
    nodename: String,
}

/// The states of a job that holds what it was given.
const HOLDING: [&str; 5] = ["RUNNING", "SUSPENDED", "CONFIGURING", "COMPLETING", "STAGE_OUT"];

/// The ids of the jobs of `squeue --json`'s `text` holding GRES on `node`: allocated
/// there, in a state that holds its allocation, with GRES on that node (where the detail
/// does not say per node, with any).
pub fn jobs_holding_gres(text: &str, node: &str) -> Result<Vec<u64>, String> {
    let queue: Queue = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let mut ids = Vec::new();
    for job in queue.jobs {
        let state = job.job_state.split('+').next().unwrap_or_default();
        if !HOLDING.contains(&state) {
            continue;
        }
        let nodes = job.job_resources.map(|r| r.allocated_nodes).unwrap_or_default();
        let Some(at) = nodes.iter().position(|n| n.nodename == node) else { continue };
        let held = |g: &String| !g.trim().is_empty() && g != "(null)";
        let holds = match job.gres_detail.len() == nodes.len() {
            true => held(&job.gres_detail[at]),
            false => job.gres_detail.iter().any(held),
        };
        if holds {
            ids.push(job.job_id);
        }
    }
    ids.sort_unstable();
    Ok(ids)
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
    }

    fn job(id: u64, state: &str, nodes: &[&str], gres: &[&str]) -> serde_json::Value {
        serde_json::json!({
            "job_id": id, "name": "Nodes=vm GRES=gpu:1", "job_state": state,
            "gres_detail": gres,
            "job_resources": {
                "nodes": "x",
                "allocated_nodes": nodes.iter().map(|n| serde_json::json!({"nodename": n}))
                    .collect::<Vec<_>>(),
            },
        })
    }

    #[test]
    fn the_jobs_holding_gres_on_a_node_are_those_squeue_allocates_there() {
        let queue = serde_json::json!({"jobs": [
            job(1, "RUNNING", &["vm"], &["gpu:h100:1(IDX:0)"]),
            job(2, "RUNNING", &["vm"], &[]),
            job(3, "PENDING", &[], &[]),
            job(4, "RUNNING", &["other", "vm"], &["gpu:h100:1(IDX:0)", ""]),
            job(5, "RUNNING", &["other", "vm"], &["", "mps:25(IDX:1)"]),
            job(6, "COMPLETING", &["vm"], &["shard:2(IDX:1)"]),
            job(7, "RUNNING", &["other"], &["gpu:h100:1(IDX:0)"]),
            {"job_id": 8, "job_state": "RUNNING"},
        ]});
        let ids = jobs_holding_gres(&queue.to_string(), "vm").unwrap();
        assert_eq!(ids, vec![1, 5, 6]);
        assert!(jobs_holding_gres("{", "vm").is_err());
    }
}
