//! Which CPUs a bench's replicas run on (issue 27): every replica pinned to a set of its
//! own, disjoint from the others', the same set for replica `i` in every run, strategy and
//! repeat, so that the host's drift cannot favour one side (see DESIGN.md, "Pinning").
//!
//! [`available`] finds the CPUs to divide: the agent's own (`sched_getaffinity`), narrowed
//! to the GPU's NUMA node where the host has more than one. [`plan`] divides them:
//! `k = CPUs / the most replicas of the bench` each, hyperthread siblings kept together so
//! that a replica of two CPUs gets one whole core (and with one CPU each, one thread of
//! every core first). The gate applies a replica's set to itself before it starts the
//! command ([`super::gate`]), so the command and all it starts inherit it.
//!
//! [`CpuList`] reads and writes Linux CPU lists (`0-3,8,10-11`) as `--cpus` and sysfs
//! write them.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use gpushare_base::cpus::{self, CpuListError};
use gpushare_proto::bench::BenchPinning;

use crate::sys::unix;

/// The most CPUs a list may name: every CPU number is below it.
pub use gpushare_base::cpus::CPUS_MAX;
/// The longest CPU list read (every CPU below [`CPUS_MAX`] named singly takes 19 KiB).
pub const LIST_MAX: usize = 32 << 10;
/// Where the CPUs come from when nothing narrows the agent's own.
pub const AGENTS_CPUS: &str = "the agent's CPUs";

/// A set of CPUs as a Linux CPU list names it: in increasing order, each once, every
/// number below [`CPUS_MAX`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CpuList(Vec<u32>);

impl CpuList {
    /// The set of `cpus` (in any order; repeats count once). A number of [`CPUS_MAX`] or
    /// more is a one-line error.
    pub fn of(cpus: &[u32]) -> Result<CpuList, String> {
        if let Some(&cpu) = cpus.iter().find(|&&c| c >= CPUS_MAX) {
            return Err(format!("cpus: {}", beyond(&cpu.to_string())));
        }
        let set: BTreeSet<u32> = cpus.iter().copied().collect();
        Ok(CpuList(set.into_iter().collect()))
    }

    /// Reads a CPU list: numbers and ranges joined by commas (`0-3,8,10-11`), spaces and a
    /// final newline allowed, as sysfs writes them and users type them; empty text is the
    /// empty set. An error is one line naming `cpus`.
    pub fn parse(text: &str) -> Result<CpuList, String> {
        if text.len() > LIST_MAX {
            return Err(format!(
                "cpus: a list of {} bytes, more than the {LIST_MAX} allowed",
                text.len()
            ));
        }
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Ok(CpuList::default());
        }
        let shown = match gpushare_proto::byte_prefix(trimmed, 60) {
            whole if whole.len() == trimmed.len() => whole.to_string(),
            start => format!("{start}…"),
        };
        match cpus::parse_cpu_list(trimmed) {
            Ok(list) => Ok(CpuList(list)),
            Err(CpuListError::NotANumber { part }) => {
                let part = gpushare_proto::byte_prefix(&part, 40).to_string();
                Err(format!("cpus `{shown}`: {}", CpuListError::NotANumber { part }))
            }
            Err(CpuListError::Beyond { number }) => {
                Err(format!("cpus `{shown}`: {}", beyond(&number)))
            }
            Err(backwards) => Err(format!("cpus `{shown}`: {backwards}")),
        }
    }

    /// The CPUs, in increasing order.
    pub fn cpus(&self) -> &[u32] {
        &self.0
    }

    /// How many.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether it names none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Why a CPU number is refused.
fn beyond(number: &str) -> String {
    let number = gpushare_proto::byte_prefix(number, 20);
    format!("CPU {number} is beyond the {CPUS_MAX} CPUs gpushare pins to (0-{})", CPUS_MAX - 1)
}

impl FromStr for CpuList {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        CpuList::parse(s)
    }
}

/// The canonical form: runs of consecutive CPUs as ranges (`0-3,8,10-11`), as the kernel
/// writes them; the empty set is empty text.
impl fmt::Display for CpuList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&cpus::write_cpu_list(&self.0))
    }
}

