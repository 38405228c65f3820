//! GPU resets. NVML has no public reset call: `nvidia-smi --gpu-reset -i <index>` does it,
//! and nvidia-smi refuses to reset a GPU that any NVML client has open, the agent's own
//! session included. So the backend keeps its session in a slot ([`with_slot`]) that a
//! reset empties for its duration ([`around_reset`]); a failed reset names the processes
//! that hold the GPU's device node.

use std::io;
use std::path::Path;
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use super::errors::with_context;
use crate::gpu::{ErrorCode, GpuError};
use crate::node::Operation;
use crate::sys::command::Command;
use crate::sys::procfs::holders_sentence;

/// A failed reset's error with what holds the GPU's device node (`device_node`, or why
/// it is unknown) added to its detail; unchanged when nvidia-smi was not found or said
/// the reset is not supported here (a VM that does not let the GPU be reset: no holder
/// is to blame, see [`super::reset_blockers`]).
pub(super) fn with_holders(error: GpuError, device_node: &Result<String, String>) -> GpuError {
    if matches!(error.code, ErrorCode::NotFound | ErrorCode::NotSupported) {
        return error;
    }
    let holders = match device_node {
        Ok(node) => holders_sentence(Path::new("/proc"), node, std::process::id()),
        Err(why) => format!("cannot tell what holds the GPU: no device node ({why})"),
    };
    let detail = match error.detail {
        Some(ref d) => format!("{d}; {holders}"),
        None => holders,
    };
    error.with_detail(detail)
}

/// What a reset comes to, from the reset itself and from initializing NVML again after
/// it: the reset's error first (noting a failed re-initialization in its detail), else the
/// re-initialization's, which says that the reset ran and that the next call retries.
pub(super) fn reset_outcome(
    reset: Result<(), GpuError>,
    reopened: Result<(), GpuError>,
) -> Result<(), GpuError> {
    const RETRY: &str = "the next NVML call tries again";
    match (reset, reopened) {
        (Ok(()), Ok(())) => Ok(()),
        (Err(error), Ok(())) => Err(error),
        (Ok(()), Err(init)) => Err(with_context(
            init,
            format!("the GPU was reset but NVML could not be initialized again ({RETRY})"),
        )),
        (Err(error), Err(init)) => {
            let init = init.detail.unwrap_or_else(|| init.code.nvml_text().to_owned());
            let note = format!("NVML could not be initialized again after it ({RETRY}): {init}");
            let detail = match error.detail {
                Some(ref d) => format!("{d}; {note}"),
                None => note,
            };
            Err(error.with_detail(detail))
        }
    }
}

/// Reads the session slot, whatever a panicking holder of the lock left: the slot only
/// ever holds a working session or `None`, never a half-changed one.
pub(super) fn read_slot<S>(slot: &RwLock<Option<S>>) -> RwLockReadGuard<'_, Option<S>> {
    slot.read().unwrap_or_else(PoisonError::into_inner)
}

/// Writes the session slot; see [`read_slot`] about poisoning.
pub(super) fn write_slot<S>(slot: &RwLock<Option<S>>) -> RwLockWriteGuard<'_, Option<S>> {
    slot.write().unwrap_or_else(PoisonError::into_inner)
}

/// Runs `f` on the session in `slot` under the read lock. When the slot is empty, takes
/// the write lock instead, opens a session with `init` (unless another thread did it in
/// the meantime) and runs `f` on it there; an `init` error leaves the slot empty and is
/// returned.
pub(super) fn with_slot<S, T, E>(
    slot: &RwLock<Option<S>>,
    init: impl FnOnce() -> Result<S, E>,
    f: impl FnOnce(&S) -> Result<T, E>,
) -> Result<T, E> {
    {
        let session = read_slot(slot);
        if let Some(session) = session.as_ref() {
            return f(session);
        }
    }
    // Rare (a reset's re-initialization failed): running `f` under the write lock is fine.
    let mut session = write_slot(slot);
    let opened = match session.take() {
        Some(opened) => opened,
        None => init()?,
    };
    f(session.insert(opened))
}

/// Runs `run` with the session in `slot` closed: under the write lock, so that no call
/// uses the session meanwhile, drops the session (if any), runs `run`, then opens a new
/// one with `reinit` and puts it in the slot. Returns what `run` returned and whether
/// `reinit` succeeded; on its failure the slot is left empty, for [`with_slot`] to fill.
pub(super) fn around_reset<S, E, R>(
    slot: &RwLock<Option<S>>,
    reinit: impl FnOnce() -> Result<S, E>,
    run: impl FnOnce() -> R,
) -> (R, Result<(), E>) {
    let mut session = write_slot(slot);
    drop(session.take());
    let ran = run();
    let reopened = reinit().map(|opened| *session = Some(opened));
    (ran, reopened)
}

