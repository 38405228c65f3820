//! A real podman for the CDI end-to-end tests (issue 28), and the CDI schema check.
//!
//! Debian 12's podman 4.3 with runc, as root, on a machine with no registry: the image is
//! a busybox root filesystem made here and `podman import`ed, once per test process, into
//! a private store (`<tmp>/gpushare-podman-<pid>/`, with its own containers.conf,
//! storage.conf, registries.conf and signature policy, so the machine's `/etc/containers`
//! and `/var/lib/containers` are neither read nor written). Every container runs with
//! `--rm --network=none` and lowered `--ulimit nofile/nproc` (see [`Podman::run`]).
//!
//! CDI directories: podman 4.3 reads CDI specs only from `/etc/cdi` and `/var/run/cdi`
//! (it has no `--cdi-spec-dir` flag and its containers.conf no `cdi_spec_dirs` key; both
//! came with podman 4.4+). So each podman runs in a mount namespace of its own
//! (`unshare --mount`) where a test's private directory is bind-mounted over
//! `/var/run/cdi` and an empty one over `/etc/cdi`: tests run in parallel, each with its
//! own spec directory and any `kind`, and the machine's specs are not seen. Traces left on
//! the machine: `/var/run/cdi` is created (empty, on the /run tmpfs) when it does not
//! exist, as the mount point, and `podman import` as root writes containers/image's blob
//! cache, `/var/lib/containers/cache/blob-info-cache-v1.boltdb`, wherever the store is.
//! Each store (6 MB) is removed by the next test process once its own has exited.
//!
//! Without podman, unshare, busybox-static or root, or where no container starts at all
//! (inside systemd-nspawn, runc may not make a session keyring), the tests skip with a
//! line saying what is missing; `GPUSHARE_REQUIRE_PODMAN=1` (set by `.ci/run`) makes them fail
//! instead, and makes [`validate_cdi`] fail when python3-jsonschema is missing.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

/// The image every container runs: busybox (static) and its applets in /bin.
pub const IMAGE: &str = "localhost/gpushare-cdi-test:1";
/// What podman 4.3 prints (after `Error: setting up CDI devices: `) for a CDI device name
/// no spec defines, followed by the name(s); exit status 126. It says the same for a
/// device of a spec file that failed to load (an unknown field, a cdiVersion above
/// 0.5.0, a device with no edits, two files defining one device): assert that another
/// device of the same spec still resolves, or [`validate_cdi`] the file, before reading
/// "unresolvable" as "not defined".
pub const UNRESOLVABLE: &str = "unresolvable CDI devices";
/// Set to 1, a missing podman (or python3-jsonschema) fails the tests instead of skipping.
pub const REQUIRE_ENV: &str = "GPUSHARE_REQUIRE_PODMAN";
/// The CDI schema (tests/data/cdi-schema.json), relative to the repository root.
pub const CDI_SCHEMA: &str = "tests/data/cdi-schema.json";

/// The directories podman 4.3 reads CDI specs from, in increasing priority.
pub const PODMAN_CDI_DIRS: [&str; 2] = ["/etc/cdi", "/var/run/cdi"];

fn required() -> bool {
    std::env::var_os(REQUIRE_ENV).is_some_and(|v| v == "1")
}

/// Fails the test with `reason` under [`REQUIRE_ENV`], else prints it as a skip.
fn skip(reason: &str) {
    assert!(!required(), "{REQUIRE_ENV}=1: {reason}");
    crate::skip(reason);
}

/// podman set up for tests: a private store shared by the test process, and the CDI spec
/// directory the containers see.
#[derive(Clone)]
pub struct Podman {
    store: &'static Store,
    cdi_dir: Option<PathBuf>,
}

/// The process's private podman store and configuration.
struct Store {
    dir: PathBuf,
    image: OnceLock<Result<(), String>>,
}

static STORE: OnceLock<Result<Store, String>> = OnceLock::new();

impl Podman {
    /// podman ready to run containers, or `None` after printing why not (no root, no
    /// podman, no unshare, no static busybox, the store cannot be made, no container starts
    /// here). Panics instead
    /// of returning `None` when `GPUSHARE_REQUIRE_PODMAN=1`.
    pub fn available() -> Option<Podman> {
        if !crate::is_root() {
            skip("podman tests need root (a rootful podman, mounts in a private namespace)");
            return None;
        }
        for (tool, package) in [("podman", "podman runc"), ("unshare", "util-linux")] {
            let found = Command::new(tool)
                .arg("--version")
                .stdin(Stdio::null())
                .output()
                .is_ok_and(|o| o.status.success());
            if !found {
                skip(&format!("no {tool} (apt-get install {package})"));
                return None;
            }
        }
        if let Err(reason) = static_busybox() {
            skip(&reason);
            return None;
        }
        let podman = match STORE.get_or_init(Store::create) {
            Ok(store) => Podman { store, cdi_dir: None },
            Err(reason) => {
                skip(reason);
                return None;
            }
        };
        // A machine where no container starts at all (a container itself: systemd-nspawn
        // refuses runc the session keyring) is no place for these tests.
        static RUNS: OnceLock<Result<(), String>> = OnceLock::new();
        match RUNS.get_or_init(|| podman.starts_a_container()) {
            Ok(()) => Some(podman),
            Err(reason) => {
                skip(reason);
                None
            }
        }
    }

