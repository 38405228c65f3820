//! What names a Slurm job among a host's processes (issue 41): the command line Slurm
//! gives the `slurmstepd` that runs each job step (`slurmstepd: [12.0]`), the cgroup path
//! of a job under `proctrack/cgroup` (`…/slurmstepd.scope/job_12/…` on cgroup v2,
//! `/slurm/uid_1000/job_12/…` on v1), and the unit a job's processes are shown in
//! (`slurm-job-12`). Texts only: which process or cgroup name to believe is
//! [`super::procfs`]'s to decide (a root-owned ancestor, a cgroup name root gave).

/// The command name (`comm`) of Slurm's step daemon.
pub const COMM: &str = "slurmstepd";

/// The unit shown for the processes of Slurm job `job`.
pub fn unit(job: u32) -> String {
    format!("slurm-job-{job}")
}

/// The job of a `slurmstepd` whose first argument is `argument` (Slurm rewrites it to
/// `slurmstepd: [JOB.STEP]`, STEP a number, a number `+` a heterogeneous component, or
/// `batch`, `extern`, `interactive`, `TBD`); `None` for anything else: another form, a job
/// id that is no canonical number of Slurm's 32 bits, a step daemon not yet named.
pub fn job_of_command_line(argument: &str) -> Option<u32> {
    let inner = argument.strip_prefix("slurmstepd: [")?.strip_suffix(']')?;
    let (job, step) = inner.split_once('.')?;
    let step_ok = match step.split_once('+') {
        Some((step, component)) => number(step).is_some() && number(component).is_some(),
        None => number(step).is_some() || ["batch", "extern", "interactive", "TBD"].contains(&step),
    };
    step_ok.then(|| number(job)).flatten().filter(|&j| j != 0)
}

/// The job of a cgroup path's components (those root named, outermost first): a
/// `job_<id>` directly below Slurm's step scope (`slurmstepd.scope`, or
/// `<node>_slurmstepd.scope` with several slurmd on one host: cgroup v2) or below
/// `slurm[_<node>]/uid_<uid>` (cgroup v1).
pub fn job_of_cgroup(components: &[String]) -> Option<u32> {
    components.iter().enumerate().find_map(|(i, c)| {
        let job = number(c.strip_prefix("job_")?)?;
        let parent = components.get(i.checked_sub(1)?)?;
        let v2 = parent == "slurmstepd.scope" || parent.ends_with("_slurmstepd.scope");
        let v1 = parent.strip_prefix("uid_").and_then(number).is_some()
            && components
                .get(i.checked_sub(2)?)
                .is_some_and(|s| s == "slurm" || s.starts_with("slurm_"));
        (v2 || v1).then_some(job).filter(|&j| j != 0)
    })
}

/// `text` as a number Slurm prints (`%u`): ASCII digits, no sign or leading zero, 32 bits.
fn number(text: &str) -> Option<u32> {
    let canonical = !text.is_empty()
        && text.bytes().all(|b| b.is_ascii_digit())
        && (text == "0" || !text.starts_with('0'));
    canonical.then(|| text.parse().ok()).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_daemons_name_their_job() {
        for (argument, job) in [
            ("slurmstepd: [12.0]", Some(12)),
            ("slurmstepd: [12.batch]", Some(12)),
            ("slurmstepd: [12.extern]", Some(12)),
            ("slurmstepd: [12.interactive]", Some(12)),
            ("slurmstepd: [12.TBD]", Some(12)),
            ("slurmstepd: [7.3+1]", Some(7)),
            ("slurmstepd: [4294967295.0]", Some(u32::MAX)),
            // Not a step daemon's title: what runs before Slurm renames it, or junk.
            ("/usr/sbin/slurmstepd", None),
            ("slurmstepd", None),
            ("slurmstepd: [12]", None),
            ("slurmstepd: [12.]", None),
            ("slurmstepd: [.0]", None),
            ("slurmstepd: [12.0] ", None),
            ("slurmstepd: [12.0]x", None),
            ("slurmstepd:  [12.0]", None),
            ("slurmstepd: [12.Batch]", None),
            ("slurmstepd: [12.0+]", None),
            ("slurmstepd: [12.0.1]", None),
            ("slurmstepd: [+12.0]", None),
            ("slurmstepd: [-12.0]", None),
            ("slurmstepd: [012.0]", None),
            ("slurmstepd: [0.0]", None),
            ("slurmstepd: [１２.0]", None),
            ("slurmstepd: [4294967296.0]", None),
            ("slurmstepd: [99999999999999999999999999.0]", None),
            ("slurmstepd: [12.99999999999999999999]", None),
            ("xslurmstepd: [12.0]", None),
            ("", None),
        ] {
            assert_eq!(job_of_command_line(argument), job, "{argument:?}");
        }
        assert_eq!(unit(12), "slurm-job-12");
    }

    #[test]
    fn slurms_cgroups_name_their_job() {
        let path = |p: &str| -> Vec<String> {
            p.split('/').filter(|c| !c.is_empty()).map(String::from).collect()
        };
        for (cgroup, job) in [
            ("/system.slice/slurmstepd.scope/job_12/step_0/user/task_0", Some(12)),
            ("/system.slice/slurmstepd.scope/job_12/step_batch/user/task_0", Some(12)),
            ("/system.slice/slurmstepd.scope/job_12", Some(12)),
            ("/system.slice/node1_slurmstepd.scope/job_3/step_extern/user", Some(3)),
            ("/slurm/uid_1000/job_12/step_0/task_0", Some(12)),
            ("/slurm_node1/uid_0/job_5/step_batch", Some(5)),
            // Slurm's scope without a job (slurmstepd itself), or others' names.
            ("/system.slice/slurmstepd.scope/system", None),
            ("/system.slice/slurmd.service", None),
            ("/system.slice/job_12", None),
            ("/job_12", None),
            ("/user.slice/uid_1000/job_12", None),
            ("/system.slice/slurmstepd.scope/job_x", None),
            ("/system.slice/slurmstepd.scope/job_012", None),
            ("/system.slice/slurmstepd.scope/job_99999999999", None),
            ("/slurm/uid_x/job_12", None),
            ("/system.slice/slurmstepd.scope/step_0/job_12", None),
            ("", None),
        ] {
            assert_eq!(job_of_cgroup(&path(cgroup)), job, "{cgroup}");
        }
    }
}
