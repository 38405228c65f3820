//! `Telemetry` and `gpushare-ctl top`'s readings (issue 29) on a simulated H100: idle as
//! the real H100 answered (0 %, 35 °C, 73.6 W), rising with a client (a real `sleep` the
//! simulated driver lists, `GPUSHARE_SIM_PROCESSES`), and NVIDIA's own nvidia-ml-py reads
//! the same values from the same simulated driver as the agent.

use std::process::{Command, Stdio};

use gpushare_proto::telemetry::GpuTelemetryDoc;

use crate::clients_watch::watch_until;
use crate::nvidia_clients::pynvml_python;
use gpushare_tests::{Agent, AgentOptions, OTHER, directory_of, is_root, text};

/// The first frame `gpushare-ctl top ARGS` prints into a pipe (everything up to its first
/// blank line, or its first line with `--json`); then it is interrupted as Ctrl-C would.
fn first_frame(agent: &Agent, args: &[&str], json: bool) -> String {
    frame_of(agent.ctl_command(args), json)
}

/// The first frame `command` (a `gpushare-ctl top`) prints, as [`first_frame`].
fn frame_of(command: Command, json: bool) -> String {
    let end = if json { "\n" } else { "\n\n" };
    let (code, out) = watch_until(command, 1, |out| out.matches(end).count());
    assert_eq!(code, Some(0), "{out}");
    let frame = out.split(end).next().unwrap_or_default();
    assert!(!frame.is_empty() && out.contains(end), "a frame within 20 s: {out}");
    frame.to_owned()
}

/// GPU 0's readings in `top --json`'s first line.
fn readings(agent: &Agent) -> GpuTelemetryDoc {
    gpu0(&first_frame(agent, &["top", "--json", "--interval", "0.2"], true))
}

/// GPU 0's readings in a line of `top --json`.
fn gpu0(line: &str) -> GpuTelemetryDoc {
    let doc: serde_json::Value = serde_json::from_str(line).expect("one JSON document");
    assert!(doc["status"].is_object() && doc["clients"].is_object(), "{line}");
    serde_json::from_value(doc["telemetry"]["gpus"][0].clone()).expect("GPU 0's telemetry")
}

#[test]
fn top_shows_the_drivers_readings_and_they_rise_with_a_client() {
    let mut agent = Agent::start(AgentOptions::simulate("h100-80gb:1"));
    let idle = readings(&agent);
    assert_eq!(idle.utilization_percent, Some(0), "{idle:?}");
    assert_eq!(idle.memory_utilization_percent, Some(0), "{idle:?}");
    assert_eq!(idle.temperature_c, Some(35), "{idle:?}");
    assert_eq!(idle.power_watts, Some(73.6), "{idle:?}");
    assert_eq!(idle.memory_used_bytes, Some(0), "{idle:?}");
    assert_eq!(idle.memory_total_bytes, Some(81_559 << 20), "{idle:?}");

    let mut sleeper = Command::new("sleep").arg("600").stdin(Stdio::null()).spawn().unwrap();
    let pid = sleeper.id();
    agent.restart_with_env(&[("GPUSHARE_SIM_PROCESSES", &format!("0:{pid}"))]);
    let busy = readings(&agent);
    assert_eq!(busy.utilization_percent, Some(30), "{busy:?}");
    assert_eq!(busy.memory_utilization_percent, Some(10), "{busy:?}");
    assert_eq!(busy.temperature_c, Some(38), "{busy:?}");
    assert_eq!(busy.power_watts, Some(123.6), "{busy:?}");
    assert_eq!(busy.memory_used_bytes, Some(512 << 20), "{busy:?}");

    let view = first_frame(&agent, &["top", "--interval", "0.2"], false);
    assert!(
        view.contains("util 30 %  mem 0.5/80 GiB  38 C  124 W  processes hold 512 MiB  GPU-"),
        "{view}"
    );

    // NVIDIA's bindings read the same values from the same simulated driver.
    let found = Command::new("python3").args(["-c", "import pynvml"]).output();
    assert!(
        found.is_ok_and(|o| o.status.success()),
        "nvidia-ml-py: python3 -m pip install nvidia-ml-py==13.615.71 (.ci/run does)"
    );
    let script = "import ctypes, os, pynvml as nv\n\
                  nv.nvmlLib = ctypes.CDLL(os.environ['PYNVML_LIB'])\n\
                  nv.nvmlInit()\n\
                  g = nv.nvmlDeviceGetHandleByIndex(0)\n\
                  u = nv.nvmlDeviceGetUtilizationRates(g)\n\
                  m = nv.nvmlDeviceGetMemoryInfo(g, version=nv.nvmlMemory_v2)\n\
                  print(u.gpu, u.memory, m.used, m.total,\n\
                        nv.nvmlDeviceGetTemperature(g, nv.NVML_TEMPERATURE_GPU),\n\
                        nv.nvmlDeviceGetPowerUsage(g) / 1000)\n\
                  nv.nvmlShutdown()\n";
    let out =
        pynvml_python("h100-80gb:1", &agent.sim_state()).args(["-c", script]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let o = |v: Option<u64>| v.unwrap().to_string();
    let expected = format!(
        "{} {} {} {} {} {}\n",
        o(busy.utilization_percent.map(u64::from)),
        o(busy.memory_utilization_percent.map(u64::from)),
        o(busy.memory_used_bytes),
        o(busy.memory_total_bytes),
        o(busy.temperature_c.map(u64::from)),
        busy.power_watts.unwrap(),
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), expected);

    let _ = sleeper.kill();
    let _ = sleeper.wait();
}