    /// Whether a container without devices starts here (`true` in the test image); `Err`
    /// quotes podman's last line. Only the exit status is read.
    fn starts_a_container(&self) -> Result<(), String> {
        let store = self.store;
        store
            .image
            .get_or_init(|| import(store))
            .clone()
            .map_err(|e| format!("the test image: {e}"))?;
        let out = self.run(&[], "true");
        if out.status.success() {
            return Ok(());
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        let last = stderr.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("");
        Err(format!("podman cannot start a container here ({}): {last}", out.status))
    }

    /// The same podman, its containers seeing the CDI specs in `dir` (bind-mounted over
    /// `/var/run/cdi`); without it they see an empty CDI directory.
    pub fn with_cdi_dir(&self, dir: &Path) -> Podman {
        Podman { store: self.store, cdi_dir: Some(dir.to_path_buf()) }
    }

    /// The test image, imported on the first call in this process (thread-safe).
    pub fn image(&self) -> &str {
        let store = self.store;
        let imported = store.image.get_or_init(|| import(store));
        if let Err(reason) = imported {
            panic!("the podman test image: {reason}");
        }
        IMAGE
    }

    /// podman with the store's global options, in a mount namespace where this podman's
    /// CDI directory is `/var/run/cdi` and `/etc/cdi` is empty: add the subcommand.
    pub fn command(&self) -> Command {
        let store = &self.store.dir;
        let cdi = self.cdi_dir.clone().unwrap_or_else(|| store.join("empty"));
        let mut cmd = Command::new("unshare");
        cmd.args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg(concat!(
                "mount --bind \"$1\" /var/run/cdi || exit 125; ",
                "if [ -d /etc/cdi ]; then mount --bind \"$2\" /etc/cdi || exit 125; fi; ",
                "shift 2; exec \"$@\""
            ))
            .arg("sh")
            .arg(&cdi)
            .arg(store.join("empty"))
            .arg("podman")
            .arg("--root")
            .arg(store.join("root"))
            .arg("--runroot")
            .arg(store.join("runroot"))
            .arg("--tmpdir")
            .arg(store.join("tmp"))
            .args([
                "--storage-driver",
                "vfs",
                "--cgroup-manager",
                "cgroupfs",
                "--events-backend",
                "file",
                "--runtime",
                "runc",
            ])
            .env("CONTAINERS_CONF", store.join("containers.conf"))
            .env("CONTAINERS_STORAGE_CONF", store.join("storage.conf"))
            .env("CONTAINERS_REGISTRIES_CONF", store.join("registries.conf"))
            // containers/image reads $HOME/.config/containers/policy.json first.
            .env("HOME", store.join("home"))
            .env_remove("XDG_CONFIG_HOME")
            .stdin(Stdio::null());
        cmd
    }

    /// Runs `sh -c script` in a fresh container (`--rm`, no network) of [`IMAGE`], each
    /// of `devices` passed as `--device` (CDI names such as `gpushare.io/gpu=0`, or host
    /// paths), and waits for it. The flags that make it run as root in a sandbox and on a
    /// bare CI machine: `--ulimit nofile=N:N --ulimit nproc=N:N` with N at most this
    /// process's hard limits (rootful podman asks runc for nofile 1048576 and nproc
    /// 4194304, which it cannot set without CAP_SYS_RESOURCE: "error setting rlimit type
    /// 7: operation not permitted"), `--cgroup-manager cgroupfs` (no systemd to ask),
    /// `--events-backend file` (no journald), `--network=none` (no CNI bridge or iptables
    /// rules on the host), `--storage-driver vfs` (no overlay mounts to leave behind).
    pub fn run(&self, devices: &[&str], script: &str) -> Output {
        let image = self.image().to_string();
        let mut cmd = self.command();
        cmd.args(["run", "--rm", "--network=none"]);
        for limit in ulimits() {
            cmd.args(["--ulimit", &limit]);
        }
        for device in devices {
            cmd.args(["--device", device]);
        }
        cmd.args([&image, "sh", "-c", script]);
        cmd.output().expect("unshare runs podman")
    }
}

/// Asserts that podman refused `device` with CDI's "unresolvable" error.
pub fn assert_unresolvable(out: &Output, device: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains(&format!("{UNRESOLVABLE} {device}")),
        "podman should refuse {device} as {UNRESOLVABLE}: {}\n{stderr}",
        out.status
    );
}

