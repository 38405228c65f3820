//! NVIDIA's device plugin config as a view ([`super::View`]): the `--config-file` of
//! k8s-device-plugin (`version: v1`), rendered from the GPUs as they are: the MIG strategy
//! from the layout, time-slicing or MPS replicas of the whole GPUs. Owns the plugin's rules
//! as gpushare reads them (api/config/v1 and internal/plugin of v0.20.0; DESIGN.md
//! "Kubernetes (issue 40)"): one sharing for every device of a resource, no MPS beside
//! MIG, only MIG devices whose compute instance is the whole GPU instance, and, since the
//! plugin serves `nvidia.com/gpu` through one MPS control daemon and gpushare runs one per
//! GPU, MPS on a node of one GPU. A node the plugin cannot express is refused before an
//! apply's first step ([`View::check`]) and never written: a render that meets one (a
//! bench's setup, a change by hand) keeps the last file and says why.
//!
//! Under MPS it also keeps the plugin's MPS layout in gpushare's MPS root (the plugin's
//! `mpsRoot`): `nvidia.com/gpu` a link to the server's directory (so
//! `<root>/nvidia.com/gpu/pipe` is gpushare's pipe directory) and `shm` a link to
//! `/dev/shm`, where gpushare's servers meet their clients.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::kept::Kept;
use super::shape::{self, GpuShape, Shared};
use super::{Ahead, Observation, View};
use crate::sys::place::Place;

/// The resource name of whole GPUs (and of MIG devices under the `single` strategy).
const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// What the config says: the MIG strategy and the whole GPUs' sharing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expressed {
    /// `none`, `single` or `mixed`.
    pub mig_strategy: &'static str,
    /// How every whole GPU is shared, with its replicas.
    pub sharing: Option<(Sharing, u32)>,
    /// Under MPS, the one GPU's `GPU-…` (its server's directory is named so).
    pub mps_uuid: Option<String>,
}

/// The plugin's two sharings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sharing {
    /// `sharing.timeSlicing`.
    TimeSlicing,
    /// `sharing.mps`.
    Mps,
}

impl Sharing {
    fn key(self) -> &'static str {
        match self {
            Sharing::TimeSlicing => "timeSlicing",
            Sharing::Mps => "mps",
        }
    }
}

/// How the plugin sees one whole GPU's sharing: none, or a sharing with its replicas; or
/// why it cannot.
fn whole_sharing(gpu: &GpuShape) -> Result<Option<(Sharing, u32)>, String> {
    let i = gpu.index;
    match &gpu.whole {
        Shared::Exclusive => Ok(None),
        Shared::TimeSliced { replicas: Some(r), .. } if *r >= 2 => {
            Ok(Some((Sharing::TimeSlicing, *r)))
        }
        Shared::TimeSliced { .. } => Err(format!(
            "GPU {i} is time-sliced without replicas of 2 or more for the plugin to advertise \
             (give the profile's sharing.time-slicing replicas)"
        )),
        Shared::Mps(m) if m.replicas >= 2 => Ok(Some((Sharing::Mps, m.replicas))),
        Shared::Mps(_) => Err(format!(
            "GPU {i}'s MPS server gives one share (100 % threads), and the plugin shares a GPU \
             only with replicas of 2 or more"
        )),
    }
}

fn describe(sharing: Option<(Sharing, u32)>) -> String {
    match sharing {
        None => "not shared".into(),
        Some((Sharing::TimeSlicing, r)) => format!("time-sliced, {r} replicas"),
        Some((Sharing::Mps, r)) => format!("MPS, {r} replicas"),
    }
}

