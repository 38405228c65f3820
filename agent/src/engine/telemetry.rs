//! `Telemetry`: what each GPU is doing now (utilisation, memory, temperature, power, and
//! each MIG device's memory), read through the backend for every GPU the node lists. Not
//! part of `Status`, whose time budget these reads would break.

use gpushare_proto::telemetry::{GpuTelemetryDoc, MigTelemetryDoc, Telemetry};

use super::{Engine, EngineError};
use crate::apply::Reads;
use crate::gpu::GpuTelemetry;

impl Engine {
    /// Every GPU's live readings, by index; a GPU whose readings cannot be had is listed
    /// with every value `null`.
    pub async fn telemetry(&self) -> Result<Telemetry, EngineError> {
        let reads = Reads { timeslices: false, mps_clients: false };
        let node = self.core.node.observe_shared(reads, self.epoch()).await?;
        let mut gpus = Vec::with_capacity(node.gpus.len());
        for g in &node.gpus {
            let t = self.core.node.telemetry(g.index).await.unwrap_or_default();
            gpus.push(doc(g.index, &g.uuid, t));
        }
        Ok(Telemetry { gpus })
    }
}

/// The document of one GPU's readings.
fn doc(index: u32, uuid: &str, t: GpuTelemetry) -> GpuTelemetryDoc {
    GpuTelemetryDoc {
        index,
        uuid: uuid.to_owned(),
        utilization_percent: t.utilization_percent,
        memory_utilization_percent: t.memory_utilization_percent,
        memory_used_bytes: t.memory_used_bytes,
        memory_total_bytes: t.memory_total_bytes,
        temperature_c: t.temperature_c,
        power_watts: t.power_watts,
        mig_devices: t
            .mig_devices
            .into_iter()
            .map(|m| MigTelemetryDoc {
                uuid: m.uuid,
                gpu_instance: m.gpu_instance,
                compute_instance: m.compute_instance,
                memory_used_bytes: m.memory_used_bytes,
                memory_total_bytes: m.memory_total_bytes,
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::MigTelemetry;

    #[test]
    fn a_reading_becomes_its_document_with_missing_values_null() {
        let t = GpuTelemetry {
            utilization_percent: Some(30),
            temperature_c: Some(38),
            power_watts: Some(123.6),
            mig_devices: vec![MigTelemetry {
                uuid: "MIG-1".into(),
                gpu_instance: 1,
                compute_instance: 0,
                memory_used_bytes: Some(0),
                memory_total_bytes: Some(10 << 30),
            }],
            ..GpuTelemetry::default()
        };
        let d = doc(2, "GPU-2", t);
        let json = serde_json::to_value(&d).unwrap();
        assert_eq!(json["index"], 2);
        assert_eq!(json["utilization_percent"], 30);
        assert!(json["memory_used_bytes"].is_null());
        assert_eq!(json["mig_devices"][0]["memory_total_bytes"], 10u64 << 30);
    }
}
