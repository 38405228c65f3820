//! The helpers every entry-point file of the C ABI shares: out-pointer checks ([`out`]),
//! string copies into callers' buffers ([`put_str`], [`c_name`]) and handle lookups that
//! answer NVML codes ([`whole_gpu`], [`whole_gpu_ref`], [`gpu_at`], [`gi_of`]). A leaf of `abi`: it uses
//! nvml.h's types, the handle scheme and the node, and no entry-point file.

use std::os::raw::{c_char, c_uint};

use super::handles::{self, Device};
use super::types::{nvmlDevice_t, ret};
use crate::codes::Code;
use crate::node::{Gpu, GpuInstance, Node};
use crate::rules;

/// The GPU at `index`, or INVALID_ARGUMENT.
pub(super) fn gpu_at(node: &Node, index: u32) -> Result<&Gpu, Code> {
    rules::gpu(node, index)
}

/// A whole-GPU handle: MIG device handles are NOT_SUPPORTED for this query.
pub(super) fn whole_gpu(node: &Node, epoch: u32, device: nvmlDevice_t) -> Result<u32, Code> {
    match handles::device(node, epoch, device)? {
        Device::Gpu(i) => Ok(i),
        Device::Mig(..) => Err(ret::NOT_SUPPORTED),
    }
}

/// The whole GPU a handle names: [`whole_gpu`]'s answers, then [`gpu_at`]'s.
pub(super) fn whole_gpu_ref(node: &Node, epoch: u32, device: nvmlDevice_t) -> Result<&Gpu, Code> {
    gpu_at(node, whole_gpu(node, epoch, device)?)
}

/// GPU instance `id` of `g`, or INVALID_ARGUMENT.
pub(super) fn gi_of(g: &Gpu, id: u32) -> Result<&GpuInstance, Code> {
    g.instance(id).ok_or(ret::INVALID_ARGUMENT)
}

/// `s` as a NUL-terminated C array, cut to fit.
pub(super) fn c_name<const N: usize>(s: &str) -> [c_char; N] {
    let mut out = [0 as c_char; N];
    for (slot, b) in out.iter_mut().zip(s.bytes().take(N - 1)) {
        *slot = b as c_char;
    }
    out
}

/// Writes `s` NUL-terminated into `buf` of `len` bytes: null is INVALID_ARGUMENT, too
/// short INSUFFICIENT_SIZE.
///
/// # Safety
/// `buf` is null or valid for writes of `len` bytes.
pub(crate) unsafe fn put_str(buf: *mut c_char, len: c_uint, s: &str) -> Result<(), Code> {
    if buf.is_null() {
        return Err(ret::INVALID_ARGUMENT);
    }
    if (len as usize) < s.len() + 1 {
        return Err(ret::INSUFFICIENT_SIZE);
    }
    // SAFETY: `buf` is valid for `len` bytes (the caller's contract) and `len` is at least
    // `s.len() + 1`; `s` is a distinct Rust string, so the regions do not overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr().cast::<c_char>(), buf, s.len());
        *buf.add(s.len()) = 0;
    }
    Ok(())
}

/// The out-pointer as a reference: null is INVALID_ARGUMENT.
///
/// # Safety
/// `p` is null or valid for reads and writes of a `T` for the call.
pub(crate) unsafe fn out<'a, T>(p: *mut T) -> Result<&'a mut T, Code> {
    // SAFETY: the caller's contract.
    unsafe { p.as_mut() }.ok_or(ret::INVALID_ARGUMENT)
}
