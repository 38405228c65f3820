//! Whether an agent is starting right now: a `gpushare-agent` process begun moments ago
//! that has not yet taken its bus name. A script (or the README) that starts the agent in
//! the background and calls ctl at once should wait the few milliseconds the agent needs,
//! not be told to start the agent it just started.

use std::time::Duration;

use gpushare_base::process::Stat;

/// An agent older than this that has not taken its name is not starting: it is serving
/// another bus, or stuck.
pub const START_GRACE: Duration = Duration::from_secs(10);

/// The `AT_CLKTCK` entry of the auxiliary vector: the unit of `/proc/PID/stat`'s times.
const AT_CLKTCK: u64 = 17;

/// An agent process that began less than [`START_GRACE`] ago.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartingAgent {
    /// Its pid.
    pub pid: u32,
    /// How much of [`START_GRACE`] it has left.
    pub left: Duration,
    /// Its `--bus` argument, if it gave one.
    pub bus: Option<String>,
    /// Its user (root's default bus is the system bus, anyone else's their session bus).
    pub uid: u32,
}

/// The agents started less than [`START_GRACE`] ago. Bench replicas (`--bench-gate`,
/// `--bench-builtin`) and probe clients are agents' children, not agents.
pub fn starting_agents() -> Vec<StartingAgent> {
    use std::os::unix::fs::MetadataExt;
    let ticks_per_second = clock_ticks_per_second();
    let Some(now) = uptime_ticks(ticks_per_second) else { return Vec::new() };
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Some(stat) = Stat::of(pid) else { continue };
        if stat.comm != "gpushare-agent" || stat.ended() {
            continue;
        }
        let start = stat.start_time;
        let age = Duration::from_secs_f64(now.saturating_sub(start) as f64 / ticks_per_second);
        let Some(left) = START_GRACE.checked_sub(age) else { continue };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else { continue };
        let args: Vec<String> =
            cmdline.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
        if args.iter().any(|a| HELPER_FLAGS.iter().any(|flag| a.starts_with(flag))) {
            continue;
        }
        let Ok(uid) = entry.metadata().map(|m| m.uid()) else { continue };
        found.push(StartingAgent { pid, left, bus: bus_argument(&args), uid });
    }
    found
}

/// The flags of an agent's children (and one-shot runs) that are no agent starting.
const HELPER_FLAGS: [&str; 8] = [
    "--bench-gate",
    "--bench-builtin",
    "--probe-client",
    "--probe-run",
    "--check-",
    "--dump-nvml",
    "--stop-mps",
    "--generate-man",
];

/// The value of `--bus` in an agent's arguments (`--bus X` or `--bus=X`).
fn bus_argument(args: &[String]) -> Option<String> {
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        if arg == "--bus" {
            return args.next().cloned();
        }
        if let Some(value) = arg.strip_prefix("--bus=") {
            return Some(value.to_string());
        }
    }
    None
}

/// Whether process `pid` still runs: gpushare's one rule ([`gpushare_base::process::alive`]).
pub use gpushare_base::process::alive;

/// Now, in clock ticks since boot (`/proc/uptime`), the unit of start times.
fn uptime_ticks(ticks_per_second: f64) -> Option<u64> {
    let uptime = std::fs::read_to_string("/proc/uptime").ok()?;
    let seconds: f64 = uptime.split_whitespace().next()?.parse().ok()?;
    Some((seconds * ticks_per_second) as u64)
}

/// Clock ticks a second, from the auxiliary vector the kernel gave this process (100 on
/// every Linux this runs on, read rather than assumed).
fn clock_ticks_per_second() -> f64 {
    let auxv = std::fs::read("/proc/self/auxv").unwrap_or_default();
    let words: Vec<u64> =
        auxv.chunks_exact(8).map(|w| u64::from_ne_bytes(w.try_into().unwrap_or([0; 8]))).collect();
    words
        .chunks_exact(2)
        .find(|pair| pair[0] == AT_CLKTCK && pair[1] > 0)
        .map_or(100.0, |pair| pair[1] as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_a_name_a_start_and_a_clock() {
        let stat = Stat::of_self().expect("/proc/self/stat reads");
        assert!(!stat.comm.is_empty() && stat.start_time > 0 && !stat.ended());
        let now = uptime_ticks(100.0).unwrap();
        assert!(now >= stat.start_time, "started {} ticks after boot, now {now}", stat.start_time);
        assert_eq!(clock_ticks_per_second(), 100.0);
        assert!(alive(std::process::id()));
        assert!(!alive(u32::MAX));
    }

    #[test]
    fn the_bus_argument_is_read_in_both_spellings() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            bus_argument(&args(&["a", "--bus", "unix:path=/x"])).as_deref(),
            Some("unix:path=/x")
        );
        assert_eq!(bus_argument(&args(&["a", "--bus=session"])).as_deref(), Some("session"));
        assert_eq!(bus_argument(&args(&["a", "--simulate", "a100-40gb:1"])), None);
    }
}
