//! One probe client: its own CUDA context in its own process (`gpushare-agent
//! --probe-client <JSON spec>`), one workload, one measurement window, one JSON report.

use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use cudarc::driver::sys::CUdevice_attribute as Attr;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg,
};

use super::kernels::{self, FMA_CHAINS};
use super::{Achieved, ClientResult, ClientSpec, DeviceInfo, Workload};
use crate::bench::stats::{percentile, sort_samples};

/// The `compute` workload's step length at the device's fp32 peak.
const COMPUTE_STEP_TARGET_S: f64 = 0.004;
/// Blocks of the `launch` kernel (4 rows each): measured on an H100, 64 gives a solo step
/// (launch + synchronize) of 0.042 ms, the reference's PyTorch 256x256 matmul step (0.040
/// ms); 256 gives 0.018 ms and 8 gives 0.23 ms. Half the SMs at most, so that the step is
/// latency-bound and concurrent clients can share the GPU, as small inference requests do.
const LAUNCH_BLOCKS: u32 = 64;
/// The `memory` workload copies this many bytes a step (and reads as many).
const MEMORY_STEP_BYTES: usize = 1 << 30;
/// Warm-up before the window: at least this long and this many steps.
const WARMUP: Duration = Duration::from_millis(100);
const WARMUP_MIN_STEPS: u32 = 3;

