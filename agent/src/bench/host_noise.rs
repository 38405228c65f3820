//! The host's own CPU noise over a window (issue 27): how much of the replicas' CPUs'
//! time the hypervisor stole, and the CPUs' clock. Cheap and without threads: one read of
//! `/proc/stat` at the start and one at the finish, the clock read at both (and whenever
//! [`HostSampler::sample`] is called between).
//!
//! Steal is the `steal` column of `/proc/stat`'s per-CPU lines over all their time
//! columns (`user` to `steal`: `guest` and `guest_nice` are already inside `user` and
//! `nice`), percent, summed over the CPUs sampled; `None` where the kernel writes no
//! steal column. The clock is each CPU's `cpufreq/scaling_cur_freq` (kHz), or else
//! `/proc/cpuinfo`'s `cpu MHz` (a virtual machine often has only that, and it may never
//! change there).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use super::pinning::CPUS_MAX;
use crate::sys::unix;

/// The most bytes read of `/proc/stat` or `/proc/cpuinfo` (a 4096-CPU host writes about
/// 4 MiB of cpuinfo).
const PROC_FILE_MAX: u64 = 16 << 20;
/// The time columns of a `/proc/stat` CPU line up to and with `steal` (Linux 2.6.11+).
const COLUMNS_WITH_STEAL: usize = 8;
/// Where `steal` is among them.
const STEAL: usize = 7;

/// What the host did to a set of CPUs over a window.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HostNoise {
    /// The share of the CPUs' time stolen by the hypervisor, percent; `None` where the
    /// kernel does not count steal (or no time passed).
    pub steal_percent: Option<f64>,
    /// Every clock reading of the CPUs (one per CPU per sample), MHz; empty where the host
    /// says none.
    pub frequency_mhz: Vec<f64>,
}

/// A window being sampled: what `/proc/stat` said at its start, and the clock readings.
#[derive(Debug)]
pub struct HostSampler {
    root: PathBuf,
    cpus: Vec<u32>,
    start: BTreeMap<u32, Vec<u64>>,
    frequency_mhz: Vec<f64>,
}

impl HostSampler {
    /// Starts sampling `cpus` (the replicas' CPUs; empty: the agent's own, where unpinned
    /// replicas run) on this host.
    pub fn start(cpus: &[u32]) -> HostSampler {
        HostSampler::start_in(Path::new("/"), cpus)
    }

    /// [`HostSampler::start`] on the host whose `/` is `root` (tests).
    pub fn start_in(root: &Path, cpus: &[u32]) -> HostSampler {
        let mut cpus: Vec<u32> =
            if cpus.is_empty() { unix::cpu_affinity().unwrap_or_default() } else { cpus.to_vec() };
        cpus.retain(|&c| c < CPUS_MAX);
        cpus.sort_unstable();
        cpus.dedup();
        let mut sampler = HostSampler {
            root: root.to_path_buf(),
            start: BTreeMap::new(),
            frequency_mhz: Vec::new(),
            cpus,
        };
        sampler.start = sampler.stat();
        sampler.sample();
        sampler
    }

    /// Reads the CPUs' clock now (the start and the finish do too).
    pub fn sample(&mut self) {
        let mhz = self.frequencies();
        self.frequency_mhz.extend(mhz);
    }

    /// Ends the window: the steal over it and every clock reading.
    pub fn finish(mut self) -> HostNoise {
        let end = self.stat();
        self.sample();
        HostNoise {
            steal_percent: steal_percent(&self.start, &end),
            frequency_mhz: self.frequency_mhz,
        }
    }

    /// The CPUs' lines of `/proc/stat` now.
    fn stat(&self) -> BTreeMap<u32, Vec<u64>> {
        read_bounded(&self.root.join("proc/stat"))
            .map(|text| parse_stat(&text, &self.cpus))
            .unwrap_or_default()
    }

    /// The CPUs' clock now, MHz: `scaling_cur_freq` where every CPU has one, else
    /// `/proc/cpuinfo`.
    fn frequencies(&self) -> Vec<f64> {
        let cpufreq: Option<Vec<f64>> = self
            .cpus
            .iter()
            .map(|cpu| {
                let file = self
                    .root
                    .join("sys/devices/system/cpu")
                    .join(format!("cpu{cpu}"))
                    .join("cpufreq/scaling_cur_freq");
                read_bounded(&file).and_then(|text| parse_khz(&text))
            })
            .collect();
        match cpufreq {
            Some(mhz) if !mhz.is_empty() => mhz,
            _ => read_bounded(&self.root.join("proc/cpuinfo"))
                .map(|text| parse_cpuinfo_mhz(&text, &self.cpus))
                .unwrap_or_default(),
        }
    }
}

