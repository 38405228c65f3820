//! `-i`: which GPUs an ID list names.

use gpushare_sim_nvml::node::{Gpu, Node};

use crate::device::{self, PciAddress};

/// Whether `id` names the GPU at `index`: its index (decimal), its UUID (any case), or its
/// PCI bus id in any form nvidia-smi takes (`00000000:1B:00.0`, `0000:1b:00.0` as sysfs
/// and mig-parted write it, `1B:00.0`).
pub fn matches(gpu: &Gpu, index: usize, id: &str) -> bool {
    if !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()) {
        return id.parse::<usize>() == Ok(index);
    }
    id.eq_ignore_ascii_case(&gpu.uuid) || PciAddress::parse(id) == Some(device::pci(gpu))
}

/// The GPUs `ids` names (comma separated; every GPU when `None`), each as (index, the ID
/// as given, or the index when all). `None` when an ID matches no GPU or none is given:
/// nvidia-smi then answers "No devices were found".
pub fn select(node: &Node, ids: Option<&str>) -> Option<Vec<(usize, String)>> {
    let Some(ids) = ids else {
        return Some((0..node.gpus.len()).map(|i| (i, i.to_string())).collect());
    };
    let mut chosen = Vec::new();
    for id in ids.split(',').map(str::trim).filter(|id| !id.is_empty()) {
        let index = node.gpus.iter().enumerate().position(|(i, g)| matches(g, i, id))?;
        chosen.push((index, id.to_string()));
    }
    (!chosen.is_empty()).then_some(chosen)
}
