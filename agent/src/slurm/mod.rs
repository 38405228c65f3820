//! Slurm as this node sees it: the one place the agent asks Slurm anything or tells it
//! anything (DESIGN.md "Slurm (issue 41): a GRES change, node by node"). It reads the
//! node (`scontrol -o show node`: its GRES, state, drain reason, whether it is dynamic)
//! and the jobs on it (`squeue -w`, ids and states only: nothing a user names), drains
//! and resumes the node, deletes a dynamic node from slurmctld, and stops and starts
//! slurmd through the site's commands (`[slurm] stop_slurmd`, `start_slurmd`). Calls
//! block: async callers run them on tokio's blocking pool.

mod gres;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub use gres::Gres;

use crate::config::SlurmSettings;
use crate::sys::command::{Command, Finished};
use crate::sys::trusted;

/// How long one scontrol or squeue call may take.
const CALL_LIMIT: Duration = Duration::from_secs(30);
/// How long `stop_slurmd` or `start_slurmd` may take.
const COMMAND_LIMIT: Duration = Duration::from_secs(300);
/// How often the node is looked at while slurmd registers.
const LOOK_EVERY: Duration = Duration::from_millis(250);
/// Most characters of a drain reason (Slurm keeps it in its state file).
const REASON_MAX: usize = 240;
/// What every reason gpushare sets begins with: a drain with another reason is the
/// site's, and is kept.
pub const REASON_PREFIX: &str = "gpushare: ";

/// The node as slurmctld has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    /// Its GRES (`Gres=`).
    pub gres: Gres,
    /// Its state (`IDLE+DRAIN+DYNAMIC_NORM`).
    pub state: String,
    /// Why it is drained or down, without Slurm's `[user@time]` suffix.
    pub reason: Option<String>,
}

impl NodeInfo {
    /// Whether slurmd registers it itself (`slurmd -Z`): its GRES come from the node.
    pub fn dynamic(&self) -> bool {
        self.flags().any(|f| f.starts_with("DYNAMIC"))
    }

    /// Whether it is drained or draining.
    pub fn drained(&self) -> bool {
        self.flags().any(|f| f == "DRAIN")
    }

    /// Whether gpushare drained it (its reason begins with [`REASON_PREFIX`]).
    pub fn drained_by_gpushare(&self) -> bool {
        self.drained() && self.reason.as_deref().is_some_and(|r| r.starts_with(REASON_PREFIX))
    }

    /// Whether slurmctld says something is allocated there (a job, or one ending).
    pub fn busy(&self) -> bool {
        self.flags().any(|f| matches!(f, "ALLOCATED" | "MIXED" | "COMPLETING"))
    }

    /// A drain a site set (not gpushare): its reason, to be kept.
    pub fn site_drain(&self) -> Option<String> {
        let reason = self.reason.clone().unwrap_or_default();
        (self.drained() && !reason.starts_with(REASON_PREFIX)).then_some(reason)
    }

    fn flags(&self) -> impl Iterator<Item = &str> {
        self.state.split('+')
    }
}

/// This node in Slurm, through the programs `[slurm]` names.
#[derive(Debug, Clone)]
pub struct SlurmNode {
    name: String,
    bin_dir: PathBuf,
    slurm_conf: PathBuf,
    stop_slurmd: String,
    start_slurmd: String,
    register_timeout: Duration,
}

impl SlurmNode {
    /// The node `settings` name.
    pub fn new(settings: &SlurmSettings) -> Self {
        SlurmNode {
            name: settings.node_name(),
            bin_dir: settings.bin_dir.clone(),
            slurm_conf: settings.slurm_conf.clone(),
            stop_slurmd: settings.stop_slurmd.clone(),
            start_slurmd: settings.start_slurmd.clone(),
            register_timeout: Duration::from_secs(settings.register_timeout_seconds),
        }
    }

