//! Issue 41 on a real Slurm: `gpushare-ctl clients` names a Slurm job as the unit of its
//! processes. A private Slurm 22.05 cluster (`tests/support/slurm.rs`, `proctrack/linuxproc`:
//! the job's processes stay in slurmd's cgroup) runs a batch job whose script and whose
//! `srun` step are GPU clients of the simulated driver (`GPUSHARE_SIM_PROCESSES`): both are
//! shown with the unit `slurm-job-<id>`, the id sbatch gave. A client whose parent an
//! unprivileged user named `slurmstepd: [99.0]` (comm and command line alike) is no job's.

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use gpushare_proto::clients::ClientTable;
use gpushare_tests::slurm::{Setup, Slurm};
use gpushare_tests::{Agent, AgentOptions, OTHER, as_user};

/// How long a job may take to start its processes before the test gives up (a hang, not a
/// timing).
const PATIENCE: Duration = Duration::from_secs(60);

/// The PID written in `file`, once something has written it whole.
fn pid_in(file: &Path, slurm: &Slurm) -> u32 {
    let started = Instant::now();
    loop {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        if let Some(pid) = text.strip_suffix('\n').and_then(|t| t.parse().ok()) {
            return pid;
        }
        assert!(started.elapsed() < PATIENCE, "no PID in {}: {}", file.display(), slurm.logs());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The one child of `parent`, once it has one.
fn child_of(parent: u32) -> u32 {
    let started = Instant::now();
    loop {
        let children = std::fs::read_to_string(format!("/proc/{parent}/task/{parent}/children"))
            .unwrap_or_default();
        if let Some(pid) = children.split_whitespace().next().and_then(|p| p.parse().ok()) {
            return pid;
        }
        assert!(started.elapsed() < PATIENCE, "process {parent} started no child");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A shell run by an unprivileged user under the name `slurmstepd` (a link of that name,
/// so that its comm is `slurmstepd`) with the command line `slurmstepd: [99.0]`, and the
/// `sleep` it runs; both killed and reaped on drop.
struct FakeStepd {
    shell: Child,
    sleep: u32,
}

impl FakeStepd {
    fn start(dir: &Path) -> FakeStepd {
        let link = dir.join("slurmstepd");
        std::os::unix::fs::symlink("/bin/sh", &link).expect("symlink");
        let script =
            format!("exec -a 'slurmstepd: [99.0]' {} -c 'sleep 600; exit 0'", link.display());
        let shell = as_user(OTHER)
            .args(["bash", "-c", &script])
            .stdin(Stdio::null())
            .spawn()
            .expect("bash as the other user");
        let sleep = child_of(shell.id());
        FakeStepd { shell, sleep }
    }
}

impl Drop for FakeStepd {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.sleep as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = self.shell.kill();
        let _ = self.shell.wait();
    }
}

#[test]
fn a_slurm_jobs_gpu_clients_have_the_job_as_their_unit_and_a_fake_stepd_none() {
    if !Slurm::available() {
        return;
    }
    gpushare_tests::ensure_users();
    let dir = tempfile::tempdir().unwrap();
    // The other user runs the fake from here.
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .unwrap();
    let Some(slurm) = Slurm::start(&Setup::default()) else { return };
    let (batch_file, step_file) = (dir.path().join("batch.pid"), dir.path().join("step.pid"));
    // The batch script's own process (step `batch`) and an srun step's (step 0), each a
    // `sleep` in place of the shell that wrote its PID.
    let script = format!(
        "srun --overlap -n1 sh -c 'echo $$ > {step}.new; mv {step}.new {step}; exec sleep 600' &\n\
         echo $$ > {batch}.new; mv {batch}.new {batch}; exec sleep 600",
        step = step_file.display(),
        batch = batch_file.display(),
    );
    let job = slurm.sbatch(&["--wrap", &script]);
    assert!(!job.is_empty() && job.bytes().all(|b| b.is_ascii_digit()), "job id {job:?}");
    let (batch, step) = (pid_in(&batch_file, &slurm), pid_in(&step_file, &slurm));
    let fake = FakeStepd::start(dir.path());

    let mut agent = Agent::start(AgentOptions::simulate("h100-80gb:1"));
    let processes = format!("0:{batch}=1GiB,0:{step}=1GiB,0:{}=1GiB", fake.sleep);
    agent.restart_with_env(&[("GPUSHARE_SIM_PROCESSES", &processes)]);
    let table: ClientTable = agent.ctl_doc(&["clients"]);
    let unit = |pid: u32| {
        let c = table.clients.iter().find(|c| c.pid == pid);
        c.unwrap_or_else(|| panic!("no client {pid} in {table:#?}")).unit.clone()
    };
    let ps = || {
        let out = std::process::Command::new("ps").args(["-eo", "pid,ppid,user,args"]).output();
        out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default()
    };
    let want = Some(format!("slurm-job-{job}"));
    assert_eq!(unit(batch), want, "the batch script's process\n{}", ps());
    assert_eq!(unit(step), want, "the srun step's process\n{}", ps());
    let faked = unit(fake.sleep);
    assert!(
        !faked.as_deref().is_some_and(|u| u.starts_with("slurm-job")),
        "a user's fake slurmstepd made {faked:?}\n{}",
        ps()
    );
}
