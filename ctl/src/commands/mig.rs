//! `gpushare-ctl mig profiles [GPU]`: each MIG GPU's profiles as its driver reports them,
//! in `nvidia-smi mig -lgip`'s columns and order, with `-lgipp`'s placements and the names
//! a gpushare profile accepts, and the compute instances one instance splits into:
//!
//! ```text
//! GPU 0: H100-80GB-HBM3, MIG on; profiles read from the driver (580.159.04) through NVML; agrees with the catalog (h100-80gb)
//! NAME     ID  FREE/TOTAL  MEMORY GiB   SM  DEC  ENC  CE  JPEG  OFA  PLACEMENTS         COMPUTE INSTANCES         ACCEPTS
//! 1g.10gb  19         4/7        9.75   16    1    0   1     1    0  {0,1,2,3,4,5,6}:1  1x1c                      1g.10gb, 1g
//! 1g.20gb  15         2/4       19.62   26    1    0   1     1    0  {0,2,4,6}:2        1x1c                      1g.20gb
//! 7g.80gb   0         0/1       79.25  132    7    0   8     7    1  {0}:8              7x1c 3x2c 2x3c 1x4c 1x7c  7g.80gb, 7g
//! Compute instances as the driver reported them for 7g.80gb; the MIG guide's rule for the others (the driver tells only for an instance that exists).
//! ```
//!
//! FREE is `-` while MIG is off (no instance can be made then; nvidia-smi prints the empty
//! GPU's count). Where
//! the driver's table differs from gpushare's catalog, the header says how many figures
//! differ and one indented line per difference follows it. `--json` prints the
//! [`MigProfiles`] document. `mig` takes sub-verbs so that more MIG views can join it.

#[cfg(test)]
use gpushare_proto::types::ComputeInstanceSize;
use gpushare_proto::types::{GpuMigProfiles, MigProfileInfo, MigProfiles};

use super::ExitStatus;
use crate::bus::Client;
use crate::cli::MigCommand;
use crate::error::CtlError;
use crate::output::{Output, parse_document, plural};
use crate::table::Columns;

/// Runs a `mig` sub-verb.
pub async fn run(
    client: &mut Client,
    out: &Output,
    command: MigCommand,
) -> Result<ExitStatus, CtlError> {
    match command {
        MigCommand::Profiles(args) => {
            let gpu = args.gpu.unwrap_or_default();
            let raw =
                client.call("MigProfiles", async |a| a.proxy.mig_profiles(&gpu).await).await?;
            if out.json {
                out.print_document(&raw, "MigProfiles")?;
            } else {
                let doc: MigProfiles = parse_document(&raw, "MigProfiles")?;
                out.print(&render_mig_profiles(&doc));
            }
            Ok(0)
        }
    }
}

/// Renders a [`MigProfiles`] document for people: per GPU a header line, the differences
/// from the catalog if any, and the table; a blank line between GPUs.
pub fn render_mig_profiles(doc: &MigProfiles) -> String {
    if doc.gpus.is_empty() {
        return "No GPU with MIG.\n".to_owned();
    }
    let gpus: Vec<String> = doc.gpus.iter().map(render_gpu).collect();
    gpus.join("\n")
}

fn render_gpu(gpu: &GpuMigProfiles) -> String {
    let mig = if gpu.mig_enabled { "MIG on" } else { "MIG off" };
    let mut out = format!("GPU {}: {}, {mig}; {}\n", gpu.index, gpu.model, origin(gpu));
    if gpu.from_driver
        && let Some(catalog) = &gpu.catalog
    {
        for difference in &catalog.differences {
            out.push_str(&format!("  {difference}\n"));
        }
    }
    out.push_str(&profile_columns().render(&gpu.profiles));
    let read: Vec<&str> =
        gpu.profiles.iter().filter(|p| p.compute_from_driver).map(|p| p.name.as_str()).collect();
    if !read.is_empty() && read.len() < gpu.profiles.len() {
        out.push_str(&format!(
            "Compute instances as the driver reported them for {}; the MIG guide's rule for the others (the driver tells only for an instance that exists).\n",
            read.join(", ")
        ));
    }
    out
}