/// `cpus` (in any order, repeats once) as a canonical CPU list.
pub fn format_cpus(cpus: &[u32]) -> String {
    cpus::write_cpu_list(cpus)
}

/// How the replicas are pinned: replica `i` runs on `replicas[i]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pinning {
    /// Every CPU divided among the replicas, in increasing order.
    pub cpus: Vec<u32>,
    /// Where they come from, for people: `--cpus`, `NUMA node 1 of the GPU`, ...
    pub from: String,
    /// CPUs each replica gets.
    pub per_replica: u32,
    /// Replica `i`'s CPUs (the baseline runs on replica 0's), disjoint.
    pub replicas: Vec<Vec<u32>>,
}

impl Pinning {
    /// Replica `index`'s CPUs; `None` beyond the most replicas planned for.
    pub fn replica(&self, index: usize) -> Option<&[u32]> {
        self.replicas.get(index).map(Vec::as_slice)
    }

    /// As the report shows it.
    pub fn to_proto(&self) -> BenchPinning {
        BenchPinning {
            cpus: format_cpus(&self.cpus),
            from: self.from.clone(),
            cpus_per_replica: self.per_replica,
            replicas: self.replicas.iter().map(|r| format_cpus(r)).collect(),
        }
    }
}

impl From<&Pinning> for BenchPinning {
    fn from(pinning: &Pinning) -> BenchPinning {
        pinning.to_proto()
    }
}

/// Divides `cpus` (from `from`, said in the refusal) among at most `max_replicas`
/// replicas: `k = cpus / max_replicas` each, disjoint, replica `i` taking places
/// `i*k..(i+1)*k` of the CPUs in plan order, whatever the number of replicas of a run.
/// Plan order follows this host's cores (its sysfs `thread_siblings_list`): siblings next
/// to each other, so that `k = 2` on a host of two threads a core is one whole core; with
/// `k = 1` one thread of each core first, so that replicas share a core only once every
/// core has one. Fewer CPUs than replicas is the one-line refusal the user reads.
pub fn plan(cpus: &[u32], from: &str, max_replicas: u32) -> Result<Pinning, String> {
    let topology = Topology::read(Path::new("/"), cpus);
    plan_with(cpus, from, max_replicas, &topology)
}

/// [`plan`] on the cores `topology` says.
pub fn plan_with(
    cpus: &[u32],
    from: &str,
    max_replicas: u32,
    topology: &Topology,
) -> Result<Pinning, String> {
    let set = CpuList::of(cpus)?;
    let n = set.len();
    if max_replicas == 0 {
        return Err("no replicas to pin".into());
    }
    if n == 0 {
        return Err(format!("no CPUs to pin the replicas to ({from}): give --cpus, or --no-pin"));
    }
    let max = max_replicas as usize;
    if max > n {
        let (cpus_are, it) = if n == 1 { ("CPU", "is") } else { ("CPUs", "are") };
        return Err(format!(
            "{max} replicas need {max} CPUs to pin one each; {cpus_are} {set} ({from}) {it} {n}: \
             give --replicas up to {n}, --cpus with more, or --no-pin"
        ));
    }
    let k = n / max;
    let cores = topology.cores(set.cpus());
    let order: Vec<u32> = if k == 1 { spread(&cores) } else { cores.concat() };
    let replicas = order.chunks_exact(k).take(max).map(<[u32]>::to_vec).collect();
    Ok(Pinning {
        cpus: set.cpus().to_vec(),
        from: from.to_string(),
        per_replica: u32::try_from(k).unwrap_or(u32::MAX),
        replicas,
    })
}

/// One thread of every core, then the second of every core that has one, and so on.
fn spread(cores: &[Vec<u32>]) -> Vec<u32> {
    let deepest = cores.iter().map(Vec::len).max().unwrap_or(0);
    (0..deepest).flat_map(|t| cores.iter().filter_map(move |core| core.get(t).copied())).collect()
}

