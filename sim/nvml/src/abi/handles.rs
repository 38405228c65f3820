//! Opaque handles: `nvmlDevice_t`, `nvmlGpuInstance_t` and `nvmlComputeInstance_t` are
//! pointers the caller never dereferences, so each is a tagged integer:
//!
//! ```text
//! bits 56..60  kind: 1 GPU, 2 MIG device, 3 GPU instance, 4 compute instance
//! bits 40..56  epoch: bumped at every first nvmlInit after a full shutdown
//! bits 32..40  GPU index
//! bits  0..32  serial of the GPU or compute instance (0 for a GPU)
//! ```
//!
//! A handle from before the last `nvmlShutdown` (another epoch), of the wrong kind, or of
//! an instance that no longer exists (serials are never reused) answers
//! `NVML_ERROR_INVALID_ARGUMENT`, as nvml.h documents for an invalid handle ("If \a
//! gpuInstance is invalid"). A handle of a GPU that fell off the bus (and of its instances
//! and MIG devices) answers `NVML_ERROR_GPU_IS_LOST`.

use std::ffi::c_void;

use crate::codes::Code;
use crate::codes::ret;
use crate::node::{ComputeInstance, Gpu, GpuInstance, Node};
use crate::rules;

const KIND_SHIFT: u32 = 56;
const EPOCH_SHIFT: u32 = 40;
const GPU_SHIFT: u32 = 32;
const SERIAL_MASK: u64 = 0xFFFF_FFFF;

/// What a handle stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Gpu = 1,
    Mig = 2,
    GpuInstance = 3,
    ComputeInstance = 4,
}

fn encode(kind: Kind, epoch: u32, gpu: u32, serial: u64) -> *mut c_void {
    let v = (kind as u64) << KIND_SHIFT
        | u64::from(epoch & 0xFFFF) << EPOCH_SHIFT
        | u64::from(gpu & 0xFF) << GPU_SHIFT
        | (serial & SERIAL_MASK);
    v as usize as *mut c_void
}

fn decode(h: *mut c_void, epoch: u32) -> Result<(Kind, u32, u64), Code> {
    let v = h as usize as u64;
    let kind = match v >> KIND_SHIFT {
        1 => Kind::Gpu,
        2 => Kind::Mig,
        3 => Kind::GpuInstance,
        4 => Kind::ComputeInstance,
        _ => return Err(ret::INVALID_ARGUMENT),
    };
    if (v >> EPOCH_SHIFT) & 0xFFFF != u64::from(epoch & 0xFFFF) {
        return Err(ret::INVALID_ARGUMENT);
    }
    Ok((kind, ((v >> GPU_SHIFT) & 0xFF) as u32, v & SERIAL_MASK))
}

/// The handle of GPU `index`.
pub fn gpu(epoch: u32, index: u32) -> *mut c_void {
    encode(Kind::Gpu, epoch, index, 0)
}

/// The handle of the MIG device standing for the compute instance with `ci_serial`.
pub fn mig(epoch: u32, index: u32, ci_serial: u64) -> *mut c_void {
    encode(Kind::Mig, epoch, index, ci_serial)
}

/// The handle of a GPU instance.
pub fn gpu_instance(epoch: u32, index: u32, gi: &GpuInstance) -> *mut c_void {
    encode(Kind::GpuInstance, epoch, index, gi.serial)
}

/// The handle of a compute instance.
pub fn compute_instance(epoch: u32, index: u32, ci: &ComputeInstance) -> *mut c_void {
    encode(Kind::ComputeInstance, epoch, index, ci.serial)
}

/// A device handle, resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    /// A whole GPU.
    Gpu(u32),
    /// A MIG device: GPU index, GPU instance id, compute instance id.
    Mig(u32, u32, u32),
}

impl Device {
    /// The GPU index.
    pub fn index(self) -> u32 {
        match self {
            Device::Gpu(i) | Device::Mig(i, _, _) => i,
        }
    }
}

/// The GPU a handle names: INVALID_ARGUMENT when the node has none at that index,
/// GPU_IS_LOST when it fell off the bus (every call on its handles answers so).
fn gpu_of(node: &Node, index: u32) -> Result<&Gpu, Code> {
    let gpu = rules::gpu(node, index)?;
    if gpu.health.lost { Err(ret::GPU_IS_LOST) } else { Ok(gpu) }
}

