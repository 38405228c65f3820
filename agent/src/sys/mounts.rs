//! What the agent's mounts say about what a process's owner, or anyone else, may see and
//! name (issue 36, finding 6), from `/proc/self/mountinfo`: the options of the agent's
//! `/proc` (`hidepid=`, its `gid=` exemption, `subset=pid`), and where each cgroup
//! hierarchy is mounted, so that the components of a cgroup path that root named (made in
//! a directory only root may write: systemd's, or a container runtime's running as root)
//! are told from those a delegate named for itself (`user@UID.service` and what is below
//! it belong to that user, who may call a cgroup `sshd.service` or `docker-<id>.scope`).

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

/// The most bytes of `/proc/self/mountinfo` read (a host with tens of thousands of mounts
/// has a few MiB); past that the mounts read as unknown.
const MOUNTINFO_MAX: u64 = 16 << 20;

/// `/proc`'s `hidepid=`: which processes of others a user may see there (proc(5)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HidePid {
    /// `0`, `off`: every process's directory may be read (within its files' own modes).
    Off,
    /// `1`, `noaccess`: others' directories are listed but cannot be read.
    NoAccess,
    /// `2`, `invisible`: others' directories are not even listed.
    Invisible,
    /// `4`, `ptraceable`: only processes the user may ptrace are listed; `gid=` exempts
    /// no one.
    Ptraceable,
}

/// The options of a `/proc` mount that decide what a user sees of others' processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcMount {
    /// `hidepid=`.
    pub hidepid: HidePid,
    /// `gid=`: the group whose members see every process as with `hidepid=off` (not under
    /// `ptraceable`).
    pub gid: Option<u32>,
    /// `subset=pid`: nothing but the process directories (changes nothing of what a user
    /// sees of processes).
    pub subset_pid: bool,
}

impl ProcMount {
    /// A `/proc` that hides nothing.
    pub const PLAIN: ProcMount = ProcMount { hidepid: HidePid::Off, gid: None, subset_pid: false };
    /// What is assumed when the agent's `/proc` mount cannot be read: the strictest.
    pub const UNKNOWN: ProcMount =
        ProcMount { hidepid: HidePid::Invisible, gid: None, subset_pid: false };

    /// Whether a user whose groups are `groups` (`None`: not known) may read no other
    /// user's process there: `hidepid` is on and they are not in its `gid=` group.
    pub fn hides_others_from(&self, groups: Option<&[u32]>) -> bool {
        match self.hidepid {
            HidePid::Off => false,
            HidePid::Ptraceable => true,
            HidePid::NoAccess | HidePid::Invisible => {
                !self.gid.is_some_and(|gid| groups.is_some_and(|g| g.contains(&gid)))
            }
        }
    }

    /// The options of a mount (`rw,relatime,hidepid=invisible,gid=27`); an option value it
    /// does not know reads as the strictest.
    fn parse(options: &str) -> ProcMount {
        let mut mount = ProcMount::PLAIN;
        for option in options.split(',') {
            match option.split_once('=') {
                Some(("hidepid", value)) => {
                    mount.hidepid = match value {
                        "0" | "off" => HidePid::Off,
                        "1" | "noaccess" => HidePid::NoAccess,
                        "4" | "ptraceable" => HidePid::Ptraceable,
                        _ => HidePid::Invisible,
                    }
                }
                Some(("gid", value)) => mount.gid = value.parse().ok(),
                Some(("subset", "pid")) => mount.subset_pid = true,
                _ => {}
            }
        }
        mount
    }
}

/// One cgroup hierarchy's mount.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CgroupMount {
    /// Whether it is the unified (v2) hierarchy.
    unified: bool,
    /// Its super options besides `rw`, among them its controllers as `/proc/PID/cgroup`
    /// names them (`cpu`, `cpuacct`, `name=systemd`).
    controllers: Vec<String>,
    /// The cgroup mounted there (`/` unless the mount shows part of the hierarchy).
    root: String,
    /// Where.
    point: PathBuf,
}

/// Where the cgroup hierarchies are mounted, and who names cgroups there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupMounts {
    mounts: Vec<CgroupMount>,
    /// The owner whose directories' entries are believed: root.
    owner: u32,
}