/// Runs `<nvidia_smi> --gpu-reset -i <gpu>` with stdin closed, killing it past
/// `timeout`. The error's code comes from [`classify_reset`]; its detail names the
/// command and nvidia-smi's most relevant output line (not what holds the GPU).
pub(super) fn run_nvidia_smi_reset(
    nvidia_smi: &Path,
    gpu: u32,
    timeout: Duration,
) -> Result<(), GpuError> {
    let call = Operation::ResetGpu.as_str();
    let error = |code| GpuError::new(call, Some(gpu), code);
    let shown = format!("{} --gpu-reset -i {gpu}", nvidia_smi.display());
    let command = Command::new(nvidia_smi, timeout).args(["--gpu-reset", "-i", &gpu.to_string()]);
    let finished = match command.run() {
        Ok(finished) => finished,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let on_path =
                if nvidia_smi.components().count() == 1 { " (searched PATH)" } else { "" };
            return Err(error(ErrorCode::NotFound).with_detail(format!(
                "nvidia-smi not found at {}{on_path}",
                nvidia_smi.display()
            )));
        }
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            return Err(
                error(ErrorCode::NoPermission).with_detail(format!("cannot run {shown}: {e}"))
            );
        }
        Err(e) => {
            return Err(error(ErrorCode::Unknown).with_detail(format!("cannot run {shown}: {e}")));
        }
    };
    let Some(status) = finished.status else {
        return Err(error(ErrorCode::Unknown).with_detail(format!(
            "{shown} did not finish within {} s and was killed",
            timeout.as_secs_f64()
        )));
    };
    let output = format!("{}{}", finished.stdout_text(), finished.stderr_text());
    match classify_reset(status.code(), &output) {
        Ok(()) => Ok(()),
        Err((code, line)) => {
            let how = match status.code() {
                Some(c) => format!("exited with status {c}"),
                None => "was killed by a signal".to_owned(),
            };
            let detail = match line {
                Some(line) => format!("{shown} {how}: {line}"),
                None => format!("{shown} {how}"),
            };
            Err(error(code).with_detail(detail))
        }
    }
}

/// What [`classify_reset`] made of a reset: `Ok`, or the code and the telling line.
type ResetVerdict<'a> = Result<(), (ErrorCode, Option<&'a str>)>;