/// What the plugin's config says of `gpus`, or the plugin's rule they break, in one line.
pub fn express(gpus: &[GpuShape]) -> Result<Expressed, String> {
    let mut kinds: Vec<&str> = Vec::new();
    for gpu in gpus {
        for d in gpu.mig.iter().flatten() {
            if d.subdivided {
                return Err(format!(
                    "GPU {}: the {} MIG device is a compute instance smaller than its GPU \
                     instance, and NVIDIA's device plugin hands out only MIG devices whose \
                     compute instance is the whole GPU instance",
                    gpu.index, d.kind
                ));
            }
            if d.mps.is_some() {
                return Err(format!(
                    "GPU {}: MPS on a {} MIG device, and NVIDIA's device plugin does not share \
                     MIG devices through MPS",
                    gpu.index, d.kind
                ));
            }
            if !kinds.contains(&d.kind.as_str()) {
                kinds.push(&d.kind);
            }
        }
    }
    let whole: Vec<&GpuShape> = gpus.iter().filter(|g| g.mig.is_none()).collect();
    let mut sharing = None;
    for (n, gpu) in whole.iter().enumerate() {
        let this = whole_sharing(gpu)?;
        if n == 0 {
            sharing = this;
        } else if this != sharing {
            return Err(format!(
                "GPU {} ({}) and GPU {} ({}) are shared differently, and NVIDIA's device \
                 plugin applies one sharing to every GPU of {GPU_RESOURCE}",
                whole[0].index,
                describe(sharing),
                gpu.index,
                describe(this)
            ));
        }
    }
    let mig_gpus = gpus.len() - whole.len();
    // `single` wants every GPU in MIG with devices of one kind, all alike (the plugin's
    // `assertAllMigDevicesAreValid(uniform)` compares the devices' attributes, so one
    // model too); anything else is `mixed`, which the plugin takes as it comes.
    let uniform = gpus.iter().all(|g| g.mig.as_ref().is_some_and(|d| !d.is_empty()))
        && gpus.windows(2).all(|w| w[0].model == w[1].model);
    let mig_strategy = match (mig_gpus, kinds.len()) {
        (0, _) => "none",
        (_, 1) if uniform => "single",
        _ => "mixed",
    };
    let mut mps_uuid = None;
    if let Some((Sharing::Mps, _)) = sharing {
        if mig_gpus > 0 {
            return Err(
                "MPS beside MIG GPUs, and NVIDIA's device plugin refuses MPS when any device \
                 is a MIG device"
                    .into(),
            );
        }
        if whole.len() > 1 {
            let indices: Vec<String> = whole.iter().map(|g| g.index.to_string()).collect();
            return Err(format!(
                "MPS on GPUs {}, and NVIDIA's device plugin hands every container of \
                 {GPU_RESOURCE} one MPS control daemon for all GPUs where gpushare runs one \
                 per GPU (under the plugin, MPS is for a node of one GPU)",
                indices.join(", ")
            ));
        }
        mps_uuid = whole.first().map(|g| g.uuid.clone());
    }
    Ok(Expressed { mig_strategy, sharing, mps_uuid })
}

/// The config file's text for `expressed`, with `mps_root` as the plugin's `mpsRoot`.
pub fn text(expressed: &Expressed, mps_root: &Path) -> String {
    let mut out = String::from(
        "# NVIDIA device plugin config (k8s-device-plugin, --config-file), written by\n\
         # gpushare-agent from the GPUs as they are after every change; do not edit.\n\
         version: v1\nflags:\n",
    );
    out.push_str(&format!("  migStrategy: {}\n  failOnInitError: true\n", expressed.mig_strategy));
    if let Some((Sharing::Mps, _)) = expressed.sharing {
        let root = serde_json::to_string(&mps_root.display().to_string()).unwrap_or_default();
        out.push_str(&format!("  mpsRoot: {root}\n"));
    }
    if let Some((sharing, replicas)) = expressed.sharing {
        out.push_str(&format!(
            "sharing:\n  {}:\n    failRequestsGreaterThanOne: true\n    resources:\n    - name: \
             {GPU_RESOURCE}\n      replicas: {replicas}\n",
            sharing.key()
        ));
    }
    out
}

/// The view: its file, gpushare's MPS root, and whether MPS may be handed out.
pub struct DevicePluginView {
    file: Kept,
    mps_root: PathBuf,
    /// `[device_plugin] mps_host_shm`: pods given MPS shares get the host's `/dev/shm`.
    mps_host_shm: bool,
}

impl DevicePluginView {
    /// The view writing at `path` (kept when `enabled`), with the MPS layout in `mps_root`,
    /// handing out MPS only where `mps_host_shm` accepts what that costs.
    pub fn new(path: PathBuf, enabled: bool, mps_root: PathBuf, mps_host_shm: bool) -> Self {
        let file = Kept::new(Place {
            words: format!("device plugin config {}", path.display()),
            path,
            enabled,
            setting: "[device_plugin] path",
            noun: "the config",
        });
        DevicePluginView { file, mps_root, mps_host_shm }
    }

    /// The config as the GPUs of `gpus` give it, or the rule they break.
    pub fn render_text(&self, gpus: &[GpuShape]) -> Result<String, String> {
        self.expressed(gpus).map(|e| text(&e, &self.mps_root))
    }