/// `--ulimit` values no higher than this process's hard limits (1024 or less).
fn ulimits() -> Vec<String> {
    use nix::sys::resource::{Resource, getrlimit};
    [(Resource::RLIMIT_NOFILE, "nofile"), (Resource::RLIMIT_NPROC, "nproc")]
        .into_iter()
        .map(|(resource, name)| {
            let n = getrlimit(resource).map_or(1024, |(_, hard)| hard.min(1024));
            format!("{name}={n}:{n}")
        })
        .collect()
}

/// `/bin/busybox` when it is static (busybox-static): the image has no libc.
fn static_busybox() -> Result<PathBuf, String> {
    let path = PathBuf::from("/bin/busybox");
    let elf = std::fs::read(&path)
        .map_err(|e| format!("no {} ({e}): apt-get install busybox-static", path.display()))?;
    // ELF64: a static executable has no PT_INTERP (3) program header.
    let u16_at = |o: usize| elf.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let phoff = elf.get(0x20..0x28).map(|b| u64::from_le_bytes(b.try_into().unwrap()));
    let (Some(phoff), Some(size), Some(count)) = (phoff, u16_at(0x36), u16_at(0x38)) else {
        return Err(format!("{} is not an ELF64 executable", path.display()));
    };
    let has_interp = (0..count as usize).any(|i| {
        let at = phoff as usize + i * size as usize;
        elf.get(at..at + 4).is_some_and(|t| t == 3u32.to_le_bytes())
    });
    if has_interp {
        return Err(format!(
            "{} is linked dynamically: the test image needs busybox-static",
            path.display()
        ));
    }
    Ok(path)
}