/// The hyperthread siblings of CPUs, as a host's sysfs says
/// (`sys/devices/system/cpu/cpuN/topology/thread_siblings_list`); a CPU it says nothing of
/// is a core of its own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Topology {
    siblings: BTreeMap<u32, Vec<u32>>,
}

impl Topology {
    /// The siblings of each of `cpus` under `sys_root` (`/` on a host: replicas are real
    /// processes, whatever the GPUs are).
    pub fn read(sys_root: &Path, cpus: &[u32]) -> Topology {
        let mut siblings = BTreeMap::new();
        for &cpu in cpus.iter().filter(|&&c| c < CPUS_MAX) {
            let file = sys_root
                .join("sys/devices/system/cpu")
                .join(format!("cpu{cpu}"))
                .join("topology/thread_siblings_list");
            if let Some(list) = read_list(&file) {
                siblings.insert(cpu, list.0);
            }
        }
        Topology { siblings }
    }

    /// `cpus` grouped by core: each core's CPUs of `cpus` in increasing order, the cores
    /// in the order of their lowest CPU.
    pub fn cores(&self, cpus: &[u32]) -> Vec<Vec<u32>> {
        let set: BTreeSet<u32> = cpus.iter().copied().collect();
        let mut placed = BTreeSet::new();
        let mut cores = Vec::new();
        for &cpu in &set {
            if placed.contains(&cpu) {
                continue;
            }
            let mut core: BTreeSet<u32> = self
                .siblings
                .get(&cpu)
                .into_iter()
                .flatten()
                .copied()
                .filter(|c| set.contains(c) && !placed.contains(c))
                .collect();
            core.insert(cpu);
            placed.extend(core.iter().copied());
            cores.push(core.into_iter().collect());
        }
        cores
    }

    /// `cpus` with siblings next to each other (core after core).
    pub fn sibling_order(&self, cpus: &[u32]) -> Vec<u32> {
        self.cores(cpus).concat()
    }
}

/// The CPUs the agent may give its replicas, in sibling order ([`Topology`] of this host),
/// and where they come from, for people: the agent's own (`sched_getaffinity`), narrowed
/// to the GPU's NUMA node where the host (`host_root`, agent.toml's: the simulated one
/// under `--simulate`) has more than one node and the GPU's PCI function (`pci_bus_id` as
/// NVML writes it, `00000000:1B:00.0`) names its local CPUs. Where the node's CPUs and the
/// agent's do not meet, the agent's, and `from` says why.
pub fn available(host_root: &Path, pci_bus_id: Option<&str>) -> Result<(Vec<u32>, String), String> {
    let own =
        unix::cpu_affinity().map_err(|e| format!("the agent's CPUs (sched_getaffinity): {e}"))?;
    let own: Vec<u32> = own.into_iter().filter(|&c| c < CPUS_MAX).collect();
    let (cpus, from) = on_gpu_node(&own, host_root, pci_bus_id);
    let topology = Topology::read(Path::new("/"), &cpus);
    Ok((topology.sibling_order(&cpus), from))
}

/// `own` narrowed to the GPU's NUMA node as `host_root` shows it, and where they come
/// from (see [`available`]).
pub fn on_gpu_node(own: &[u32], host_root: &Path, pci_bus_id: Option<&str>) -> (Vec<u32>, String) {
    let own = CpuList::of(own).unwrap_or_default().0;
    let agents = |why: &str| (own.clone(), format!("{AGENTS_CPUS} ({why})"));
    // One node (or no NUMA in sysfs at all): nothing to narrow.
    let nodes = read_list(&host_root.join("sys/devices/system/node/online"));
    if nodes.is_none_or(|n| n.len() <= 1) {
        return (own.clone(), AGENTS_CPUS.to_string());
    }
    let Some(dir) = pci_bus_id.and_then(|id| pci_dir(host_root, id)) else {
        return agents("the GPU's NUMA node is unknown");
    };
    let node = std::fs::read_to_string(dir.join("numa_node"))
        .ok()
        .and_then(|t| t.trim().parse::<i64>().ok());
    if node.is_some_and(|n| n < 0) {
        return agents("the GPU has no NUMA node");
    }
    let Some(local) = read_list(&dir.join("local_cpulist")).filter(|l| !l.is_empty()) else {
        return agents("the GPU's NUMA node is unknown");
    };
    let name = node
        .map_or_else(|| "the GPU's NUMA node".to_string(), |n| format!("NUMA node {n} of the GPU"));
    let mine: Vec<u32> = own.iter().copied().filter(|c| local.0.contains(c)).collect();
    if mine.is_empty() {
        return agents(&format!("none of them is on {name}, CPUs {local}"));
    }
    (mine, name)
}

