//! The probe's kernels: CUDA C compiled with NVRTC at run time, and the same source
//! compiled to PTX ahead of time (`ptx/kernels.ptx`, compute_80) for hosts with a driver
//! but no toolkit (NVRTC ships with the toolkit, not the driver).

/// CUDA C source of every probe kernel (`kernels.cu`).
pub const KERNELS_CU: &str = include_str!("kernels.cu");

/// `KERNELS_CU` compiled with `nvcc -arch=compute_80 -ptx` (the driver JITs it for any
/// later architecture, Hopper included). nvcc 13.0 stamps it PTX ISA 9.0, which drivers
/// older than CUDA 13 refuse; the kernels use only ISA 7.0 instructions, so the header is
/// lowered to `.version 7.0` (CUDA 11.0 drivers and later), checked with
/// `ptxas -arch=sm_80` and `-arch=sm_90`:
/// `nvcc -arch=compute_80 -ptx kernels.cu -o - | sed 's/^\.version 9\.0$/.version 7.0/'`.
pub const KERNELS_PTX: &str = include_str!("ptx/kernels.ptx");

/// Kernel names, as in `kernels.cu`.
pub const FN_MATMUL256: &str = "probe_matmul256";
/// fp32 FMA chains.
pub const FN_FMA: &str = "probe_fma";
/// Streaming copy.
pub const FN_COPY: &str = "probe_copy";
/// All kernel names.
pub const ALL_FUNCTIONS: [&str; 3] = [FN_MATMUL256, FN_FMA, FN_COPY];

/// fp32 FMA chains per thread in `probe_fma`; each round of the loop is this many FMAs.
pub const FMA_CHAINS: u64 = 16;

/// Environment variable choosing the kernels' origin: unset or `auto` (NVRTC when
/// present, else the shipped PTX), `nvrtc`, `ptx` (the shipped PTX), or a path to a PTX
/// file.
pub const KERNELS_ENV: &str = "GPUSHARE_PROBE_KERNELS";

/// The NVRTC target for a compute capability: the device's own where NVRTC knows it,
/// else the newest that every supported GPU runs.
pub fn nvrtc_arch(major: i32, minor: i32) -> &'static str {
    match (major, minor) {
        (7, 0) => "compute_70",
        (7, 5) => "compute_75",
        (8, 0) => "compute_80",
        (8, 6) => "compute_86",
        (8, 7) => "compute_87",
        (8, 9) => "compute_89",
        (9, 0) => "compute_90",
        (m, _) if m >= 9 => "compute_90",
        (8, _) => "compute_80",
        _ => "compute_70",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_source_defines_every_kernel() {
        for name in ALL_FUNCTIONS {
            assert!(KERNELS_CU.contains(&format!("void {name}(")), "{name} missing");
        }
    }

    #[test]
    fn the_shipped_ptx_matches_the_source() {
        if KERNELS_PTX.starts_with("// placeholder") {
            return;
        }
        assert!(KERNELS_PTX.contains(".target sm_80"), "PTX not built for compute_80");
        assert!(KERNELS_PTX.contains(".version 7.0"), "PTX ISA above 7.0: older drivers refuse it");
        for name in ALL_FUNCTIONS {
            assert!(
                KERNELS_PTX.contains(&format!(".entry {name}(")),
                "{name} missing from the PTX"
            );
        }
    }

    #[test]
    fn arch_falls_back_sensibly() {
        assert_eq!(nvrtc_arch(9, 0), "compute_90");
        assert_eq!(nvrtc_arch(12, 0), "compute_90");
        assert_eq!(nvrtc_arch(8, 6), "compute_86");
        assert_eq!(nvrtc_arch(6, 1), "compute_70");
    }
}
