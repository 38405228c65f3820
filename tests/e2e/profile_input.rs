//! Profile documents as a hostile operator writes them, through `gpushare-ctl` and the
//! agent: every one refused with one line naming the place, quickly, changing nothing.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use gpushare_tests::{
    Agent, AgentOptions, ctl_error, reason_lines, stderr, stdout, temp_file, text,
};
use nix::sys::resource::{Resource, setrlimit};

/// Runs `cmd` with `input` on stdin, within `limit` and 2 GiB of address space (a ctl
/// that reads without bound fails here instead of taking the machine's memory).
fn run_bounded(mut cmd: Command, input: &[u8], limit: Duration) -> Output {
    // SAFETY: between fork and exec the closure only calls setrlimit, which is
    // async-signal-safe (nix's wrapper is the bare system call on a value on the stack).
    unsafe {
        cmd.pre_exec(|| {
            setrlimit(Resource::RLIMIT_AS, 2 << 30, 2 << 30)?;
            Ok(())
        });
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("gpushare-ctl runs");
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_vec();
    // A ctl that stops reading early closes the pipe: the writer's error is expected.
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            child.kill().unwrap();
            panic!("gpushare-ctl {:?} ran past {limit:?}", cmd.get_args().collect::<Vec<_>>());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    writer.join().unwrap();
    child.wait_with_output().unwrap()
}

/// Asserts a failure of one line, `gpushare-ctl: …` ending in `reason`.
fn assert_one_line_refusal(out: &Output, reason: &str) {
    assert!(!out.status.success(), "{}", text(out));
    let err = stderr(out);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert_eq!(reason_lines(&err), 1, "{err}");
    assert!(err.trim().ends_with(reason), "{err}");
}

#[test]
fn endless_and_oversized_documents_are_refused_at_once_in_one_line() {
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:2"));
    let before = agent.status();
    let limit = Duration::from_secs(20);
    let too_large = "larger than 256 KiB, the most a profile may be";

    for args in [
        &["validate", "/dev/zero"][..],
        &["apply", "-f", "/dev/zero"],
        &["plan", "-f", "/dev/zero"],
        &["assert", "-f", "/dev/zero", "-c", "all-balanced"],
    ] {
        let out = run_bounded(agent.ctl_command(args), b"", limit);
        assert_one_line_refusal(&out, &format!("/dev/zero: {too_large}"));
    }

    // A regular file and standard input one byte over the limit; at the limit, the agent
    // reads the profile.
    let mut at_limit = b"[[gpu]]\nselect = \"all\"\n".to_vec();
    at_limit.resize(256 * 1024, b'#');
    let (_dir, file) = temp_file("at-limit.toml", &at_limit);
    let out = run_bounded(agent.ctl_command(&["validate", file.to_str().unwrap()]), b"", limit);
    assert!(out.status.success(), "{}", text(&out));
    let mut over = at_limit.clone();
    over.push(b'#');
    let (_dir, file) = temp_file("over.toml", &over);
    let path = file.to_str().unwrap();
    let out = run_bounded(agent.ctl_command(&["validate", path]), b"", limit);
    assert_one_line_refusal(&out, &format!("{path}: {too_large}"));
    let out = run_bounded(agent.ctl_command(&["apply", "-f", "-"]), &over, limit);
    assert_one_line_refusal(&out, &format!("<stdin>: {too_large}"));
    let out = run_bounded(agent.ctl_command(&["apply", "-f", "-", "--json"]), &over, limit);
    assert!(!out.status.success());
    assert_eq!(ctl_error(&out).message, format!("<stdin>: {too_large}"));

    assert_eq!(agent.status(), before, "the GPUs must be unchanged");
}

#[test]
fn time_slicing_on_a_mig_gpu_is_refused_not_dropped() {
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:2"));
    let before = agent.status();
    let why = "time-slicing needs MIG off: the time-slice interval is the whole GPU's, and MIG \
               instances do not have one; share them with mps, or write mig = \"disabled\"";
    let whole = "[[gpu]]\nselect = 0\nmig = { \"3g\" = 2 }\n\
                 sharing = { time-slicing = { interval = \"long\" } }\n";
    let per_instance = "[[gpu]]\nselect = \"all\"\nmig = { \"1g\" = 2, \"3g\" = 1 }\n\
                        instance_sharing.\"1g\" = { time-slicing = {} }\n";
    for (name, profile, place) in [("whole", whole, "4:11"), ("each", per_instance, "4:25")] {
        let (_dir, file) = temp_file(&format!("{name}.toml"), profile);
        let path = file.to_str().unwrap();
        for verb in ["validate", "apply"] {
            let args: &[&str] = if verb == "apply" { &[verb, "-f", path] } else { &[verb, path] };
            let out = agent.ctl(args);
            assert_one_line_refusal(&out, &format!("{path}:{place}: {why}"));
        }
    }
    assert_eq!(agent.status(), before, "the GPUs must be unchanged");
}

#[test]
fn a_nameless_profile_from_stdin_is_named_stdin() {
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:2"));
    let profile = b"[[gpu]]\nselect=\"all\"\nmig = { \"7g\" = 1 }\n";
    let limit = Duration::from_secs(60);
    let out = run_bounded(agent.ctl_command(&["validate", "-"]), profile, limit);
    assert!(out.status.success(), "{}", text(&out));
    assert!(stdout(&out).starts_with("<stdin>: valid profile stdin\n"), "{}", text(&out));
    let out = run_bounded(agent.ctl_command(&["apply", "-f", "-"]), profile, limit);
    assert!(out.status.success(), "{}", text(&out));
    let status = agent.status();
    assert_eq!(status.active_profile.as_deref(), Some("stdin"));
    assert!(status.gpus.iter().all(|g| g.mig_enabled), "{status:?}");

    // A name that is written must be valid as written.
    let named = b"name = \"Lab Split\"\n[[gpu]]\nselect=\"all\"\n";
    let out = run_bounded(agent.ctl_command(&["apply", "-f", "-"]), named, limit);
    assert_one_line_refusal(
        &out,
        "<stdin>:1:8: invalid profile name \"Lab Split\": use 1-64 characters of a-z, 0-9, '.', \
         '_' and '-', starting with a letter or digit",
    );
    assert_eq!(agent.status(), status);
}

#[test]
fn profile_errors_speak_the_profiles_words_across_the_bus() {
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:2"));
    let before = agent.status();
    let rule = |body: &str| format!("[[gpu]]\nselect = 0\n{body}\n");
    let cases = [
        (
            "mixed.toml",
            rule("sharing = { mps = {}, time-slicing = {} }"),
            "3:11: MPS and time-slicing cannot be mixed on one GPU (MPS needs compute mode \
             EXCLUSIVE_PROCESS, time-slicing DEFAULT)",
        ),
        (
            "huge.toml",
            rule("mig = { \"1g\" = 99999999999999999999 }"),
            "3:7: mig: the count of 1g must be a whole number from 0 to 8, not \
             99999999999999999999",
        ),
        (
            "typo.toml",
            rule("sharing = { mps = { replica = 4 } }"),
            "3:21: unknown key `replica` in the mps settings: use `replicas`, \
             `active_thread_percentage`, `pinned_memory_limit`, `max_clients` or `multi_user`",
        ),
        (
            "two.yaml",
            "version: v1\nmig-configs:\n  c:\n    - devices: all\n      mig-enabled: false\n\
             ---\nversion: v1\n"
                .to_string(),
            "7:1: a second YAML document starts here: a mig-parted file is one document",
        ),
        (
            "yes.yaml",
            "version: v1\nmig-configs:\n  c:\n    - devices: all\n      mig-enabled: \"yes\"\n\
             \x20     mig-devices: {}\n"
                .to_string(),
            "5:20: mig-enabled: expected true or false, found \"yes\"",
        ),
    ];
    for (name, text, reason) in &cases {
        let (_dir, file) = temp_file(name, text);
        let path = file.to_str().unwrap();
        let args: &[&str] = if name.ends_with(".yaml") {
            &["apply", "-f", path, "-c", "c"]
        } else {
            &["apply", "-f", path]
        };
        assert_one_line_refusal(&agent.ctl(args), &format!("{path}:{reason}"));
        let mut json = args.to_vec();
        json.push("--json");
        let error = ctl_error(&agent.ctl(&json));
        assert_eq!(error.name, "io.gpushare.Agent1.Error.InvalidProfile");
        assert_eq!(error.message, format!("{path}:{reason}"));
    }
    // A strategy's bare name is the strategy with its defaults.
    let out = run_bounded(
        agent.ctl_command(&["plan", "-f", "-"]),
        rule("sharing = \"mps\"").as_bytes(),
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(stdout(&out).contains("GPU 0: start an MPS server on the GPU"), "{}", text(&out));
    assert_eq!(agent.status(), before, "the GPUs must be unchanged");
}