/// The profile table's columns.
fn profile_columns() -> Columns<'static, MigProfileInfo> {
    Columns::<MigProfileInfo>::new()
        .left("NAME", |p| p.name.clone())
        .right("ID", |p| p.id.to_string())
        .right("FREE/TOTAL", |p| {
            let free = p.instances_free.map_or_else(|| "-".to_owned(), |n| n.to_string());
            format!("{free}/{}", p.instances_total)
        })
        .right("MEMORY GiB", |p| gib(p.memory_mib))
        .right("SM", |p| p.sms.to_string())
        .right("DEC", |p| p.engines.decoders.to_string())
        .right("ENC", |p| p.engines.encoders.to_string())
        .right("CE", |p| p.engines.copy.to_string())
        .right("JPEG", |p| p.engines.jpeg.to_string())
        .right("OFA", |p| p.engines.ofa.to_string())
        .left("PLACEMENTS", placements)
        .left("COMPUTE INSTANCES", compute_instances)
        .left("ACCEPTS", |p| p.accepts.join(", "))
}

/// `3x1c 1x2c 1x3c`: the compute-instance sizes of one instance, with how many fit.
fn compute_instances(p: &MigProfileInfo) -> String {
    let sizes: Vec<String> =
        p.compute_instances.iter().map(|c| format!("{}x{}c", c.count, c.compute_slices)).collect();
    if sizes.is_empty() { "-".to_owned() } else { sizes.join(" ") }
}

/// Where the table comes from and how it compares with the catalog, for the header line.
fn origin(gpu: &GpuMigProfiles) -> String {
    if !gpu.from_driver {
        let key = gpu.catalog.as_ref().map_or_else(String::new, |c| format!(" ({})", c.key));
        return format!("profiles from gpushare's catalog{key}, not from the driver");
    }
    let comparison = match &gpu.catalog {
        None => "not in gpushare's catalog".to_owned(),
        Some(c) if c.differences.is_empty() => format!("agrees with the catalog ({})", c.key),
        Some(c) => format!(
            "{} from the catalog ({}); the driver's figures are used:",
            plural(c.differences.len(), "difference"),
            c.key
        ),
    };
    format!("profiles {}; {comparison}", gpu.source)
}

/// MiB as nvidia-smi prints GiB: MiB/1024 with two decimals (`9.75`, `19.62`).
pub fn gib(mib: u64) -> String {
    format!("{:.2}", mib as f64 / 1024.0)
}