/// The sysfs directory of the PCI function NVML names `bus_id` (`00000000:1B:00.0` is
/// `sys/bus/pci/devices/0000:1b:00.0`; sysfs writes the domain with at least 4 digits), as
/// the reset blockers find it; `None` for anything that is no bus id.
fn pci_dir(host_root: &Path, bus_id: &str) -> Option<PathBuf> {
    let (domain, rest) = bus_id.trim().split_once(':')?;
    let domain = u32::from_str_radix(domain, 16).ok()?;
    let plain = !rest.is_empty()
        && rest.len() <= 16
        && rest.chars().all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.');
    if !plain {
        return None;
    }
    let name = format!("{domain:04x}:{}", rest.to_ascii_lowercase());
    Some(host_root.join("sys/bus/pci/devices").join(name))
}

/// A CPU list read from `file`; `None` when it cannot be read or is no CPU list.
fn read_list(file: &Path) -> Option<CpuList> {
    use std::io::Read;
    let mut text = String::new();
    let read = std::fs::File::open(file)
        .and_then(|f| f.take(LIST_MAX as u64 + 1).read_to_string(&mut text));
    read.ok().and_then(|_| CpuList::parse(&text).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(text: &str) -> Vec<u32> {
        CpuList::parse(text).unwrap().0
    }

    #[test]
    fn cpu_lists_read_as_linux_writes_them() {
        assert_eq!(list("0-3,8,10-11\n"), [0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(list(" 5 , 1-2 "), [1, 2, 5]);
        assert_eq!(list("3,3,2-4"), [2, 3, 4]);
        assert_eq!(list(""), Vec::<u32>::new());
        assert_eq!(list("\n"), Vec::<u32>::new());
        assert_eq!(list("4095"), [4095]);
        assert_eq!(list("0-4095").len(), 4096);
        let every: Vec<String> = (0..CPUS_MAX).map(|c| c.to_string()).collect();
        assert_eq!(list(&every.join(",")).len(), 4096);
    }

    #[test]
    fn odd_cpu_lists_are_one_line_errors_naming_cpus() {
        for (text, says) in [
            ("0-3,x", "`x` is not a CPU number or range"),
            ("1,,2", "`` is not a CPU number"),
            ("-3", "`-3` is not a CPU number"),
            ("3-", "`3-` is not a CPU number"),
            ("1-2-3", "`1-2-3` is not a CPU number"),
            ("+1", "`+1` is not"),
            ("0x1", "`0x1` is not"),
            ("1 2", "`1 2` is not"),
            ("5-2", "`5-2` runs backwards"),
            ("4096", "CPU 4096 is beyond the 4096 CPUs"),
            ("0-99999999999999999999", "CPU 99999999999999999999 is beyond"),
            ("0-15:2/4", "is not a CPU number"),
            ("é", "is not a CPU number"),
        ] {
            let e = CpuList::parse(text).unwrap_err();
            assert!(e.starts_with("cpus"), "{text}: {e}");
            assert!(e.contains(says), "{text}: {e}");
            assert!(!e.contains('\n'), "{text}: {e}");
        }
        let long = "1,".repeat(LIST_MAX);
        let e = CpuList::parse(&long).unwrap_err();
        assert!(e.starts_with("cpus: a list of 65536 bytes, more than the 32768"), "{e}");
        // What is shown of a long list is cut.
        let e = CpuList::parse(&format!("{}x", "1,".repeat(1000))).unwrap_err();
        assert!(e.len() < 200, "{e}");
        assert!(CpuList::of(&[1, 4096]).unwrap_err().starts_with("cpus: CPU 4096 is beyond"));
    }

    #[test]
    fn cpu_lists_are_written_canonically() {
        for (text, canonical) in [
            ("0-3,8,10-11", "0-3,8,10-11"),
            ("3,2,1,0", "0-3"),
            ("0,1", "0-1"),
            ("7", "7"),
            ("", ""),
            ("0-2,3-5,9,8", "0-5,8-9"),
        ] {
            let parsed = CpuList::parse(text).unwrap();
            assert_eq!(parsed.to_string(), canonical, "{text}");
            assert_eq!(canonical.parse::<CpuList>().unwrap(), parsed, "round trip of {text}");
        }
        assert_eq!(format_cpus(&[4, 0, 5, 1]), "0-1,4-5");
        assert_eq!(CpuList::of(&[9, 8, 8]).unwrap().to_string(), "8-9");
    }

    /// A fake sysfs: `siblings` per CPU.
    fn fake_topology(siblings: &[(u32, &str)]) -> (tempfile::TempDir, Topology) {
        let dir = tempfile::tempdir().unwrap();
        for (cpu, list) in siblings {
            let topo = dir.path().join(format!("sys/devices/system/cpu/cpu{cpu}/topology"));
            std::fs::create_dir_all(&topo).unwrap();
            std::fs::write(topo.join("thread_siblings_list"), format!("{list}\n")).unwrap();
        }
        let cpus: Vec<u32> = siblings.iter().map(|(c, _)| *c).collect();
        let topology = Topology::read(dir.path(), &cpus);
        (dir, topology)
    }

    /// Four cores of two threads, siblings 4 apart (as most x86 hosts number them).
    fn four_cores_two_threads() -> (tempfile::TempDir, Topology) {
        fake_topology(&[
            (0, "0,4"),
            (1, "1,5"),
            (2, "2,6"),
            (3, "3,7"),
            (4, "0,4"),
            (5, "1,5"),
            (6, "2,6"),
            (7, "3,7"),
        ])
    }

    #[test]
    fn siblings_are_kept_together() {
        let (_dir, topology) = four_cores_two_threads();
        let all: Vec<u32> = (0..8).collect();
        assert_eq!(topology.sibling_order(&all), [0, 4, 1, 5, 2, 6, 3, 7]);
        assert_eq!(topology.cores(&[5, 1, 2]), [vec![1, 5], vec![2]]);
        // Two CPUs each: one whole core each.
        let p = plan_with(&all, "NUMA node 0 of the GPU", 4, &topology).unwrap();
        assert_eq!(p.per_replica, 2);
        assert_eq!(p.replicas, [vec![0, 4], vec![1, 5], vec![2, 6], vec![3, 7]]);
        // One CPU each: a core each first, siblings only once every core has one.
        let p = plan_with(&all, "x", 8, &topology).unwrap();
        assert_eq!(p.replicas, [[0], [1], [2], [3], [4], [5], [6], [7]]);
        let p = plan_with(&all, "x", 5, &topology).unwrap();
        assert_eq!(p.per_replica, 1);
        assert_eq!(p.replicas, [[0], [1], [2], [3], [4]]);
        // Siblings numbered next to each other, and a host without SMT.
        let (_dir, adjacent) = fake_topology(&[(0, "0-1"), (1, "0-1"), (2, "2-3"), (3, "2-3")]);
        let p = plan_with(&[0, 1, 2, 3], "x", 2, &adjacent).unwrap();
        assert_eq!(p.replicas, [vec![0, 1], vec![2, 3]]);
        let p = plan_with(&[0, 1, 2, 3], "x", 2, &Topology::default()).unwrap();
        assert_eq!(p.replicas, [vec![0, 1], vec![2, 3]]);
        // A sysfs that says nothing (or nonsense) of a CPU leaves it a core of its own.
        let (_dir, partial) = fake_topology(&[(0, "0,2"), (1, "garbage")]);
        assert_eq!(partial.sibling_order(&[0, 1, 2]), [0, 2, 1]);
    }

    #[test]
    fn a_replica_keeps_its_set_whatever_the_run() {
        let (_dir, topology) = four_cores_two_threads();
        let all: Vec<u32> = (0..8).collect();
        let p = plan_with(&all, "x", 3, &topology).unwrap();
        // 8 / 3 = 2 each; two CPUs left over.
        assert_eq!(p.per_replica, 2);
        assert_eq!(p.replicas.len(), 3);
        assert_eq!(p.replica(0), Some(&[0, 4][..]));
        assert_eq!(p.replica(2), Some(&[2, 6][..]));
        assert_eq!(p.replica(3), None);
        let all_sets: Vec<u32> = p.replicas.concat();
        let distinct: BTreeSet<u32> = all_sets.iter().copied().collect();
        assert_eq!(distinct.len(), all_sets.len(), "disjoint");
        let shown = p.to_proto();
        assert_eq!(shown.cpus, "0-7");
        assert_eq!(shown.cpus_per_replica, 2);
        assert_eq!(shown.replicas, ["0,4", "1,5", "2,6"]);
        assert_eq!(shown.from, "x");
        // The order the CPUs are given in does not matter.
        let mut shuffled = all.clone();
        shuffled.reverse();
        assert_eq!(plan_with(&shuffled, "x", 3, &topology).unwrap(), p);
    }

    #[test]
    fn too_many_replicas_are_refused_in_one_line() {
        let e = plan_with(&[0, 1, 2, 3], "NUMA node 0 of the GPU", 7, &Topology::default())
            .unwrap_err();
        assert_eq!(
            e,
            "7 replicas need 7 CPUs to pin one each; CPUs 0-3 (NUMA node 0 of the GPU) are 4: \
             give --replicas up to 4, --cpus with more, or --no-pin"
        );
        let e = plan_with(&[3], "--cpus", 2, &Topology::default()).unwrap_err();
        assert!(e.contains("; CPU 3 (--cpus) is 1: give --replicas up to 1"), "{e}");
        assert!(plan_with(&[], "--cpus", 1, &Topology::default()).unwrap_err().contains("no CPUs"));
        assert!(plan_with(&[0], "x", 0, &Topology::default()).is_err());
        assert!(plan_with(&[0, 5000], "x", 1, &Topology::default()).unwrap_err().contains("4096"));
        let p = plan_with(&[6], "x", 1, &Topology::default()).unwrap();
        assert_eq!(p.replicas, [vec![6]]);
    }

    /// A fake host root: `online` nodes, and the GPU `0000:1b:00.0`'s node and CPUs.
    fn fake_host(
        online: Option<&str>,
        node: Option<&str>,
        local: Option<&str>,
    ) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let write = |relative: &str, text: &str| {
            let path = dir.path().join(relative);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, format!("{text}\n")).unwrap();
        };
        if let Some(online) = online {
            write("sys/devices/system/node/online", online);
        }
        if let Some(node) = node {
            write("sys/bus/pci/devices/0000:1b:00.0/numa_node", node);
        }
        if let Some(local) = local {
            write("sys/bus/pci/devices/0000:1b:00.0/local_cpulist", local);
        }
        dir
    }

    const GPU: Option<&str> = Some("00000000:1B:00.0");

    #[test]
    fn the_gpus_numa_node_narrows_the_agents_cpus() {
        let own: Vec<u32> = (0..8).collect();
        let host = fake_host(Some("0-1"), Some("1"), Some("4-7"));
        assert_eq!(
            on_gpu_node(&own, host.path(), GPU),
            (vec![4, 5, 6, 7], "NUMA node 1 of the GPU".into())
        );
        // The bus id as NVML writes it, or as sysfs does.
        assert_eq!(on_gpu_node(&own, host.path(), Some("0000:1b:00.0")).0, [4, 5, 6, 7]);
        // Only those of the agent's.
        assert_eq!(on_gpu_node(&[0, 1, 5], host.path(), GPU).0, [5]);
        // None of the agent's on the node: the agent's, saying why.
        let (cpus, from) = on_gpu_node(&[0, 1], host.path(), GPU);
        assert_eq!(cpus, [0, 1]);
        assert_eq!(from, "the agent's CPUs (none of them is on NUMA node 1 of the GPU, CPUs 4-7)");
        // Without numa_node, the node's CPUs all the same.
        let host = fake_host(Some("0-1"), None, Some("4-7"));
        assert_eq!(
            on_gpu_node(&own, host.path(), GPU),
            (vec![4, 5, 6, 7], "the GPU's NUMA node".into())
        );
    }

    #[test]
    fn one_node_or_an_unknown_one_leaves_the_agents_cpus() {
        let own = [0, 1, 2, 3];
        let whole = (own.to_vec(), AGENTS_CPUS.to_string());
        // One node (the simulator without its knob writes none at all).
        assert_eq!(
            on_gpu_node(&own, fake_host(Some("0"), Some("0"), Some("0-1")).path(), GPU),
            whole
        );
        assert_eq!(on_gpu_node(&own, fake_host(None, None, None).path(), GPU), whole);
        let two = |node, local| fake_host(Some("0-1"), node, local);
        let because = |why: &str| (own.to_vec(), format!("the agent's CPUs ({why})"));
        assert_eq!(
            on_gpu_node(&own, two(Some("0"), Some("0-1")).path(), None),
            because("the GPU's NUMA node is unknown")
        );
        assert_eq!(
            on_gpu_node(&own, two(Some("-1"), Some("0-3")).path(), GPU),
            because("the GPU has no NUMA node")
        );
        assert_eq!(
            on_gpu_node(&own, two(Some("0"), None).path(), GPU),
            because("the GPU's NUMA node is unknown")
        );
        assert_eq!(
            on_gpu_node(&own, two(Some("0"), Some("")).path(), GPU),
            because("the GPU's NUMA node is unknown")
        );
        assert_eq!(
            on_gpu_node(&own, two(Some("0"), Some("junk")).path(), GPU),
            because("the GPU's NUMA node is unknown")
        );
        // A bus id that is none never leaves the PCI directory.
        for bad in ["../../../etc", "0000:../x", "zz:1b:00.0", ""] {
            assert_eq!(
                on_gpu_node(&own, two(Some("0"), Some("0")).path(), Some(bad)),
                because("the GPU's NUMA node is unknown"),
                "{bad}"
            );
        }
    }

    #[test]
    fn the_simulated_numa_host_reads_as_a_real_one() {
        use gpushare_sim_nvml::node::Node;
        let dir = tempfile::tempdir().unwrap();
        let mut node = Node::new(&crate::catalog::parse_node_spec("a100-40gb:2").unwrap());
        let own = [0, 1, 2, 3];
        gpushare_sim_nvml::host::render(dir.path(), &node).unwrap();
        assert_eq!(on_gpu_node(&own, dir.path(), GPU), (own.to_vec(), AGENTS_CPUS.into()));
        // GPUSHARE_SIM_HOST=numa:1=1: GPU 1 (00000000:1C:00.0) is local to CPU 1.
        node.host.numa.insert(1, "1".into());
        gpushare_sim_nvml::host::render(dir.path(), &node).unwrap();
        let gpu1 = Some("00000000:1C:00.0");
        assert_eq!(on_gpu_node(&own, dir.path(), gpu1), (vec![1], "NUMA node 0 of the GPU".into()));
        let (cpus, from) = on_gpu_node(&own, dir.path(), GPU);
        assert_eq!(
            (cpus, from.as_str()),
            (own.to_vec(), "the agent's CPUs (the GPU's NUMA node is unknown)")
        );
    }

    #[test]
    fn the_agents_cpus_are_available_here() {
        let (cpus, from) = available(Path::new("/nonexistent"), GPU).unwrap();
        assert!(!cpus.is_empty());
        assert_eq!(from, AGENTS_CPUS);
        let own = unix::cpu_affinity().unwrap();
        let set: BTreeSet<u32> = cpus.iter().copied().collect();
        assert_eq!(set, own.iter().copied().collect::<BTreeSet<u32>>());
    }
}