    /// Slurm's name of the node.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `tool` under `[slurm] bin_dir`, if the agent may run it: in a directory it trusts,
    /// a file it trusts as its own records ([`trusted::open_file`]: no link, a plain file
    /// of root's that no one else may write), executable.
    fn tool(&self, tool: &str) -> Result<PathBuf, String> {
        use std::os::unix::fs::PermissionsExt;
        let path = self.bin_dir.join(tool);
        let at = |why: String| format!("[slurm] bin_dir: {}: {why}", path.display());
        trusted::check_dir(&self.bin_dir).map_err(|why| format!("[slurm] bin_dir: {why}"))?;
        let file = trusted::open_file(&path)
            .map_err(|e| at(e.to_string()))?
            .ok_or_else(|| at("no such file".into()))?;
        let mode = file.metadata().map_err(|e| at(e.to_string()))?.permissions().mode();
        if mode & 0o111 == 0 {
            return Err(at("not executable".into()));
        }
        Ok(path)
    }

    fn command(&self, program: &Path, timeout: Duration) -> Command {
        let command = Command::new(program, timeout);
        match self.slurm_conf.as_os_str().is_empty() {
            true => command,
            false => command.env("SLURM_CONF", &self.slurm_conf),
        }
    }

    /// Runs `tool` with `args`: its stdout, or why it failed in one line.
    fn call(&self, tool: &str, args: &[&str]) -> Result<String, String> {
        let program = self.tool(tool)?;
        let line = format!("{tool} {}", args.join(" "));
        let done = self
            .command(&program, CALL_LIMIT)
            .args(args)
            .run()
            .map_err(|e| format!("{line}: {e}"))?;
        finished(&line, &done, CALL_LIMIT)?;
        Ok(done.stdout_text())
    }

    /// The node as slurmctld has it (`None`: slurmctld does not know it); refused when
    /// slurmctld does not answer.
    pub fn node(&self) -> Result<Option<NodeInfo>, String> {
        self.call("scontrol", &["ping"]).map_err(|why| {
            format!(
                "[slurm] enabled: slurmctld does not answer ({why}); start it, or set [slurm] \
                 manage_node = false"
            )
        })?;
        let arg = self.name.as_str();
        // scontrol fails for a node slurmctld does not know (`Node x not found`).
        let Ok(text) = self.call("scontrol", &["-o", "show", "node", arg]) else {
            return Ok(None);
        };
        let Some(line) = text.lines().find(|l| l.starts_with("NodeName=")) else {
            return Ok(None);
        };
        let fields = fields(line);
        let field = |k: &str| fields.iter().find(|(key, _)| *key == k).map(|(_, v)| v.clone());
        if field("NodeName").as_deref() != Some(arg) {
            return Ok(None);
        }
        // The reason is the line's last field and may hold anything (`a=b`, `[ops]`):
        // all after ` Reason=`, less Slurm's ` [user@time]`.
        let reason = line.split_once(" Reason=").map(|(_, r)| {
            let r = r.trim_end();
            match r.rfind(" [") {
                Some(at) if r.ends_with(']') => r[..at].to_string(),
                _ => r.to_string(),
            }
        });
        Ok(Some(NodeInfo {
            gres: Gres::parse(&field("Gres").unwrap_or_default()),
            state: field("State").unwrap_or_default(),
            reason: reason.filter(|r| !r.is_empty() && r != "(null)"),
        }))
    }

    /// The jobs allocated on the node now, in any state but pending or ended (running,
    /// suspended, stopped, being set up or ending: `scontrol delete` refuses a node that
    /// has any), by id; from `squeue`, whose ids and states no user names.
    pub fn jobs_on_node(&self) -> Result<Vec<String>, String> {
        let node = self.name.as_str();
        let text = self.call("squeue", &["-h", "-w", node, "-t", "all", "-o", "%i %T"])?;
        Ok(jobs_holding(&text))
    }