/// What `nvidia-smi --gpu-reset` meant, from its exit code (`None`: killed by a signal)
/// and its stdout and stderr: `Ok` on exit 0, else the agent's code and the output
/// line that says why (the first non-empty one when none stands out).
///
/// In-use wording wins (nvidia-smi exits 255 for it), then permission wording, then
/// nvidia-smi's documented exit codes; anything else is [`ErrorCode::Unknown`].
fn classify_reset(exit_code: Option<i32>, output: &str) -> ResetVerdict<'_> {
    if exit_code == Some(0) {
        return Ok(());
    }
    let lines = || output.lines().map(str::trim).filter(|l| !l.is_empty());
    let in_use = |l: &str| {
        let l = l.to_lowercase();
        ["in use", "being used by", "processes using"].iter().any(|k| l.contains(k))
    };
    let no_permission = |l: &str| {
        let l = l.to_lowercase();
        [
            "insufficient permission",
            "permission denied",
            "not permitted",
            "must be root",
            "requires root",
            "require root",
            "as root",
            "only root",
            "root user",
            "root privilege",
            "root access",
        ]
        .iter()
        .any(|k| l.contains(k))
    };
    if let Some(line) = lines().find(|l| in_use(l)) {
        return Err((ErrorCode::InUse, Some(line)));
    }
    if let Some(line) = lines().find(|l| no_permission(l)) {
        return Err((ErrorCode::NoPermission, Some(line)));
    }
    // nvidia-smi(1), RETURN VALUE.
    let code = match exit_code {
        Some(2) => ErrorCode::InvalidArgument,
        Some(3) => ErrorCode::NotSupported,
        Some(4) => ErrorCode::NoPermission,
        Some(9 | 12) => ErrorCode::DriverNotLoaded,
        Some(15) => ErrorCode::GpuLost,
        _ => ErrorCode::Unknown,
    };
    Err((code, lines().next()))
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::path::PathBuf;
    use std::sync::{Arc, Mutex};
    use std::thread;
    use std::time::Instant;

    use nvml_wrapper::error::NvmlError;

    use super::*;
    use crate::gpu::nvml::errors::wrapper_error;

    #[test]
    fn nvidia_smi_reset_outputs_are_classified() {
        let in_use_list = "The following GPUs could not be reset:\n  \
            GPU 00000000:1A:00.0: In use by another client\n\n\
            1 device is currently being used by one or more other processes (e.g., Fabric \
            Manager, CUDA application, graphics application such as an X server, or a \
            monitoring application such as another instance of nvidia-smi). Please first kill \
            all processes using this device and all compute applications running in the system.\n";
        let in_use_single = "GPU 00000000:C1:00.0 is currently in use by another process.\n\n\
            1 device is currently being used by one or more other processes.\n";
        let cases: [(Option<i32>, &str, ResetVerdict<'_>); 14] = [
            (Some(0), "GPU 00000000:1A:00.0 was successfully reset.\nAll done.\n", Ok(())),
            (Some(0), "", Ok(())),
            (
                Some(255),
                in_use_list,
                Err((ErrorCode::InUse, Some("GPU 00000000:1A:00.0: In use by another client"))),
            ),
            (
                Some(255),
                in_use_single,
                Err((
                    ErrorCode::InUse,
                    Some("GPU 00000000:C1:00.0 is currently in use by another process."),
                )),
            ),
            (
                Some(4),
                "Unable to reset GPU 00000000:1A:00.0: Insufficient Permissions\n",
                Err((
                    ErrorCode::NoPermission,
                    Some("Unable to reset GPU 00000000:1A:00.0: Insufficient Permissions"),
                )),
            ),
            (
                Some(255),
                "\n  Only root users can reset GPUs.  \n",
                Err((ErrorCode::NoPermission, Some("Only root users can reset GPUs."))),
            ),
            (Some(4), "", Err((ErrorCode::NoPermission, None))),
            (
                Some(3),
                "Resetting GPU 00000000:1A:00.0 is not supported.\n",
                Err((
                    ErrorCode::NotSupported,
                    Some("Resetting GPU 00000000:1A:00.0 is not supported."),
                )),
            ),
            (
                Some(9),
                "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n",
                Err((
                    ErrorCode::DriverNotLoaded,
                    Some(
                        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
                    ),
                )),
            ),
            (Some(15), "GPU is lost\n", Err((ErrorCode::GpuLost, Some("GPU is lost")))),
            (
                Some(2),
                "Invalid combination of input arguments.\n",
                Err((ErrorCode::InvalidArgument, Some("Invalid combination of input arguments."))),
            ),
            // "root" outside a permission phrase is not about permissions.
            (
                Some(255),
                "\nPCIe root port error on GPU 00000000:1A:00.0\nmore\n",
                Err((ErrorCode::Unknown, Some("PCIe root port error on GPU 00000000:1A:00.0"))),
            ),
            (Some(1), "", Err((ErrorCode::Unknown, None))),
            // Killed by a signal.
            (None, "partial\n", Err((ErrorCode::Unknown, Some("partial")))),
        ];
        for (exit, output, expected) in cases {
            assert_eq!(classify_reset(exit, output), expected, "{exit:?} {output:?}");
        }
    }

    #[test]
    fn a_missing_nvidia_smi_is_not_found() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("bin/nvidia-smi");
        let e = run_nvidia_smi_reset(&path, 2, Duration::from_secs(5)).unwrap_err();
        assert_eq!(e.code, ErrorCode::NotFound);
        assert_eq!(e.call, "reset_gpu");
        assert_eq!(e.gpu, Some(2));
        assert_eq!(
            e.detail.as_deref(),
            Some(format!("nvidia-smi not found at {}", path.display()).as_str())
        );
        let e = run_nvidia_smi_reset(
            Path::new("gpushare-test-no-such-nvidia-smi"),
            0,
            Duration::from_secs(5),
        )
        .unwrap_err();
        assert_eq!(e.code, ErrorCode::NotFound);
        assert_eq!(
            e.detail.as_deref(),
            Some("nvidia-smi not found at gpushare-test-no-such-nvidia-smi (searched PATH)")
        );
    }

    /// Writes an executable `nvidia-smi` shell script into `dir`.
    fn fake_nvidia_smi(dir: &Path, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join("nvidia-smi");
        fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    /// `run_nvidia_smi_reset`, retried while another test's fork still holds the fresh
    /// script open for writing (ETXTBSY).
    fn reset_with(nvidia_smi: &Path, gpu: u32, timeout: Duration) -> Result<(), GpuError> {
        let mut attempt = 0;
        loop {
            let result = run_nvidia_smi_reset(nvidia_smi, gpu, timeout);
            match &result {
                Err(e)
                    if attempt < 20 && e.detail.as_deref().is_some_and(|d| d.contains("busy")) =>
                {
                    attempt += 1;
                    thread::sleep(Duration::from_millis(50));
                }
                _ => return result,
            }
        }
    }

    #[test]
    fn a_fake_nvidia_smi_is_run_with_the_reset_arguments() {
        let tmp = tempfile::tempdir().unwrap();
        let ok = fake_nvidia_smi(
            tmp.path(),
            r#"[ "$*" = "--gpu-reset -i 2" ] || { echo "wrong arguments: $*"; exit 7; }
echo "GPU 00000000:1A:00.0 was successfully reset.""#,
        );
        assert_eq!(reset_with(&ok, 2, Duration::from_secs(30)), Ok(()));
        let e = reset_with(&ok, 3, Duration::from_secs(30)).unwrap_err();
        assert_eq!(e.code, ErrorCode::Unknown);
        assert_eq!(
            e.detail.unwrap(),
            format!(
                "{} --gpu-reset -i 3 exited with status 7: wrong arguments: --gpu-reset -i 3",
                ok.display()
            )
        );

        let tmp = tempfile::tempdir().unwrap();
        let in_use = fake_nvidia_smi(
            tmp.path(),
            r#"echo "The following GPUs could not be reset:"
echo "  GPU 00000000:1A:00.0: In use by another client" >&2
exit 255"#,
        );
        let e = reset_with(&in_use, 0, Duration::from_secs(30)).unwrap_err();
        assert_eq!((e.call.as_str(), e.gpu, e.code), ("reset_gpu", Some(0), ErrorCode::InUse));
        assert_eq!(
            e.detail.unwrap(),
            format!(
                "{} --gpu-reset -i 0 exited with status 255: GPU 00000000:1A:00.0: In use by another client",
                in_use.display()
            )
        );

        let tmp = tempfile::tempdir().unwrap();
        let hangs = fake_nvidia_smi(tmp.path(), "exec sleep 30");
        let started = Instant::now();
        let e = reset_with(&hangs, 0, Duration::from_millis(200)).unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(10));
        assert_eq!(e.code, ErrorCode::Unknown);
        assert_eq!(
            e.detail.unwrap(),
            format!(
                "{} --gpu-reset -i 0 did not finish within 0.2 s and was killed",
                hangs.display()
            )
        );
    }

    /// A stand-in for the NVML session that writes its opening and closing to a log.
    struct Probe {
        name: &'static str,
        log: Arc<Mutex<Vec<String>>>,
    }

    impl Probe {
        fn open(name: &'static str, log: &Arc<Mutex<Vec<String>>>) -> Self {
            log.lock().unwrap().push(format!("open {name}"));
            Probe { name, log: Arc::clone(log) }
        }
    }

    impl Drop for Probe {
        fn drop(&mut self) {
            self.log.lock().unwrap().push(format!("close {}", self.name));
        }
    }

    fn take_log(log: &Arc<Mutex<Vec<String>>>) -> Vec<String> {
        std::mem::take(&mut *log.lock().unwrap())
    }

    #[test]
    fn the_session_is_closed_while_a_reset_runs_and_opened_again() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let slot = RwLock::new(Some(Probe::open("first", &log)));
        let (ran, reopened) = around_reset(
            &slot,
            || Ok::<_, String>(Probe::open("second", &log)),
            || {
                // Closed before the reset runs, and every other call waits meanwhile.
                log.lock().unwrap().push("reset".to_owned());
                assert!(slot.try_read().is_err());
                "reset done"
            },
        );
        assert_eq!((ran, reopened), ("reset done", Ok(())));
        assert_eq!(take_log(&log), ["open first", "close first", "reset", "open second"]);
        assert_eq!(slot.read().unwrap().as_ref().map(|p| p.name), Some("second"));

        // A failed re-initialization leaves the slot empty; the reset's result still
        // comes back.
        let (ran, reopened) =
            around_reset(&slot, || Err::<Probe, _>("no driver"), || log.lock().unwrap().len());
        assert_eq!(ran, 1);
        assert_eq!(reopened.map(drop), Err("no driver"));
        assert_eq!(take_log(&log), ["close second"]);
        assert!(slot.read().unwrap().is_none());

        // From an empty slot: nothing to close.
        let (_, reopened) =
            around_reset(&slot, || Ok::<_, String>(Probe::open("third", &log)), || ());
        assert!(reopened.is_ok());
        assert_eq!(take_log(&log), ["open third"]);
    }

    #[test]
    fn an_empty_session_slot_is_filled_by_the_next_call() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let slot: RwLock<Option<Probe>> = RwLock::new(None);

        // The re-initialization fails again: the call fails with its error, never runs.
        let result: Result<(), String> =
            with_slot(&slot, || Err("no driver".to_owned()), |_| panic!("ran without a session"));
        assert_eq!(result, Err("no driver".to_owned()));
        assert!(slot.read().unwrap().is_none());

        let name = with_slot(&slot, || Ok(Probe::open("again", &log)), |p| Ok::<_, String>(p.name));
        assert_eq!(name, Ok("again"));
        assert_eq!(take_log(&log), ["open again"]);

        // An open session is used as it is.
        let name = with_slot(
            &slot,
            || -> Result<Probe, String> { panic!("initialized an open session") },
            |p| Ok(p.name),
        );
        assert_eq!(name, Ok("again"));
        let e = with_slot(&slot, || Ok(Probe::open("unused", &log)), |_| Err::<(), _>("failed"));
        assert_eq!(e, Err("failed"));
        assert!(take_log(&log).is_empty());
    }

    #[test]
    fn a_failed_reinitialization_after_a_reset_is_reported() {
        let reset_failed = || {
            Err(GpuError::new("reset_gpu", Some(1), ErrorCode::InUse)
                .with_detail("nvidia-smi --gpu-reset -i 1 exited with status 255: In use"))
        };
        let init_failed =
            || Err(wrapper_error("reset_gpu", Some(1), "nvmlInit_v2", NvmlError::DriverNotLoaded));
        assert_eq!(reset_outcome(Ok(()), Ok(())), Ok(()));
        assert_eq!(reset_outcome(reset_failed(), Ok(())), reset_failed());

        let e = reset_outcome(Ok(()), init_failed()).unwrap_err();
        assert_eq!(
            (e.call.as_str(), e.gpu, e.code),
            ("reset_gpu", Some(1), ErrorCode::DriverNotLoaded)
        );
        assert_eq!(
            e.detail.unwrap(),
            "the GPU was reset but NVML could not be initialized again (the next NVML call \
             tries again): nvmlInit_v2 returned NVML_ERROR_DRIVER_NOT_LOADED: is the nvidia \
             kernel module loaded?"
        );

        let e = reset_outcome(reset_failed(), init_failed()).unwrap_err();
        assert_eq!(e.code, ErrorCode::InUse);
        assert_eq!(
            e.detail.unwrap(),
            "nvidia-smi --gpu-reset -i 1 exited with status 255: In use; NVML could not be \
             initialized again after it (the next NVML call tries again): nvmlInit_v2 returned \
             NVML_ERROR_DRIVER_NOT_LOADED: is the nvidia kernel module loaded?"
        );
    }

    #[test]
    fn reset_failures_name_the_holders_unless_nvidia_smi_is_missing() {
        let missing = GpuError::new("reset_gpu", Some(0), ErrorCode::NotFound)
            .with_detail("nvidia-smi not found at nvidia-smi (searched PATH)");
        assert_eq!(with_holders(missing.clone(), &Ok("/dev/nvidia0".to_owned())), missing);
        let unsupported = GpuError::new("reset_gpu", Some(0), ErrorCode::NotSupported)
            .with_detail("Resetting GPU 00000000:00:03.0 is not supported.");
        assert_eq!(with_holders(unsupported.clone(), &Ok("/dev/nvidia0".to_owned())), unsupported);

        let file = tempfile::NamedTempFile::new().unwrap();
        let path = file.path().to_str().unwrap().to_owned();
        let e = with_holders(
            GpuError::new("reset_gpu", Some(0), ErrorCode::InUse).with_detail("in use"),
            &Ok(path.clone()),
        );
        // The test process holds the file but is the agent here: left out.
        assert_eq!(e.detail.unwrap(), format!("in use; no other process has {path} open"));
        let e = with_holders(
            GpuError::new("reset_gpu", Some(0), ErrorCode::Unknown),
            &Err("no minor".to_owned()),
        );
        assert_eq!(e.detail.unwrap(), "cannot tell what holds the GPU: no device node (no minor)");
    }
}