/// `--probe-client <JSON>`: runs the client and prints its [`ClientResult`] as one line
/// of JSON on stdout; on failure a one-line reason on stderr and a non-zero exit.
pub fn main(spec_json: &str) -> ExitCode {
    let result = serde_json::from_str::<ClientSpec>(spec_json)
        .map_err(|e| format!("bad probe client spec: {e}"))
        .and_then(|spec| run_client(&spec));
    match result.and_then(|r| serde_json::to_string(&r).map_err(|e| e.to_string())) {
        Ok(json) => {
            println!("{json}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("gpushare-agent --probe-client: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Whether the CUDA driver library can be loaded (cudarc panics on first use without it).
pub fn cuda_driver_present() -> bool {
    // SAFETY: only tries to dlopen the driver library by its usual names; no CUDA call.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Whether NVRTC (part of the CUDA toolkit, not the driver) can be loaded.
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen libnvrtc by its usual names; no NVRTC call.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Runs one client in this process and returns what it measured.
pub fn run_client(spec: &ClientSpec) -> Result<ClientResult, String> {
    if !(spec.seconds > 0.0 && spec.seconds <= 3600.0) {
        return Err(format!("window of {} s: must be above 0 and at most 3600", spec.seconds));
    }
    if !cuda_driver_present() {
        return Err("no CUDA driver: libcuda.so.1 cannot be loaded (the probe needs an NVIDIA \
                    GPU and its driver)"
            .into());
    }
    let count = match CudaContext::device_count() {
        Ok(n) => n,
        Err(e) if e.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_NO_DEVICE => 0,
        Err(e) => return Err(format!("CUDA driver: {e}")),
    };
    if count <= 0 {
        return Err("no CUDA device is visible to this process (check the driver, \
                    CUDA_VISIBLE_DEVICES and the device nodes)"
            .into());
    }
    if spec.device >= count as usize {
        return Err(format!("CUDA device {} does not exist ({count} visible)", spec.device));
    }
    let ctx = CudaContext::new(spec.device)
        .map_err(|e| format!("CUDA context on device {}: {e}", spec.device))?;
    let device = device_info(&ctx).map_err(|e| format!("reading device attributes: {e}"))?;
    let (module_src, functions) = load_kernels(&ctx, device.compute_capability)?;
    let stream = ctx.default_stream();
    let mut work = Work::new(spec.workload, &stream, &functions, &device)?;
    warm_up(&mut work, &stream)?;

    let start_at_ms = match spec.start_at_unix_ms {
        Some(ms) => ms,
        None => handshake()?,
    };
    // 0: at once (a client run by hand).
    let late_ms = if start_at_ms == 0 { 0.0 } else { wait_until(start_at_ms) };

    let window = Duration::from_secs_f64(spec.seconds);
    let mut latencies_ms = Vec::with_capacity(1 << 16);
    let start = Instant::now();
    let mut end = start;
    while end.duration_since(start) < window {
        let t = Instant::now();
        work.step(&stream)?;
        end = Instant::now();
        latencies_ms.push(end.duration_since(t).as_secs_f64() * 1e3);
    }
    let seconds = end.duration_since(start).as_secs_f64();
    let steps = latencies_ms.len() as u64;
    let mean_ms = latencies_ms.iter().sum::<f64>() / steps.max(1) as f64;
    sort_samples(&mut latencies_ms);
    let throughput_per_s = steps as f64 / seconds;
    Ok(ClientResult {
        workload: spec.workload,
        pid: std::process::id(),
        steps,
        seconds,
        throughput_per_s,
        p50_ms: percentile(&latencies_ms, 50.0).unwrap_or(0.0),
        p99_ms: percentile(&latencies_ms, 99.0).unwrap_or(0.0),
        mean_ms,
        achieved: work.achieved(throughput_per_s, &device),
        late_ms,
        kernels: module_src,
        device,
    })
}

/// Warm-up: module JIT, first launches, clocks.
fn warm_up(work: &mut Work, stream: &Arc<CudaStream>) -> Result<(), String> {
    let warm = Instant::now();
    let mut n = 0;
    while n < WARMUP_MIN_STEPS || warm.elapsed() < WARMUP {
        work.step(stream)?;
        n += 1;
    }
    Ok(())
}

/// `--bench-builtin WORKLOAD`: the built-in workload as a bench replica. After the
/// warm-up it runs steps until it is stopped, reporting each as a unit with its latency
/// on the descriptor `GPUSHARE_BENCH_REPORT` names (lines batched, written every 10 ms,
/// so that reporting costs no step of its own).
pub fn bench_replica(workload: Workload) -> ExitCode {
    match serve_units(workload) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpushare-agent --bench-builtin {workload}: {e}");
            ExitCode::FAILURE
        }
    }
}

fn serve_units(workload: Workload) -> Result<(), String> {
    use std::os::fd::FromRawFd;
    let fd: i32 = std::env::var(gpushare_proto::bench::ENV_REPORT)
        .ok()
        .and_then(|v| v.parse().ok())
        .ok_or("no report descriptor: GPUSHARE_BENCH_REPORT is not set (run under bench)")?;
    if !cuda_driver_present() {
        return Err("no CUDA driver: libcuda.so.1 cannot be loaded".into());
    }
    let ctx = CudaContext::new(0).map_err(|e| format!("CUDA context on device 0: {e}"))?;
    let device = device_info(&ctx).map_err(|e| format!("reading device attributes: {e}"))?;
    let (_, functions) = load_kernels(&ctx, device.compute_capability)?;
    let stream = ctx.default_stream();
    let mut work = Work::new(workload, &stream, &functions, &device)?;
    warm_up(&mut work, &stream)?;
    // SAFETY: the bench gate moved the report pipe to this descriptor for this process;
    // nothing else here owns or closes it.
    let report = unsafe { std::fs::File::from_raw_fd(fd) };
    let mut report = std::io::BufWriter::with_capacity(1 << 16, report);
    let mut flushed = Instant::now();
    loop {
        let t = Instant::now();
        work.step(&stream)?;
        let end = Instant::now();
        writeln!(report, "{:.4}", end.duration_since(t).as_secs_f64() * 1e3)
            .map_err(|e| format!("report descriptor: {e}"))?;
        if end.duration_since(flushed) >= Duration::from_millis(10) {
            report.flush().map_err(|e| format!("report descriptor: {e}"))?;
            flushed = end;
        }
    }
}

/// Prints `ready`, then reads the window's start (Unix ms) from a line on stdin.
fn handshake() -> Result<u64, String> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready").and_then(|()| out.flush()).map_err(|e| format!("stdout: {e}"))?;
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).map_err(|e| format!("stdin: {e}"))?;
    line.trim()
        .parse()
        .map_err(|_| format!("expected a start time on stdin, got {:?}", line.trim()))
}

fn unix_ms_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64() * 1e3).unwrap_or(0.0)
}