/// `{0,2,4}:2`, as `nvidia-smi mig -lgipp` writes a profile's placements; `none` without.
pub fn placements(p: &MigProfileInfo) -> String {
    if p.placements.is_empty() {
        return "none".to_owned();
    }
    let starts: Vec<String> = p.placements.iter().map(u32::to_string).collect();
    format!("{{{}}}:{}", starts.join(","), p.memory_slices)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpushare_proto::types::{CatalogComparison, MigEngines};

    fn row(
        name: &str,
        (id, free, total): (u32, Option<u32>, u32),
        (mib, sms): (u64, u32),
        (slices, size): (u32, u32),
        (copy, media, ofa): (u32, u32, u32),
        placements: &[u32],
        accepts: &[&str],
    ) -> MigProfileInfo {
        MigProfileInfo {
            name: name.into(),
            id,
            nvml_enum: 0,
            instances_free: free,
            instances_total: total,
            memory_mib: mib,
            sms,
            compute_slices: slices,
            memory_slices: size,
            engines: MigEngines { copy, decoders: media, encoders: 0, jpeg: media, ofa },
            placements: placements.to_vec(),
            accepts: accepts.iter().map(|a| a.to_string()).collect(),
            compute_instances: Vec::new(),
            compute_from_driver: false,
        }
    }

    /// An H100 with MIG on and one 3g.40gb at slot 4, three of its profiles.
    fn h100(differences: &[&str]) -> GpuMigProfiles {
        GpuMigProfiles {
            index: 0,
            uuid: "GPU-00000000-0000-0000-0000-000000000000".into(),
            model: "H100-80GB-HBM3".into(),
            source: "read from the driver (580.159.04) through NVML".into(),
            from_driver: true,
            mig_enabled: true,
            memory_slots: 8,
            compute_slices: 7,
            catalog: Some(CatalogComparison {
                key: "h100-80gb".into(),
                differences: differences.iter().map(|d| d.to_string()).collect(),
            }),
            profiles: vec![
                row(
                    "1g.10gb",
                    (19, Some(4), 7),
                    (9984, 16),
                    (1, 1),
                    (1, 1, 0),
                    &[0, 1, 2, 3, 4, 5, 6],
                    &["1g.10gb", "1g"],
                ),
                row(
                    "1g.20gb",
                    (15, Some(2), 4),
                    (20096, 26),
                    (1, 2),
                    (1, 1, 0),
                    &[0, 2, 4, 6],
                    &["1g.20gb"],
                ),
                row(
                    "7g.80gb",
                    (0, Some(0), 1),
                    (81152, 132),
                    (7, 8),
                    (8, 7, 1),
                    &[0],
                    &["7g.80gb", "7g"],
                ),
            ],
        }
    }

    #[test]
    fn a_gpu_renders_in_nvidia_smi_columns() {
        let mut gpu = h100(&[]);
        let sizes = |list: &[(u32, u32)]| -> Vec<ComputeInstanceSize> {
            list.iter()
                .map(|&(compute_slices, count)| ComputeInstanceSize { compute_slices, count })
                .collect()
        };
        gpu.profiles[0].compute_instances = sizes(&[(1, 1)]);
        gpu.profiles[1].compute_instances = sizes(&[(1, 1)]);
        gpu.profiles[2].compute_instances = sizes(&[(1, 7), (2, 3), (3, 2), (4, 1), (7, 1)]);
        gpu.profiles[2].compute_from_driver = true;
        let text = render_mig_profiles(&MigProfiles { gpus: vec![gpu] });
        assert_eq!(
            text,
            "GPU 0: H100-80GB-HBM3, MIG on; profiles read from the driver (580.159.04) through NVML; agrees with the catalog (h100-80gb)\n\
             NAME     ID  FREE/TOTAL  MEMORY GiB   SM  DEC  ENC  CE  JPEG  OFA  PLACEMENTS         COMPUTE INSTANCES         ACCEPTS\n\
             1g.10gb  19         4/7        9.75   16    1    0   1     1    0  {0,1,2,3,4,5,6}:1  1x1c                      1g.10gb, 1g\n\
             1g.20gb  15         2/4       19.62   26    1    0   1     1    0  {0,2,4,6}:2        1x1c                      1g.20gb\n\
             7g.80gb   0         0/1       79.25  132    7    0   8     7    1  {0}:8              7x1c 3x2c 2x3c 1x4c 1x7c  7g.80gb, 7g\n\
             Compute instances as the driver reported them for 7g.80gb; the MIG guide's rule for the others (the driver tells only for an instance that exists).\n"
        );
    }

    #[test]
    fn differences_mig_off_and_catalog_tables_say_so() {
        let mut gpu = h100(&["h100-80gb 1g.10gb (enum 0): SMs: NVML 14, catalog 16"]);
        gpu.mig_enabled = false;
        for p in &mut gpu.profiles {
            p.instances_free = None;
        }
        let mut second = h100(&[]);
        second.index = 1;
        second.from_driver = false;
        second.source = "read off a real H100".into();
        let mut third = h100(&[]);
        third.index = 2;
        third.catalog = None;
        let text = render_mig_profiles(&MigProfiles { gpus: vec![gpu, second, third] });
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "GPU 0: H100-80GB-HBM3, MIG off; profiles read from the driver (580.159.04) through NVML; 1 difference from the catalog (h100-80gb); the driver's figures are used:"
        );
        assert_eq!(lines[1], "  h100-80gb 1g.10gb (enum 0): SMs: NVML 14, catalog 16");
        assert!(lines[3].starts_with("1g.10gb  19         -/7"), "{text}");
        // A blank line between GPUs.
        assert_eq!(lines[6], "", "{text}");
        assert_eq!(
            lines[7],
            "GPU 1: H100-80GB-HBM3, MIG on; profiles from gpushare's catalog (h100-80gb), not from the driver"
        );
        assert!(
            text.contains("GPU 2: H100-80GB-HBM3, MIG on; profiles read from the driver (580.159.04) through NVML; not in gpushare's catalog\n"),
            "{text}"
        );
    }

    #[test]
    fn memory_and_placements_as_nvidia_smi_writes_them() {
        // nvidia-smi mig -lgip on the H100: 9.75, 19.62, 39.50, 79.25.
        assert_eq!(gib(9984), "9.75");
        assert_eq!(gib(20096), "19.62");
        assert_eq!(gib(40448), "39.50");
        assert_eq!(gib(81152), "79.25");
        let mut p = h100(&[]).profiles.remove(1);
        assert_eq!(placements(&p), "{0,2,4,6}:2");
        p.placements.clear();
        assert_eq!(placements(&p), "none");
        assert_eq!(render_mig_profiles(&MigProfiles { gpus: vec![] }), "No GPU with MIG.\n");
    }

    #[test]
    fn the_document_parses() {
        let doc = MigProfiles { gpus: vec![h100(&[])] };
        let raw = serde_json::to_string(&doc).unwrap();
        assert!(raw.contains(r#""accepts":["1g.10gb","1g"]"#), "{raw}");
        assert!(raw.contains(r#""engines":{"copy":1,"decoders":1,"encoders":0,"jpeg":1,"ofa":0}"#));
        let back: MigProfiles = parse_document(&raw, "MigProfiles").unwrap();
        assert_eq!(back, doc);
    }
}
