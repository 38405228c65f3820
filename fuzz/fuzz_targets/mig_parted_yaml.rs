//! mig-parted config files (YAML) never panic the importer.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = gpushare_agent::profile::migparted::config_names(text, "fuzz.yaml");
        let _ = gpushare_agent::profile::migparted::parse_mig_parted(text, "fuzz.yaml", "all-balanced");
    }
});