    /// What the config says of `gpus` ([`express`]), where this agent hands it out: MPS
    /// only with `mps_host_shm`, since the plugin mounts `<mpsRoot>/shm`, where gpushare's
    /// servers meet their clients (the host's `/dev/shm`), into every pod it gives a share.
    fn expressed(&self, gpus: &[GpuShape]) -> Result<Expressed, String> {
        let expressed = express(gpus)?;
        match (&expressed.sharing, &expressed.mps_uuid) {
            (Some((Sharing::Mps, _)), Some(_)) if !self.mps_host_shm => Err(format!(
                "MPS on GPU {}: NVIDIA's device plugin would give every pod it hands a share \
                 the host's /dev/shm, where gpushare's MPS servers meet their clients; set \
                 [device_plugin] mps_host_shm = true to accept that",
                gpus.iter().find(|g| g.mig.is_none()).map_or(0, |g| g.index)
            )),
            _ => Ok(expressed),
        }
    }

    /// Keeps the plugin's MPS layout: the links to the server of `uuid`, or none.
    fn keep_mps_layout(&self, uuid: Option<&str>) -> io::Result<()> {
        // Only in a root the agent may trust, as the MPS layer's: a root another user
        // can change is no place to make or remove links in. One that is not there yet
        // has no links to remove.
        let root = match crate::sys::trusted::check_dir(&self.mps_root) {
            Ok(root) => root,
            Err(_) if uuid.is_none() && !self.mps_root.exists() => return Ok(()),
            Err(why) => return Err(io::Error::new(io::ErrorKind::PermissionDenied, why)),
        };
        let dir = root.join("nvidia.com");
        let gpu = dir.join("gpu");
        let shm = root.join("shm");
        if fs::symlink_metadata(&dir).is_ok_and(|m| !m.file_type().is_dir()) {
            return Err(io::Error::other(format!("{} is not a directory", dir.display())));
        }
        let Some(uuid) = uuid else {
            remove_link(&gpu)?;
            remove_link(&shm)?;
            // Only when empty: anything else there is not the agent's.
            let _ = fs::remove_dir(&dir);
            return Ok(());
        };
        if fs::symlink_metadata(&dir).is_err() {
            use std::os::unix::fs::DirBuilderExt;
            fs::DirBuilder::new().mode(0o755).create(&dir)?;
        }
        // Relative, so that it resolves wherever the root is mounted (`/mps` in the
        // plugin's container).
        put_link(&gpu, &Path::new("..").join(uuid))?;
        put_link(&shm, Path::new("/dev/shm"))
    }
}

/// Removes `path` when it is a link (never anything else).
fn remove_link(path: &Path) -> io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => fs::remove_file(path),
        _ => Ok(()),
    }
}

/// Makes `path` a link to `target`, replacing a link there (a new link renamed over it).
fn put_link(path: &Path, target: &Path) -> io::Result<()> {
    if fs::read_link(path).is_ok_and(|t| t == target) {
        return Ok(());
    }
    if let Ok(m) = fs::symlink_metadata(path)
        && !m.file_type().is_symlink()
    {
        return Err(io::Error::other(format!("{} is there and is not a link", path.display())));
    }
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let _ = fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp)?;
    fs::rename(&tmp, path).inspect_err(|_| {
        let _ = fs::remove_file(&tmp);
    })
}