/// A file's text, at most [`PROC_FILE_MAX`] bytes of it; `None` when it cannot be read.
fn read_bounded(file: &Path) -> Option<String> {
    let mut text = String::new();
    std::fs::File::open(file)
        .and_then(|f| f.take(PROC_FILE_MAX).read_to_string(&mut text))
        .ok()
        .map(|_| text)
}

/// The time columns of `/proc/stat`'s lines `cpu<N>` for each of `cpus` there (`user nice
/// system idle iowait irq softirq steal guest guest_nice`, in clock ticks); other lines
/// and malformed ones are skipped.
pub fn parse_stat(text: &str, cpus: &[u32]) -> BTreeMap<u32, Vec<u64>> {
    let mut lines = BTreeMap::new();
    for line in text.lines() {
        let mut fields = line.split_ascii_whitespace();
        let Some(cpu) = fields
            .next()
            .and_then(|name| name.strip_prefix("cpu"))
            .and_then(|n| n.parse::<u32>().ok())
            .filter(|n| cpus.contains(n))
        else {
            continue;
        };
        let columns: Result<Vec<u64>, _> = fields.map(str::parse::<u64>).collect();
        if let Ok(columns) = columns
            && columns.len() >= 4
        {
            lines.insert(cpu, columns);
        }
    }
    lines
}

/// Steal over the time between two readings of [`parse_stat`], percent, over the CPUs in
/// both: `None` where a line has no `steal` column, or no time passed.
pub fn steal_percent(
    before: &BTreeMap<u32, Vec<u64>>,
    after: &BTreeMap<u32, Vec<u64>>,
) -> Option<f64> {
    let (mut steal, mut total) = (0u64, 0u64);
    let mut any = false;
    for (cpu, end) in after {
        let Some(start) = before.get(cpu) else { continue };
        if start.len() < COLUMNS_WITH_STEAL || end.len() < COLUMNS_WITH_STEAL {
            return None;
        }
        // A counter that went back (a CPU taken offline and back) counts nothing.
        let delta = |i: usize| end[i].saturating_sub(start[i]);
        steal += delta(STEAL);
        total += (0..COLUMNS_WITH_STEAL).map(delta).sum::<u64>();
        any = true;
    }
    // Lossless below 2^53 ticks.
    #[allow(clippy::cast_precision_loss)]
    (any && total > 0).then(|| 100.0 * steal as f64 / total as f64)
}

/// `scaling_cur_freq` (kHz) as MHz.
fn parse_khz(text: &str) -> Option<f64> {
    let khz: u64 = text.trim().parse().ok()?;
    // Lossless: a clock in kHz is far below 2^53.
    #[allow(clippy::cast_precision_loss)]
    Some(khz as f64 / 1000.0).filter(|&mhz| mhz > 0.0)
}