impl CgroupMounts {
    /// The hierarchies mounted under `point`s, as if `owner` were root (tests).
    #[cfg(test)]
    pub fn for_tests(unified: &std::path::Path, owner: u32) -> CgroupMounts {
        let mount = CgroupMount {
            unified: true,
            controllers: Vec::new(),
            root: "/".into(),
            point: unified.to_owned(),
        };
        CgroupMounts { mounts: vec![mount], owner }
    }

    /// The mount of the hierarchy of `controllers` (see [`CgroupMounts::named_by_root`]).
    fn mount_of(&self, controllers: &str) -> Option<&CgroupMount> {
        let wanted: Vec<&str> = controllers.split(',').filter(|c| !c.is_empty()).collect();
        self.mounts.iter().find(|m| match wanted.is_empty() {
            true => m.unified,
            false => !m.unified && wanted.iter().all(|c| m.controllers.iter().any(|m| m == c)),
        })
    }

    /// How many leading components of `path`, the cgroup of hierarchy `controllers` (as a
    /// `/proc/PID/cgroup` line has them: `cpu,cpuacct`, `name=systemd`, empty for the
    /// unified one), root named: each is an entry of a directory that root owns (and cgroup
    /// directories cannot be written by anyone but their owner). The first directory that
    /// another user owns is a delegation: its own name is root's, its entries its owner's.
    /// Nothing is believed of a hierarchy that is not mounted, or mounted from below its
    /// root (a container's view), or of a directory that cannot be looked at.
    pub fn named_by_root(&self, controllers: &str, path: &str) -> usize {
        let Some(mount) = self.mount_of(controllers) else { return 0 };
        if mount.root != "/" {
            return 0;
        }
        let mut dir = mount.point.clone();
        let mut named = 0;
        for component in path.split('/').filter(|c| !c.is_empty()) {
            match std::fs::symlink_metadata(&dir) {
                Ok(m) if m.is_dir() && m.uid() == self.owner => {}
                _ => break,
            }
            named += 1;
            dir.push(component);
        }
        named
    }
}

/// What the agent's mounts say (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mounts {
    /// The agent's `/proc` ([`ProcMount::UNKNOWN`] when it is not found).
    pub proc: ProcMount,
    /// The cgroup hierarchies.
    pub cgroups: CgroupMounts,
}

impl Mounts {
    /// The agent's mounts now; a `/proc/self/mountinfo` that cannot be read shows no cgroup
    /// hierarchy and a `/proc` of [`ProcMount::UNKNOWN`].
    pub fn read() -> Mounts {
        use std::io::Read;
        let mut text = String::new();
        let read = std::fs::File::open("/proc/self/mountinfo")
            .and_then(|f| f.take(MOUNTINFO_MAX).read_to_string(&mut text));
        match read {
            Ok(n) if (n as u64) < MOUNTINFO_MAX => Mounts::parse(&text),
            _ => Mounts::parse(""),
        }
    }

    /// The mounts of a `mountinfo` text: the last `/proc` mount (the one on top), and every
    /// `cgroup` and `cgroup2` mount.
    pub fn parse(text: &str) -> Mounts {
        let mut proc = None;
        let mut mounts = Vec::new();
        for line in text.lines() {
            // ID PARENT MAJ:MIN ROOT MOUNT-POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER
            let Some((before, after)) = line.split_once(" - ") else { continue };
            let fields: Vec<&str> = before.split(' ').collect();
            let after: Vec<&str> = after.split(' ').collect();
            let (Some(root), Some(point), Some(kind)) =
                (fields.get(3), fields.get(4), after.first())
            else {
                continue;
            };
            let point = unescape(point);
            let options = after.get(2).copied().unwrap_or_default();
            match *kind {
                "proc" if point == "/proc" => {
                    // Older kernels show hidepid= among the mount's own options.
                    let all = format!("{},{options}", fields.get(5).copied().unwrap_or_default());
                    proc = Some(ProcMount::parse(&all));
                }
                "cgroup2" => mounts.push(CgroupMount {
                    unified: true,
                    controllers: Vec::new(),
                    root: unescape(root),
                    point: PathBuf::from(point),
                }),
                "cgroup" => mounts.push(CgroupMount {
                    unified: false,
                    // `rw`, flags (`xattr`), the controllers or `name=...`.
                    controllers: options.split(',').map(str::to_string).collect(),
                    root: unescape(root),
                    point: PathBuf::from(point),
                }),
                _ => {}
            }
        }
        Mounts {
            proc: proc.unwrap_or(ProcMount::UNKNOWN),
            cgroups: CgroupMounts { mounts, owner: 0 },
        }
    }
}