/// The handle of GPU `index` for a look-up (by index, UUID, PCI bus id, serial):
/// GPU_IS_LOST when it fell off the bus (nvml.h's answer for those look-ups).
pub fn live_gpu(node: &Node, epoch: u32, index: u32) -> Result<*mut c_void, Code> {
    gpu_of(node, index).map(|_| gpu(epoch, index))
}

fn find_ci(g: &Gpu, serial: u64) -> Option<(&GpuInstance, &ComputeInstance)> {
    let masked = |s: u64| s & SERIAL_MASK == serial;
    g.instances
        .iter()
        .find_map(|gi| gi.compute_instances.iter().find(|ci| masked(ci.serial)).map(|ci| (gi, ci)))
}

/// Resolves a GPU or MIG device handle.
pub fn device(node: &Node, epoch: u32, h: *mut c_void) -> Result<Device, Code> {
    let (kind, index, serial) = decode(h, epoch)?;
    let g = gpu_of(node, index)?;
    match kind {
        Kind::Gpu => Ok(Device::Gpu(index)),
        Kind::Mig if g.mig_enabled => find_ci(g, serial)
            .map(|(gi, ci)| Device::Mig(index, gi.id, ci.id))
            .ok_or(ret::INVALID_ARGUMENT),
        _ => Err(ret::INVALID_ARGUMENT),
    }
}

/// Resolves a GPU instance handle to `(GPU index, GPU instance id)`.
pub fn resolve_gpu_instance(node: &Node, epoch: u32, h: *mut c_void) -> Result<(u32, u32), Code> {
    match decode(h, epoch)? {
        (Kind::GpuInstance, index, serial) => gpu_of(node, index)?
            .instances
            .iter()
            .find(|gi| gi.serial & SERIAL_MASK == serial)
            .map(|gi| (index, gi.id))
            .ok_or(ret::INVALID_ARGUMENT),
        _ => Err(ret::INVALID_ARGUMENT),
    }
}

/// Resolves a compute instance handle to `(GPU index, GPU instance id, compute instance id)`.
pub fn resolve_compute_instance(
    node: &Node,
    epoch: u32,
    h: *mut c_void,
) -> Result<(u32, u32, u32), Code> {
    match decode(h, epoch)? {
        (Kind::ComputeInstance, index, serial) => find_ci(gpu_of(node, index)?, serial)
            .map(|(gi, ci)| (index, gi.id, ci.id))
            .ok_or(ret::INVALID_ARGUMENT),
        _ => Err(ret::INVALID_ARGUMENT),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpushare_catalog::parse_node_spec;

    #[test]
    fn handles_resolve_only_in_their_epoch_and_kind() {
        let mut node = Node::new(&parse_node_spec("a100-40gb:2").unwrap());
        node.gpus[1].mig_enabled = true;
        crate::rules::create_gpu_instance(&mut node, 1, 9, 4, 4).unwrap();
        // A 3g at slot 4 is GPU instance 2, as on hardware.
        crate::rules::create_compute_instance(&mut node, 1, 2, 2).unwrap();
        let gi = &node.gpus[1].instances[0];
        let ci = &gi.compute_instances[0];
        assert!(!gpu(7, 0).is_null());
        assert_eq!(device(&node, 7, gpu(7, 1)), Ok(Device::Gpu(1)));
        assert_eq!(device(&node, 8, gpu(7, 1)), Err(ret::INVALID_ARGUMENT));
        assert_eq!(device(&node, 7, gpu(7, 2)), Err(ret::INVALID_ARGUMENT));
        assert_eq!(device(&node, 7, mig(7, 1, ci.serial)), Ok(Device::Mig(1, 2, 0)));
        assert_eq!(resolve_gpu_instance(&node, 7, gpu_instance(7, 1, gi)), Ok((1, 2)));
        assert_eq!(resolve_gpu_instance(&node, 7, gpu(7, 1)), Err(ret::INVALID_ARGUMENT));
        assert_eq!(resolve_compute_instance(&node, 7, compute_instance(7, 1, ci)), Ok((1, 2, 0)));
        assert_eq!(device(&node, 7, std::ptr::null_mut()), Err(ret::INVALID_ARGUMENT));
    }
}