    /// Drains the node with `reason` (as one field: see [`flat`]; gpushare's own reasons
    /// are [`reason_text`]).
    pub fn drain(&self, reason: &str) -> Result<(), String> {
        let reason = format!("Reason={}", flat(reason));
        let node = format!("NodeName={}", self.name);
        self.call("scontrol", &["update", &node, "State=DRAIN", &reason]).map(drop)
    }

    /// Gives the node back to the scheduler.
    pub fn resume(&self) -> Result<(), String> {
        let node = format!("NodeName={}", self.name);
        self.call("scontrol", &["update", &node, "State=RESUME"]).map(drop)
    }

    /// Registers the node again with the GRES its slurmd now reads: slurmd stopped, the
    /// node deleted from slurmctld (a dynamic node keeps its old GRES there otherwise),
    /// slurmd started; drained with `hold` as soon as it is back (it comes back idle);
    /// waits for it to register with `want`.
    pub fn register_again(&self, want: &Gres, hold: &str) -> Result<(), String> {
        self.site_command("stop_slurmd", &self.stop_slurmd)?;
        let node = format!("NodeName={}", self.name);
        let deleted = self.call("scontrol", &["delete", &node]);
        // Started again whatever the delete said: a node left without slurmd is worse.
        self.site_command("start_slurmd", &self.start_slurmd)?;
        deleted.map_err(|why| format!("slurmctld kept the node's old GRES: {why}"))?;
        let start = Instant::now();
        let mut held = false;
        loop {
            let seen = self.node();
            if let Ok(Some(info)) = &seen
                && !held
            {
                held = info.drained() || self.drain(hold).is_ok();
            }
            if let Ok(Some(info)) = &seen
                && held
                && info.gres == *want
                && !info.state.split('+').any(|f| f == "NOT_RESPONDING" || f == "UNKNOWN")
            {
                return Ok(());
            }
            if start.elapsed() >= self.register_timeout {
                let now = match seen {
                    Ok(Some(i)) => format!("Gres={} State={}", i.gres, i.state),
                    Ok(None) => "no such node".into(),
                    Err(e) => e,
                };
                return Err(format!(
                    "slurmd did not register with Gres={want} within {} s ([slurm] \
                     register_timeout_seconds); slurmctld has {now}",
                    self.register_timeout.as_secs()
                ));
            }
            std::thread::sleep(LOOK_EVERY);
        }
    }

    /// Runs a site's command (`[slurm] key`) through `/bin/sh -c`.
    fn site_command(&self, key: &str, command: &str) -> Result<(), String> {
        let line = format!("[slurm] {key} `{command}`");
        let done = self
            .command(Path::new("/bin/sh"), COMMAND_LIMIT)
            .arg("-c")
            .arg(command)
            .env("GPUSHARE_SLURM_NODE", &self.name)
            .discard_stdout()
            .own_process_group()
            .run()
            .map_err(|e| format!("{line}: {e}"))?;
        finished(&line, &done, COMMAND_LIMIT)
    }
}

/// Whether `done` succeeded, or why not in one line naming `line` (all its error lines:
/// scontrol says the cause after `error: failed to …`).
fn finished(line: &str, done: &Finished, limit: Duration) -> Result<(), String> {
    match done.status {
        None => Err(format!("{line}: did not finish within {} s", limit.as_secs())),
        Some(s) if !s.success() => {
            let said = done.stderr_text();
            let said: Vec<&str> = said.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
            let said = if said.is_empty() { done.first_line() } else { said.join("; ") };
            Err(format!("{line}: {s}: {}", said.chars().take(1000).collect::<String>()))
        }
        Some(_) => Ok(()),
    }
}

/// The states in which a job holds nothing on a node: waiting, or ended.
const NOT_HOLDING: [&str; 10] = [
    "PENDING",
    "COMPLETED",
    "CANCELLED",
    "FAILED",
    "TIMEOUT",
    "NODE_FAIL",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
    "OUT_OF_MEMORY",
];