/// A mountinfo field with its octal escapes (`\040` for a space) undone.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match (bytes[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    const HYBRID: &str = "\
22 27 0:21 / /proc rw,relatime - proc proc rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,nsdelegate
66 22 0:40 / /proc rw,relatime - proc proc rw,gid=27,hidepid=invisible,subset=pid
";

    #[test]
    fn the_proc_on_top_and_its_options_are_read() {
        let mounts = Mounts::parse(HYBRID);
        let proc = ProcMount { hidepid: HidePid::Invisible, gid: Some(27), subset_pid: true };
        assert_eq!(mounts.proc, proc);
        assert!(proc.hides_others_from(None), "groups unknown: not exempt");
        assert!(proc.hides_others_from(Some(&[4, 5])));
        assert!(!proc.hides_others_from(Some(&[4, 27])), "the gid= group sees all");
        let ptraceable = ProcMount { hidepid: HidePid::Ptraceable, ..proc.clone() };
        assert!(ptraceable.hides_others_from(Some(&[27])), "no exemption under ptraceable");
        // Older kernels' numbers, the mount's own options, and a value not known.
        for (options, hidepid) in [
            ("rw - proc proc rw,hidepid=2", HidePid::Invisible),
            ("rw,hidepid=1 - proc proc rw", HidePid::NoAccess),
            ("rw - proc proc rw,hidepid=0", HidePid::Off),
            ("rw - proc proc rw,hidepid=4", HidePid::Ptraceable),
            ("rw - proc proc rw,hidepid=someday", HidePid::Invisible),
        ] {
            let text = format!("1 0 0:1 / /proc {options}\n");
            assert_eq!(Mounts::parse(&text).proc.hidepid, hidepid, "{options}");
        }
        assert_eq!(Mounts::parse(HYBRID.lines().next().unwrap()).proc, ProcMount::PLAIN);
        // No /proc found: the strictest is assumed.
        assert_eq!(Mounts::parse("").proc, ProcMount::UNKNOWN);
        assert!(!ProcMount::PLAIN.hides_others_from(None));
    }

    #[test]
    fn the_cgroup_hierarchies_are_found_by_their_controllers() {
        let mounts = Mounts::parse(HYBRID).cgroups;
        let points: Vec<(bool, &Path)> =
            mounts.mounts.iter().map(|m| (m.unified, m.point.as_path())).collect();
        assert_eq!(
            points,
            [
                (false, Path::new("/sys/fs/cgroup/cpu,cpuacct")),
                (false, Path::new("/sys/fs/cgroup/systemd")),
                (true, Path::new("/sys/fs/cgroup/unified")),
            ]
        );
        // Each found by the controllers a /proc/PID/cgroup line names.
        let found = |controllers: &str| mounts.mount_of(controllers).map(|m| m.point.clone());
        let at = |p: &str| Some(PathBuf::from(p));
        assert_eq!(found("cpu,cpuacct"), at("/sys/fs/cgroup/cpu,cpuacct"));
        assert_eq!(found("name=systemd"), at("/sys/fs/cgroup/systemd"));
        assert_eq!(found(""), at("/sys/fs/cgroup/unified"));
        assert_eq!(found("memory"), None);
        assert_eq!(unescape("/mnt/a\\040b"), "/mnt/a b");
    }

    #[test]
    fn names_are_believed_down_to_the_first_directory_another_user_owns() {
        let tmp = tempfile::tempdir().unwrap();
        let me = crate::sys::unix::effective_uid();
        let root = tmp.path();
        std::fs::create_dir_all(root.join("system.slice/app.service")).unwrap();
        let mounts = CgroupMounts::for_tests(root, me);
        assert_eq!(mounts.named_by_root("", "/system.slice/app.service"), 2);
        // Below a directory that is not there, nothing more is believed.
        assert_eq!(mounts.named_by_root("", "/system.slice/gone.service/x.scope"), 2);
        assert_eq!(mounts.named_by_root("", "/"), 0);
        // A hierarchy not mounted: nothing.
        assert_eq!(mounts.named_by_root("cpu", "/system.slice/app.service"), 0);
        // Directories someone else owns: as another owner sees them, the names below the
        // mount's root are that owner's.
        let stranger = CgroupMounts::for_tests(root, me.wrapping_add(1));
        assert_eq!(stranger.named_by_root("", "/system.slice/app.service"), 0);
    }
}