/// Sleeps (then spins the last millisecond) until `start_at_ms`; returns how late it is.
fn wait_until(start_at_ms: u64) -> f64 {
    let target = start_at_ms as f64;
    loop {
        let now = unix_ms_now();
        let left = target - now;
        if left <= 0.0 {
            return -left;
        }
        if left > 2.0 {
            std::thread::sleep(Duration::from_secs_f64((left - 1.0) / 1e3));
        } else {
            std::hint::spin_loop();
        }
    }
}

/// Blocks of the `launch` kernel: [`LAUNCH_BLOCKS`], or `GPUSHARE_PROBE_LAUNCH_BLOCKS`
/// (1 to 256) to study how the step's footprint changes sharing.
fn launch_blocks() -> u32 {
    std::env::var("GPUSHARE_PROBE_LAUNCH_BLOCKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|b| (1..=256).contains(b))
        .unwrap_or(LAUNCH_BLOCKS)
}

/// fp32 FMA lanes per SM for an architecture (CUDA C Programming Guide, arithmetic
/// instruction throughput table).
pub fn fp32_lanes_per_sm(major: i32, minor: i32) -> u32 {
    match (major, minor) {
        (6, 0) => 64,
        (7, _) => 64,
        (8, 0) => 64,
        (8, _) => 128,
        (9, _) => 128,
        (m, _) if m >= 10 => 128,
        _ => 128,
    }
}

fn device_info(ctx: &Arc<CudaContext>) -> Result<DeviceInfo, cudarc::driver::DriverError> {
    let attr = |a| ctx.attribute(a);
    let (major, minor) = ctx.compute_capability()?;
    let sm_count = attr(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?.max(0) as u32;
    let sm_clock_khz = f64::from(attr(Attr::CU_DEVICE_ATTRIBUTE_CLOCK_RATE)?);
    let mem_clock_khz = f64::from(attr(Attr::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE)?);
    let memory_bus_bits = attr(Attr::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH)?.max(0) as u32;
    let lanes = fp32_lanes_per_sm(major, minor);
    Ok(DeviceInfo {
        name: ctx.name()?,
        compute_capability: (major, minor),
        sm_count,
        sm_clock_mhz: sm_clock_khz / 1e3,
        memory_clock_mhz: mem_clock_khz / 1e3,
        memory_bus_bits,
        memory_bandwidth_bytes_per_s: mem_clock_khz * 1e3 * f64::from(memory_bus_bits) / 8.0 * 2.0,
        fp32_peak_flops: f64::from(sm_count) * sm_clock_khz * 1e3 * f64::from(lanes) * 2.0,
        fp32_lanes_per_sm: lanes,
    })
}

struct Functions {
    matmul: CudaFunction,
    fma: CudaFunction,
    copy: CudaFunction,
}

/// Loads the kernels: NVRTC when present (or asked for), else the shipped PTX, or a PTX
/// file named by `GPUSHARE_PROBE_KERNELS`. Returns where they came from.
fn load_kernels(ctx: &Arc<CudaContext>, cc: (i32, i32)) -> Result<(String, Functions), String> {
    let choice = std::env::var(kernels::KERNELS_ENV).unwrap_or_default();
    let (origin, ptx) = match choice.as_str() {
        "" | "auto" if nvrtc_present() => ("nvrtc".to_string(), compile(cc)?),
        "" | "auto" | "ptx" => {
            if kernels::KERNELS_PTX.starts_with("// placeholder") {
                return Err("NVRTC is not installed and this build carries no PTX".into());
            }
            ("ptx".to_string(), cudarc::nvrtc::Ptx::from_src(kernels::KERNELS_PTX))
        }
        "nvrtc" if nvrtc_present() => ("nvrtc".to_string(), compile(cc)?),
        "nvrtc" => return Err("NVRTC (libnvrtc, from the CUDA toolkit) cannot be loaded".into()),
        path => {
            let src = std::fs::read_to_string(path)
                .map_err(|e| format!("{}={path}: {e}", kernels::KERNELS_ENV))?;
            (format!("ptx:{path}"), cudarc::nvrtc::Ptx::from_src(src))
        }
    };
    let module = ctx.load_module(ptx).map_err(|e| format!("loading the {origin} kernels: {e}"))?;
    let load = |name: &str| {
        module.load_function(name).map_err(|e| format!("kernel {name} ({origin}): {e}"))
    };
    let functions = Functions {
        matmul: load(kernels::FN_MATMUL256)?,
        fma: load(kernels::FN_FMA)?,
        copy: load(kernels::FN_COPY)?,
    };
    Ok((origin, functions))
}

fn compile((major, minor): (i32, i32)) -> Result<cudarc::nvrtc::Ptx, String> {
    let opts = cudarc::nvrtc::CompileOptions {
        arch: Some(kernels::nvrtc_arch(major, minor)),
        options: vec!["--std=c++14".into()],
        ..Default::default()
    };
    cudarc::nvrtc::compile_ptx_with_opts(kernels::KERNELS_CU, opts)
        .map_err(|e| format!("NVRTC compiling the probe kernels: {e}"))
}

/// A workload's buffers and launch parameters.
struct Work {
    workload: Workload,
    func: CudaFunction,
    cfg: LaunchConfig,
    a: CudaSlice<f32>,
    b: CudaSlice<f32>,
    c: CudaSlice<f32>,
    fma_iters: i32,
    copy_elems: u64,
    /// FLOPs or bytes moved per step.
    work_per_step: f64,
}

impl Work {
    fn new(
        workload: Workload,
        stream: &Arc<CudaStream>,
        f: &Functions,
        device: &DeviceInfo,
    ) -> Result<Self, String> {
        let alloc = |n: usize| {
            stream
                .alloc_zeros::<f32>(n)
                .map_err(|e| format!("allocating {} MiB: {e}", (n * 4) >> 20))
        };
        // Grids are sized on the SMs this process sees; under an MPS thread limit that is
        // fewer, so a comparison against an unlimited solo run passes the solo's count to
        // keep the work of a step the same.
        let sms = std::env::var("GPUSHARE_PROBE_GRID_SMS")
            .ok()
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(device.sm_count)
            .max(1);
        Ok(match workload {
            Workload::Launch => Work {
                workload,
                func: f.matmul.clone(),
                cfg: LaunchConfig {
                    grid_dim: (launch_blocks(), 1, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                },
                a: alloc(256 * 256)?,
                b: alloc(256 * 256)?,
                c: alloc(256 * 256)?,
                fma_iters: 0,
                copy_elems: 0,
                work_per_step: 2.0 * 256.0 * 256.0 * 256.0,
            },
            Workload::Compute => {
                let blocks = sms * 8;
                let threads = f64::from(blocks) * 256.0;
                let flops_per_round = threads * FMA_CHAINS as f64 * 2.0;
                // The step's work follows the grid's SMs, not the (possibly limited) visible ones.
                let peak =
                    device.fp32_peak_flops / f64::from(device.sm_count.max(1)) * f64::from(sms);
                let iters = (COMPUTE_STEP_TARGET_S * peak / flops_per_round)
                    .ceil()
                    .clamp(1.0, f64::from(i32::MAX)) as i32;
                Work {
                    workload,
                    func: f.fma.clone(),
                    cfg: LaunchConfig {
                        grid_dim: (blocks, 1, 1),
                        block_dim: (256, 1, 1),
                        shared_mem_bytes: 0,
                    },
                    a: alloc(threads as usize)?,
                    b: alloc(1)?,
                    c: alloc(1)?,
                    fma_iters: iters,
                    copy_elems: 0,
                    work_per_step: flops_per_round * f64::from(iters),
                }
            }
            Workload::Memory => Work {
                workload,
                func: f.copy.clone(),
                cfg: LaunchConfig {
                    grid_dim: (sms * 8, 1, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                },
                a: alloc(MEMORY_STEP_BYTES / 4)?,
                b: alloc(MEMORY_STEP_BYTES / 4)?,
                c: alloc(1)?,
                fma_iters: 0,
                copy_elems: (MEMORY_STEP_BYTES / 16) as u64,
                work_per_step: 2.0 * MEMORY_STEP_BYTES as f64,
            },
        })
    }

    /// One step: launch and wait for it (cuStreamSynchronize).
    fn step(&mut self, stream: &Arc<CudaStream>) -> Result<(), String> {
        let mut launch = stream.launch_builder(&self.func);
        let (x, y) = (0.999_f32, 0.001_f32);
        match self.workload {
            Workload::Launch => {
                launch.arg(&self.a).arg(&self.b).arg(&mut self.c);
            }
            Workload::Compute => {
                launch.arg(&mut self.a).arg(&self.fma_iters).arg(&x).arg(&y);
            }
            Workload::Memory => {
                launch.arg(&self.a).arg(&mut self.b).arg(&self.copy_elems);
            }
        }
        // SAFETY: the arguments match the kernel's parameters in kernels.cu in number,
        // order and type (device pointers to buffers of the sizes the kernels index:
        // 256x256 floats; one float a thread of the grid; `copy_elems` float4s), and every
        // buffer outlives the launch, which is synchronized right after.
        unsafe { launch.launch(self.cfg) }
            .map_err(|e| format!("launching {}: {e}", self.workload))?;
        stream.synchronize().map_err(|e| format!("synchronizing {}: {e}", self.workload))
    }

    fn achieved(&self, throughput_per_s: f64, device: &DeviceInfo) -> Achieved {
        let rate = self.work_per_step * throughput_per_s;
        let (value, limit, unit, basis) = match self.workload {
            Workload::Memory => (
                rate / 1e9,
                device.memory_bandwidth_bytes_per_s / 1e9,
                "GB/s",
                format!(
                    "memory clock {} MHz x {} bit bus x 2; bytes read and written",
                    device.memory_clock_mhz, device.memory_bus_bits
                ),
            ),
            Workload::Launch | Workload::Compute => (
                rate / 1e12,
                device.fp32_peak_flops / 1e12,
                "TFLOP/s",
                format!(
                    "fp32: {} SMs x {} MHz x {} FMA lanes x 2",
                    device.sm_count, device.sm_clock_mhz, device.fp32_lanes_per_sm
                ),
            ),
        };
        Achieved {
            value,
            limit,
            unit: unit.into(),
            fraction_of_limit: if limit > 0.0 { value / limit } else { 0.0 },
            limit_basis: basis,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp32_lanes_follow_the_architecture() {
        assert_eq!(fp32_lanes_per_sm(9, 0), 128);
        assert_eq!(fp32_lanes_per_sm(8, 0), 64);
        assert_eq!(fp32_lanes_per_sm(8, 6), 128);
        assert_eq!(fp32_lanes_per_sm(7, 0), 64);
    }

    #[test]
    fn a_bad_spec_is_refused_before_any_cuda_call() {
        let spec = ClientSpec {
            workload: Workload::Launch,
            seconds: 0.0,
            start_at_unix_ms: None,
            device: 0,
        };
        assert!(run_client(&spec).unwrap_err().contains("window"));
        assert!(serde_json::from_str::<ClientSpec>(r#"{"workload":"bogus","seconds":1}"#).is_err());
    }

    #[test]
    fn without_a_driver_the_client_says_so() {
        if cuda_driver_present() {
            return;
        }
        let spec = ClientSpec {
            workload: Workload::Memory,
            seconds: 1.0,
            start_at_unix_ms: Some(0),
            device: 0,
        };
        assert!(run_client(&spec).unwrap_err().contains("no CUDA driver"));
    }

    #[test]
    fn a_short_solo_window_measures_something_real() {
        if !cuda_driver_present() || CudaContext::device_count().unwrap_or(0) < 1 {
            gpushare_test_skip::skip("no CUDA driver or device");
            return;
        }
        for workload in Workload::ALL {
            let spec = ClientSpec { workload, seconds: 0.3, start_at_unix_ms: Some(0), device: 0 };
            let r = run_client(&spec).unwrap();
            assert!(r.steps > 0 && r.p50_ms > 0.0 && r.p99_ms >= r.p50_ms);
            assert!(r.achieved.value > 0.0 && r.achieved.fraction_of_limit < 1.5, "{r:?}");
        }
    }
}