/// The jobs of `squeue -h -o '%i %T'` lines that hold what they were given.
fn jobs_holding(text: &str) -> Vec<String> {
    let jobs = text.lines().filter_map(|l| {
        let (id, state) = l.trim().split_once(' ')?;
        (!NOT_HOLDING.contains(&state.trim())).then(|| id.to_string())
    });
    let mut jobs: Vec<String> = jobs.collect();
    jobs.sort();
    jobs.dedup();
    jobs
}

/// gpushare's drain reason `reason`: its prefix, then `reason` as one field ([`flat`]).
pub fn reason_text(reason: &str) -> String {
    flat(&format!("{REASON_PREFIX}{reason}"))
}

/// A drain reason as one scontrol argument and one field of `scontrol -o show node`: one
/// line, no `=` (it would read as the next field), bounded.
fn flat(reason: &str) -> String {
    let flat = reason.chars().map(|c| match c {
        '=' => ':',
        c if c.is_control() => ' ',
        c => c,
    });
    flat.take(REASON_MAX).collect()
}

/// The `Key=value` fields of one `scontrol -o` line, in order (a value runs to the next
/// ` Key=`: only `Reason` and names hold spaces).
fn fields(line: &str) -> Vec<(&str, String)> {
    let mut out: Vec<(&str, String)> = Vec::new();
    for word in line.trim().split(' ') {
        let key = word
            .split_once('=')
            .map(|(k, _)| k)
            .filter(|k| !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
        match (key, out.last_mut()) {
            (Some(k), _) => out.push((k, word[k.len() + 1..].to_string())),
            (None, Some((_, value))) if !word.is_empty() => {
                value.push(' ');
                value.push_str(word);
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODE: &str = "NodeName=vm Arch=x86_64 CoresPerSocket=8  CPUAlloc=3 \
        Gres=gpu:1g.10gb:2,gpu:h100:1(S:0) NodeAddr=127.0.0.1 State=IDLE+DRAIN+DYNAMIC_NORM \
        Weight=1 Reason=gpushare: applying all-mps [root@2026-12-06T22:29:33]";

    #[test]
    fn a_node_line_reads_as_its_gres_state_and_reason() {
        let f = fields(NODE);
        let get = |k: &str| f.iter().find(|(key, _)| *key == k).map(|(_, v)| v.as_str());
        assert_eq!(get("Gres"), Some("gpu:1g.10gb:2,gpu:h100:1(S:0)"));
        assert_eq!(get("Reason"), Some("gpushare: applying all-mps [root@2026-12-06T22:29:33]"));
        let info = NodeInfo {
            gres: Gres::parse(get("Gres").unwrap()),
            state: get("State").unwrap().into(),
            reason: Some("gpushare: applying all-mps".into()),
        };
        assert!(info.dynamic() && info.drained());
        assert_eq!(info.site_drain(), None);
        let site = NodeInfo { reason: Some("bad fan".into()), ..info.clone() };
        assert_eq!(site.site_drain().as_deref(), Some("bad fan"));
        let idle = NodeInfo { state: "IDLE".into(), ..site };
        assert!(!idle.dynamic() && idle.site_drain().is_none());
    }

    #[test]
    fn jobs_hold_their_node_unless_pending_or_ended() {
        let text = "12 RUNNING\n13 PENDING\n14 STOPPED\n15 COMPLETED\n16_3 SUSPENDED\n\
                    17 COMPLETING\n18 CANCELLED\n19 RESIZING\n20+0 CONFIGURING\n\n";
        assert_eq!(jobs_holding(text), ["12", "14", "16_3", "17", "19", "20+0"]);
    }

    #[test]
    fn a_reason_is_one_bounded_field() {
        let r = reason_text("apply x failed: a=b\nnext");
        assert_eq!(r, "gpushare: apply x failed: a:b next");
        assert_eq!(reason_text(&"x".repeat(1000)).chars().count(), REASON_MAX);
    }
}