/// The `cpu MHz` of each of `cpus` in `/proc/cpuinfo`'s text (each `processor : N` block),
/// in the order of `cpus`; CPUs without one are left out.
pub fn parse_cpuinfo_mhz(text: &str, cpus: &[u32]) -> Vec<f64> {
    let mut mhz = BTreeMap::new();
    let mut processor = None;
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else { continue };
        match key.trim() {
            "processor" => processor = value.trim().parse::<u32>().ok(),
            "cpu MHz" => {
                if let (Some(p), Ok(v)) = (processor, value.trim().parse::<f64>())
                    && v.is_finite()
                    && v > 0.0
                {
                    mhz.insert(p, v);
                }
            }
            _ => {}
        }
    }
    cpus.iter().filter_map(|c| mhz.get(c).copied()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT_BEFORE: &str = "\
cpu  2277396 9269 483814 3004074 23782 0 5955 856 0 0
cpu0 1000 0 100 8000 0 0 0 100 50 0
cpu1 2000 0 200 7000 0 0 0 0 0 0
cpu10 1 1 1 1 1 1 1 1 1 1
intr 12345 0 0
ctxt 999
";
    const STAT_AFTER: &str = "\
cpu  2277396 9269 483814 3004074 23782 0 5955 856 0 0
cpu0 1400 0 100 8400 0 0 0 200 90 0
cpu1 2100 0 200 7900 0 0 0 0 0 0
cpu10 1 1 1 1 1 1 1 1 1 1
";

    #[test]
    fn per_cpu_lines_are_read_for_the_cpus_asked() {
        let lines = parse_stat(STAT_BEFORE, &[0, 1, 7]);
        assert_eq!(lines.keys().copied().collect::<Vec<_>>(), [0, 1]);
        assert_eq!(lines[&0], [1000, 0, 100, 8000, 0, 0, 0, 100, 50, 0]);
        assert_eq!(parse_stat(STAT_BEFORE, &[10]).len(), 1, "cpu10 is not cpu1");
        assert!(parse_stat("cpu0 1 2 x 4\ncpu1 1 2\ncpuX 1 2 3 4\n", &[0, 1]).is_empty());
    }

    #[test]
    fn steal_is_its_share_of_the_cpus_time() {
        let before = parse_stat(STAT_BEFORE, &[0]);
        let after = parse_stat(STAT_AFTER, &[0]);
        // cpu0: 400 user + 400 idle + 100 steal (guest inside user, not counted again).
        let steal = steal_percent(&before, &after).unwrap();
        assert!((steal - 100.0 / 900.0 * 100.0).abs() < 1e-9, "{steal}");
        // Over both CPUs: 100 of 1900.
        let before = parse_stat(STAT_BEFORE, &[0, 1]);
        let after = parse_stat(STAT_AFTER, &[0, 1]);
        let steal = steal_percent(&before, &after).unwrap();
        assert!((steal - 100.0 / 1900.0 * 100.0).abs() < 1e-9, "{steal}");
        // No time passed; no CPU in both; an old kernel without the column.
        assert_eq!(steal_percent(&before, &before), None);
        assert_eq!(steal_percent(&BTreeMap::new(), &after), None);
        let old = |t: &str| parse_stat(t, &[0]);
        assert_eq!(steal_percent(&old("cpu0 1 0 1 5 0 0 0\n"), &old("cpu0 2 0 2 9 0 0 0\n")), None);
        // A counter that went back counts nothing, and nothing panics.
        let back = steal_percent(&old("cpu0 9 0 9 9 0 0 0 9\n"), &old("cpu0 1 0 1 19 0 0 0 1\n"));
        assert_eq!(back, Some(0.0));
    }

    const CPUINFO: &str = "\
processor\t: 0
vendor_id\t: GenuineIntel
cpu MHz\t\t: 2400.000
flags\t\t: fpu vme

processor\t: 1
cpu MHz\t\t: 3100.5

processor\t: 2
model name\t: no clock here
";

    #[test]
    fn cpuinfo_gives_each_cpus_clock() {
        assert_eq!(parse_cpuinfo_mhz(CPUINFO, &[1, 0]), [3100.5, 2400.0]);
        assert_eq!(parse_cpuinfo_mhz(CPUINFO, &[2, 5]), Vec::<f64>::new());
        assert_eq!(parse_cpuinfo_mhz("cpu MHz : 100\n", &[0]), Vec::<f64>::new(), "no processor");
        assert_eq!(parse_khz("2400000\n"), Some(2400.0));
        assert_eq!(parse_khz("x"), None);
        assert_eq!(parse_khz("0"), None);
    }

    fn write(root: &Path, relative: &str, text: &str) {
        let path = root.join(relative);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    #[test]
    fn a_window_samples_steal_and_clock_at_both_ends() {
        let root = tempfile::tempdir().unwrap();
        write(root.path(), "proc/stat", STAT_BEFORE);
        write(root.path(), "proc/cpuinfo", CPUINFO);
        let mut sampler = HostSampler::start_in(root.path(), &[1, 0]);
        write(root.path(), "proc/cpuinfo", &CPUINFO.replace("2400.000", "2000"));
        sampler.sample();
        write(root.path(), "proc/stat", STAT_AFTER);
        let noise = sampler.finish();
        let steal = noise.steal_percent.unwrap();
        assert!((steal - 100.0 / 19.0).abs() < 1e-9, "{steal}");
        assert_eq!(noise.frequency_mhz, [2400.0, 3100.5, 2000.0, 3100.5, 2000.0, 3100.5]);
        // cpufreq, where every CPU has it, comes first.
        for (cpu, khz) in [(0, "1500000\n"), (1, "1600000\n")] {
            write(
                root.path(),
                &format!("sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_cur_freq"),
                khz,
            );
        }
        let noise = HostSampler::start_in(root.path(), &[0, 1]).finish();
        assert_eq!(noise.frequency_mhz, [1500.0, 1600.0, 1500.0, 1600.0]);
        assert_eq!(noise.steal_percent, None, "no time passed");
        // A host that says nothing.
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(HostSampler::start_in(empty.path(), &[0]).finish(), HostNoise::default());
    }

    #[test]
    fn this_host_can_be_sampled() {
        let sampler = HostSampler::start(&[]);
        assert!(!sampler.cpus.is_empty(), "the agent's CPUs");
        std::thread::sleep(std::time::Duration::from_millis(50));
        let noise = sampler.finish();
        if let Some(steal) = noise.steal_percent {
            assert!((0.0..=100.0).contains(&steal), "{steal}");
        }
        assert!(noise.frequency_mhz.iter().all(|&f| f > 0.0));
    }
}
