//! Facts of a simulated GPU that the simulated library and the simulated nvidia-smi both
//! report, so that the two never disagree: serial, board id, PCI address and subsystem id,
//! the driver's reserved memory and each process's. Figures the catalog lacks are the
//! real H100's (tests/device/results/nvidia-tools-2026-11-27).

use crate::node::Gpu;

/// Framebuffer memory the driver keeps for itself: 480 MiB on the real H100 (NVML memory
/// v2's `reserved`, which v1 and nvidia-smi's `Used` count in).
pub const RESERVED_BYTES: u64 = 480 << 20;

/// GPU memory each simulated compute process uses (the node's default, [`crate::node`]).
pub use crate::node::PROCESS_MEMORY;

/// An idle GPU's temperature: the real H100 answered 35 °C idle
/// (tests/device/results/nvidia-tools-2026-11-27/nvidia-smi/q.txt).
pub const IDLE_TEMPERATURE_C: u32 = 35;
/// An idle GPU's power draw: the real H100 drew 73.6 W idle (same file).
pub const IDLE_POWER_MW: u32 = 73_600;

/// What a whole GPU's sensors read (NVML's temperature, power and utilisation calls, and
/// nvidia-smi's table and `-q`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Readings {
    /// GPU temperature, °C.
    pub temperature_c: u32,
    /// Power draw, milliwatts.
    pub power_mw: u32,
    /// GPU utilisation, percent; `None` with MIG on (NVML: NOT_SUPPORTED).
    pub gpu_util: Option<u32>,
    /// Memory utilisation, percent; `None` with MIG on.
    pub memory_util: Option<u32>,
}

/// The simulator's load rule: each compute process the node lists on GPU `index` (its MIG
/// instances' included) adds 30 % GPU and 10 % memory utilisation (at most 100), 3 °C (at
/// most 30) and 50 W (at most 600); with none the GPU is idle, as a real one is. A GPU
/// with MIG on has no utilisation, as NVML's reference says. `None` for no such GPU.
pub fn readings(node: &crate::node::Node, index: u32) -> Option<Readings> {
    let g = node.gpus.get(usize::try_from(index).ok()?)?;
    let n = crate::rules::processes(node, index, None).map_or(0, |p| p.len());
    let n = u32::try_from(n).unwrap_or(u32::MAX);
    let utilisation = |step: u32| (!g.mig_enabled).then(|| n.saturating_mul(step).min(100));
    Some(Readings {
        temperature_c: IDLE_TEMPERATURE_C + n.saturating_mul(3).min(30),
        power_mw: IDLE_POWER_MW + n.saturating_mul(50_000).min(600_000),
        gpu_util: utilisation(30),
        memory_util: utilisation(10),
    })
}

/// A GPU's serial number: 13 digits, stable per UUID (the real H100's is 1654723009368).
pub fn serial(g: &Gpu) -> String {
    let digits: u64 = g.uuid.bytes().fold(1_654_723_009_368, |acc, b| {
        acc.wrapping_mul(131).wrapping_add(u64::from(b)) % 10_000_000_000_000
    });
    format!("{digits:013}")
}

/// A PCI address: domain, bus, device, function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PciAddress {
    /// Domain (up to 32 bits).
    pub domain: u32,
    /// Bus.
    pub bus: u32,
    /// Device.
    pub device: u32,
    /// Function.
    pub function: u32,
}

impl PciAddress {
    /// A PCI bus id in any form NVML's and nvidia-smi's clients write:
    /// `domain:bus:device.function` with a domain of up to 8 hex digits or none, any case
    /// (`00000000:1B:00.0`, `0000:1b:00.0`, `1B:00.0`).
    pub fn parse(text: &str) -> Option<PciAddress> {
        // nvml.h takes `domain:bus:device` without a function too (function 0).
        let text = text.trim();
        let (rest, function) = match text.rsplit_once('.') {
            Some((rest, function)) => (rest, function),
            None if text.matches(':').count() == 2 => (text, "0"),
            None => return None,
        };
        let parts: Vec<&str> = rest.split(':').collect();
        let (domain, bus, device) = match parts[..] {
            [bus, device] => ("0", bus, device),
            [domain, bus, device] => (domain, bus, device),
            _ => return None,
        };
        let hex = |t: &str, max: usize| {
            (!t.is_empty() && t.len() <= max && t.bytes().all(|b| b.is_ascii_hexdigit()))
                .then(|| u32::from_str_radix(t, 16).ok())
                .flatten()
        };
        Some(PciAddress {
            domain: hex(domain, 8)?,
            bus: hex(bus, 2)?,
            device: hex(device, 2)?,
            function: hex(function, 1)?,
        })
    }

    /// NVML's `busId` form, `00000000:1B:00.0`.
    pub fn bus_id(&self) -> String {
        format!("{:08X}:{:02X}:{:02X}.{:X}", self.domain, self.bus, self.device, self.function)
    }

    /// NVML's `busIdLegacy` form, `0000:1B:00.0`.
    pub fn legacy_bus_id(&self) -> String {
        format!(
            "{:04X}:{:02X}:{:02X}.{:X}",
            self.domain & 0xFFFF,
            self.bus,
            self.device,
            self.function
        )
    }
}

/// The GPU's PCI address (all zero if the node's bus id does not parse).
pub fn pci(g: &Gpu) -> PciAddress {
    PciAddress::parse(&g.pci_bus_id).unwrap_or(PciAddress {
        domain: 0,
        bus: 0,
        device: 0,
        function: 0,
    })
}

/// The PCI device id (`0x233010DE`).
pub fn device_id(g: &Gpu) -> u32 {
    g.model().pci_device_ids[0]
}

/// The PCI subsystem id: the real H100 SXM's where that is the model, the device id
/// otherwise (nothing recorded for the others).
pub fn subsystem_id(g: &Gpu) -> u32 {
    match device_id(g) {
        0x2330_10DE => 0x16C1_10DE,
        other => other,
    }
}

/// The board id: one board per GPU, numbered from its PCI bus and device (the real H100
/// at 00:06.0 answered 6).
pub fn board_id(g: &Gpu) -> u32 {
    let pci = pci(g);
    pci.bus << 8 | pci.device
}

#[cfg(test)]
mod tests {
    use super::PciAddress;

    #[test]
    fn bus_ids_are_read_in_every_form_clients_write() {
        for form in ["00000000:1B:00.0", "0000:1b:00.0", "1B:00.0", " 00000000:1b:00.0 ", "0:1B:0"]
        {
            let parsed = PciAddress::parse(form).unwrap_or_else(|| panic!("{form}"));
            assert_eq!(parsed.bus_id(), "00000000:1B:00.0", "{form}");
            assert_eq!(parsed.legacy_bus_id(), "0000:1B:00.0", "{form}");
        }
        for bad in ["", "1B", "1B:00", "x:1B:00.0", "000000000:1B:00.0", "GPU-1"] {
            assert_eq!(PciAddress::parse(bad), None, "{bad}");
        }
    }
}