impl View for DevicePluginView {
    fn name(&self) -> &'static str {
        "device plugin config"
    }

    fn enabled(&self) -> bool {
        self.file.enabled()
    }

    fn check(&self, ahead: &Ahead<'_>) -> Result<(), String> {
        self.file.check()?;
        self.check_expressed(ahead)
    }

    fn check_expressed(&self, ahead: &Ahead<'_>) -> Result<(), String> {
        self.expressed(&shape::planned(ahead)).map(|_| ()).map_err(|why| {
            format!(
                "{why}: refused, as agent.toml keeps the plugin's config ([device_plugin] \
                 enabled = true)"
            )
        })
    }

    fn render(&self, seen: Result<&Observation<'_>, &str>) {
        let made = seen.map_err(str::to_string).and_then(|seen| {
            let expressed = self
                .expressed(&shape::observed(seen))
                .map_err(|why| format!("not rewritten (the plugin could not express it): {why}"))?;
            self.keep_mps_layout(expressed.mps_uuid.as_deref())
                .map_err(|e| format!("the MPS layout in {}: {e}", self.mps_root.display()))?;
            Ok(text(&expressed, &self.mps_root).into_bytes())
        });
        self.file.keep(self.name(), made);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::views::shape::{MigDevice, Mps};

    fn whole(index: u32, whole: Shared) -> GpuShape {
        GpuShape { index, uuid: format!("GPU-{index}"), model: "H100".into(), mig: None, whole }
    }

    fn mig(index: u32, kinds: &[&str]) -> GpuShape {
        let devices = kinds
            .iter()
            .map(|k| MigDevice { kind: (*k).into(), subdivided: k.contains("c."), mps: None })
            .collect();
        GpuShape {
            index,
            uuid: format!("GPU-{index}"),
            model: "H100".into(),
            mig: Some(devices),
            whole: Shared::Exclusive,
        }
    }

    fn mps(replicas: u32) -> Shared {
        Shared::Mps(Mps {
            replicas,
            thread_percentage: 100 / replicas,
            memory_limit_bytes: Some(20 << 30),
        })
    }

    fn sliced(replicas: Option<u32>) -> Shared {
        Shared::TimeSliced { interval: "medium", replicas }
    }

    #[test]
    fn the_mig_strategy_follows_the_layout() {
        let none = express(&[whole(0, Shared::Exclusive), whole(1, Shared::Exclusive)]).unwrap();
        assert_eq!((none.mig_strategy, none.sharing), ("none", None));
        let single = express(&[mig(0, &["1g.10gb"; 7]), mig(1, &["1g.10gb"; 7])]).unwrap();
        assert_eq!(single.mig_strategy, "single");
        let kinds = express(&[mig(0, &["1g.10gb", "3g.40gb"]), mig(1, &["1g.10gb"])]).unwrap();
        assert_eq!(kinds.mig_strategy, "mixed");
        let half = express(&[mig(0, &["1g.10gb"]), whole(1, Shared::Exclusive)]).unwrap();
        assert_eq!(half.mig_strategy, "mixed");
        // A MIG GPU without devices, or two models, fail the plugin's `single`: mixed.
        let empty = express(&[mig(0, &["1g.10gb"; 7]), mig(1, &[])]).unwrap();
        assert_eq!(empty.mig_strategy, "mixed");
        let mut a100 = mig(1, &["1g.10gb"; 7]);
        a100.model = "A100".into();
        let models = express(&[mig(0, &["1g.10gb"; 7]), a100]).unwrap();
        assert_eq!(models.mig_strategy, "mixed");
        // Whole GPUs time-sliced beside MIG ones: the sharing is nvidia.com/gpu's alone.
        let beside = express(&[mig(0, &["1g.10gb"]), whole(1, sliced(Some(4)))]).unwrap();
        assert_eq!(beside.sharing, Some((Sharing::TimeSlicing, 4)));
    }

    #[test]
    fn one_sharing_for_every_whole_gpu() {
        let ts = express(&[whole(0, sliced(Some(4))), whole(1, sliced(Some(4)))]).unwrap();
        assert_eq!(ts.sharing, Some((Sharing::TimeSlicing, 4)));
        for other in [Shared::Exclusive, sliced(Some(2)), mps(4)] {
            let e = express(&[whole(0, sliced(Some(4))), whole(1, other)]).unwrap_err();
            assert!(e.contains("GPU 0 (time-sliced, 4 replicas) and GPU 1"), "{e}");
            assert!(e.contains("one sharing to every GPU of nvidia.com/gpu"), "{e}");
        }
        let e = express(&[whole(0, sliced(None))]).unwrap_err();
        assert!(e.contains("without replicas of 2 or more"), "{e}");
        let e = express(&[whole(0, sliced(Some(1)))]).unwrap_err();
        assert!(e.contains("without replicas of 2 or more"), "{e}");
        let e = express(&[whole(0, mps(1))]).unwrap_err();
        assert!(e.contains("one share"), "{e}");
    }

    #[test]
    fn mps_is_for_one_whole_gpu_without_mig() {
        let one = express(&[whole(0, mps(4))]).unwrap();
        assert_eq!(one.sharing, Some((Sharing::Mps, 4)));
        assert_eq!(one.mps_uuid.as_deref(), Some("GPU-0"));
        let e = express(&[whole(0, mps(4)), whole(1, mps(4))]).unwrap_err();
        assert!(e.contains("MPS on GPUs 0, 1") && e.contains("one per GPU"), "{e}");
        let e = express(&[whole(0, mps(4)), mig(1, &["1g.10gb"])]).unwrap_err();
        assert!(e.contains("MPS beside MIG GPUs"), "{e}");
        let mut served = mig(0, &["1g.10gb"]);
        served.mig.as_mut().unwrap()[0].mps =
            Some(Mps { replicas: 2, thread_percentage: 50, memory_limit_bytes: None });
        let e = express(&[served]).unwrap_err();
        assert!(e.contains("MPS on a 1g.10gb MIG device"), "{e}");
        let e = express(&[mig(0, &["1c.3g.40gb", "1c.3g.40gb"])]).unwrap_err();
        assert!(e.contains("the 1c.3g.40gb MIG device is a compute instance smaller"), "{e}");
    }

    #[test]
    fn the_text_is_the_plugins_v1_config() {
        let root = Path::new("/run/gpushare/mps");
        let ts = express(&[whole(0, sliced(Some(4)))]).unwrap();
        let text = text(&ts, root);
        assert!(
            text.contains("version: v1\nflags:\n  migStrategy: none\n  failOnInitError: true\n")
        );
        assert!(text.ends_with(
            "sharing:\n  timeSlicing:\n    failRequestsGreaterThanOne: true\n    resources:\n    - \
             name: nvidia.com/gpu\n      replicas: 4\n"
        ));
        assert!(!text.contains("mpsRoot"), "{text}");
        let m = text_of_mps(root);
        assert!(m.contains("  mpsRoot: \"/run/gpushare/mps\"\nsharing:\n  mps:\n"), "{m}");
        let plain = super::text(&express(&[mig(0, &["1g.10gb"])]).unwrap(), root);
        assert!(!plain.contains("sharing"), "{plain}");
    }

    #[test]
    fn mps_is_handed_out_only_where_the_host_shm_is_accepted() {
        let root = PathBuf::from("/run/gpushare/mps");
        let off = DevicePluginView::new("/x/dp.yaml".into(), true, root.clone(), false);
        let e = off.render_text(&[whole(0, mps(4))]).unwrap_err();
        assert!(e.contains("/dev/shm") && e.contains("mps_host_shm = true"), "{e}");
        assert!(off.render_text(&[whole(0, sliced(Some(4)))]).is_ok());
        let on = DevicePluginView::new("/x/dp.yaml".into(), true, root, true);
        assert!(on.render_text(&[whole(0, mps(4))]).unwrap().contains("  mps:\n"));
    }

    fn text_of_mps(root: &Path) -> String {
        text(&express(&[whole(0, mps(4))]).unwrap(), root)
    }

    #[test]
    fn the_mps_layout_links_to_the_server_and_goes_with_it() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("mps");
        fs::create_dir(&root).unwrap();
        let view = DevicePluginView::new(tmp.path().join("dp.yaml"), true, root.clone(), true);
        view.keep_mps_layout(Some("GPU-1")).unwrap();
        assert_eq!(fs::read_link(root.join("nvidia.com/gpu")).unwrap(), Path::new("../GPU-1"));
        assert_eq!(fs::read_link(root.join("shm")).unwrap(), Path::new("/dev/shm"));
        view.keep_mps_layout(Some("GPU-2")).unwrap();
        assert_eq!(fs::read_link(root.join("nvidia.com/gpu")).unwrap(), Path::new("../GPU-2"));
        view.keep_mps_layout(None).unwrap();
        assert_eq!(fs::read_dir(&root).unwrap().count(), 0, "links and their directory go");
        // A root another user may write is no place for links: nothing is made or removed.
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&root, fs::Permissions::from_mode(0o777)).unwrap();
        assert!(view.keep_mps_layout(Some("GPU-1")).is_err());
        assert!(view.keep_mps_layout(None).is_err());
        assert_eq!(fs::read_dir(&root).unwrap().count(), 0);
        fs::set_permissions(&root, fs::Permissions::from_mode(0o755)).unwrap();
        // Something there that is no link is never replaced.
        fs::create_dir_all(root.join("nvidia.com/gpu")).unwrap();
        assert!(view.keep_mps_layout(Some("GPU-1")).is_err());
        view.keep_mps_layout(None).unwrap();
        assert!(root.join("nvidia.com/gpu").is_dir());
    }
}