/// On a MIG GPU the whole GPU keeps its temperature and power but has no utilisation (as
/// nvidia-smi shows `N/A` there), and each MIG device has its memory; a user outside the
/// group may ask (the bus policy).
#[test]
fn a_mig_gpu_reports_each_mig_devices_memory_and_anyone_may_ask() {
    let profile = "name = \"two\"\n[[gpu]]\nselect = 0\nmig = { \"1g\" = 2 }\n";
    let options = AgentOptions::simulate("h100-80gb:1").profile("two.toml", profile);
    let root = is_root();
    let agent = Agent::start(if root { options.for_other_users() } else { options });
    let out = agent.ctl(&["apply", "two"]);
    assert!(out.status.success(), "{}", text(&out));
    let gpu = readings(&agent);
    assert_eq!(
        (gpu.utilization_percent, gpu.temperature_c, gpu.power_watts),
        (None, Some(35), Some(73.6)),
        "{gpu:?}"
    );
    assert_eq!(gpu.mig_devices.len(), 2, "{gpu:?}");
    for mig in &gpu.mig_devices {
        assert!(mig.uuid.starts_with("MIG-"), "{mig:?}");
        assert_eq!(mig.memory_used_bytes, Some(0), "{mig:?}");
        assert!(mig.memory_total_bytes.is_some_and(|t| t > 9 << 30), "{mig:?}");
    }
    if !root {
        gpushare_tests::skip("the other user's part: needs root to create test users");
        return;
    }
    let home = directory_of(OTHER);
    let args = ["top", "--json", "--interval", "0.2"];
    let line = frame_of(agent.ctl_as(OTHER, None, home.path(), home.path(), &args), true);
    assert_eq!(gpu0(&line), gpu, "{line}");
}

/// Each reading stands alone: a power read the driver fails leaves that value `null` (`-`
/// in the view) and the others as they are.
#[test]
fn a_failed_read_is_a_missing_value_not_an_error() {
    let fail = "nvmlDeviceGetPowerUsage:1=NVML_ERROR_GPU_IS_LOST";
    let agent = Agent::start(AgentOptions::simulate("h100-80gb:1").env("GPUSHARE_SIM_FAIL", fail));
    let gpu = readings(&agent);
    assert_eq!(gpu.power_watts, None, "{gpu:?}");
    assert_eq!((gpu.utilization_percent, gpu.temperature_c), (Some(0), Some(35)), "{gpu:?}");
    // The next read answers again.
    assert_eq!(readings(&agent).power_watts, Some(73.6));
}
