// Kernels of the gpushare interference probe (agent/src/probe). Compiled at run time with
// NVRTC when the toolkit's libnvrtc is present; otherwise ptx/kernels.ptx, generated from
// this file with `nvcc -arch=compute_80 -ptx` (header lowered to PTX ISA 7.0: see
// kernels.rs), is loaded (the driver JITs compute_80 PTX for any later GPU). Keep the two
// in step.

// `launch`: a 256x256 fp32 matrix product on a few blocks (block b computes rows b,
// b + gridDim.x, ...; a thread one column; 64 blocks by default): a short step that leaves
// most of the GPU idle, so that a step (launch + synchronize) is latency-bound like the
// reference's 256x256 framework matmul, and concurrent clients can fit on the GPU at once.
extern "C" __global__ void probe_matmul256(const float *a, const float *b, float *c) {
    const int col = threadIdx.x;
    for (int row = blockIdx.x; row < 256; row += gridDim.x) {
        float acc = 0.0f;
        for (int k = 0; k < 256; ++k) {
            acc = fmaf(a[row * 256 + k], b[k * 256 + col], acc);
        }
        c[row * 256 + col] = acc;
    }
}

// `compute`: 16 independent fp32 FMA chains a thread, `iters` rounds: FMA-bound with a
// full grid. 32 floating-point operations a thread a round.
extern "C" __global__ void probe_fma(float *out, int iters, float x, float y) {
    const int gid = blockIdx.x * blockDim.x + threadIdx.x;
    float v[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        v[i] = (float)(gid + i) * 1e-7f;
    }
#pragma unroll 4
    for (int r = 0; r < iters; ++r) {
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            v[i] = fmaf(v[i], x, y);
        }
    }
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        s += v[i];
    }
    out[gid] = s;
}

// `memory`: a streaming device-to-device copy of `n` 16-byte elements, grid-stride.
extern "C" __global__ void probe_copy(const float4 *src, float4 *dst, unsigned long long n) {
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (; i < n; i += stride) {
        dst[i] = src[i];
    }
}