impl Store {
    fn create() -> Result<Store, String> {
        let base = std::env::temp_dir();
        remove_stale_stores(&base);
        let dir = base.join(format!("gpushare-podman-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for sub in ["root", "runroot", "tmp", "empty", "home/.config/containers", "rootfs"] {
            std::fs::create_dir_all(dir.join(sub))
                .map_err(|e| format!("{}: {e}", dir.join(sub).display()))?;
        }
        // The mount point podman's CDI directory is bound over.
        std::fs::create_dir_all(PODMAN_CDI_DIRS[1])
            .map_err(|e| format!("{}: {e}", PODMAN_CDI_DIRS[1]))?;
        let d = dir.display();
        let files = [
            (
                "containers.conf",
                format!(
                    "[engine]\ncgroup_manager = \"cgroupfs\"\nevents_logger = \"file\"\n\
                     events_logfile_path = \"{d}/events.log\"\nlock_type = \"file\"\n\
                     runtime = \"runc\"\ntmp_dir = \"{d}/tmp\"\n\
                     static_dir = \"{d}/root/libpod\"\nvolume_path = \"{d}/root/volumes\"\n"
                ),
            ),
            (
                "storage.conf",
                format!(
                    "[storage]\ndriver = \"vfs\"\ngraphroot = \"{d}/root\"\n\
                     runroot = \"{d}/runroot\"\n"
                ),
            ),
            ("registries.conf", "unqualified-search-registries = []\n".to_string()),
            (
                "home/.config/containers/policy.json",
                "{\"default\": [{\"type\": \"insecureAcceptAnything\"}]}\n".to_string(),
            ),
        ];
        for (name, contents) in files {
            std::fs::write(dir.join(name), contents).map_err(|e| format!("{d}/{name}: {e}"))?;
        }
        Ok(Store { dir, image: OnceLock::new() })
    }
}

/// Builds the root filesystem (static busybox, its applets, /etc/passwd) in `store`, tars
/// it and imports it as [`IMAGE`].
fn import(store: &'static Store) -> Result<(), String> {
    let rootfs = store.dir.join("rootfs");
    for sub in ["bin", "dev", "proc", "sys", "tmp", "etc", "root"] {
        std::fs::create_dir_all(rootfs.join(sub)).map_err(|e| e.to_string())?;
    }
    let busybox = static_busybox()?;
    std::fs::copy(&busybox, rootfs.join("bin/busybox")).map_err(|e| e.to_string())?;
    let list = Command::new(&busybox).arg("--list").output().map_err(|e| e.to_string())?;
    for applet in String::from_utf8_lossy(&list.stdout).lines() {
        if applet != "busybox" && !applet.contains('/') {
            let _ = std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet));
        }
    }
    std::fs::write(rootfs.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n")
        .and_then(|()| std::fs::write(rootfs.join("etc/group"), "root:x:0:\n"))
        .map_err(|e| e.to_string())?;
    let tar = store.dir.join("rootfs.tar");
    let out = Command::new("tar")
        .args(["--numeric-owner", "--owner=0", "--group=0", "-C"])
        .arg(&rootfs)
        .arg("-cf")
        .arg(&tar)
        .arg(".")
        .output()
        .map_err(|e| format!("tar: {e}"))?;
    if !out.status.success() {
        return Err(format!("tar: {}", String::from_utf8_lossy(&out.stderr)));
    }
    let podman = Podman { store, cdi_dir: None };
    let out = podman
        .command()
        .arg("import")
        .arg(&tar)
        .arg(IMAGE)
        .output()
        .map_err(|e| format!("podman import: {e}"))?;
    if !out.status.success() {
        return Err(format!("podman import: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(())
}

/// Removes the stores of test processes that are gone (a process's store outlives it:
/// statics are not dropped).
fn remove_stale_stores(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix("gpushare-podman-")) else {
            continue;
        };
        if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Whether [`validate_cdi`] can check (a python3 with jsonschema); prints a skip line, or
/// fails under `GPUSHARE_REQUIRE_PODMAN=1`, when it cannot.
pub fn has_jsonschema() -> bool {
    let found = ["/usr/bin/python3", "python3"].iter().any(|python| {
        Command::new(python)
            .args(["-c", "import jsonschema"])
            .stdin(Stdio::null())
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if !found {
        skip("no python3 with jsonschema (apt-get install python3-jsonschema)");
    }
    found
}

/// Validates the CDI spec file `spec_path` (JSON) against [`CDI_SCHEMA`] with a python3's
/// jsonschema (Debian's first), and checks its device names are unique (CDI refuses a file
/// that defines a name twice). Only validity is an answer: `Err` when the file breaks a
/// rule, with the checker's explanation for people (`<path in the document>: <message>`
/// per line, worded by whichever jsonschema ran: never to be matched by a test). A checker
/// that fails otherwise (a traceback, the schema itself refused) panics. Without
/// jsonschema it prints that it skipped and returns `Ok` (fails under
/// `GPUSHARE_REQUIRE_PODMAN=1`).
pub fn validate_cdi(spec_path: &Path) -> Result<(), String> {
    // Exit status: 0 valid, 10 invalid, 3 no jsonschema; anything else is the checker's
    // own failure (an uncaught exception exits 1).
    const CHECK: &str = r#"
import json, sys
try:
    import jsonschema
except ImportError:
    sys.exit(3)
schema = json.load(open(sys.argv[1]))
jsonschema.Draft7Validator.check_schema(schema)
try:
    spec = json.load(open(sys.argv[2]))
except ValueError as e:
    print("not JSON: %s" % e)
    sys.exit(10)
problems = []
for e in jsonschema.Draft7Validator(schema).iter_errors(spec):
    problems.append("/%s: %s" % ("/".join(map(str, e.absolute_path)), e.message))
names = [d.get("name") for d in spec.get("devices", []) if isinstance(d, dict)] if isinstance(spec, dict) else []
for n in sorted(set(repr(x) for x in names if names.count(x) > 1)):
    problems.append("/devices: device name %s defined more than once" % n)
print("\n".join(sorted(problems)))
sys.exit(10 if problems else 0)
"#;
    let schema = crate::repo_root().join(CDI_SCHEMA);
    // Debian's python3 first: python3-jsonschema installs there, whatever python3 is on PATH.
    let pythons = ["/usr/bin/python3", "python3"];
    for python in pythons {
        let Ok(out) = Command::new(python)
            .args(["-c", CHECK])
            .arg(&schema)
            .arg(spec_path)
            .stdin(Stdio::null())
            .output()
        else {
            continue;
        };
        let said = || {
            let stdout = String::from_utf8_lossy(&out.stdout);
            let stderr = String::from_utf8_lossy(&out.stderr);
            format!("{}: {stdout}{stderr}", spec_path.display()).trim().to_string()
        };
        match out.status.code() {
            Some(0) => return Ok(()),
            Some(3) => continue,
            Some(10) => return Err(said()),
            _ => panic!("the CDI schema check with {python} failed ({}): {}", out.status, said()),
        }
    }
    let path = spec_path.display();
    skip(&format!("{path} not checked against the CDI schema: no python3-jsonschema"));
    Ok(())
}
