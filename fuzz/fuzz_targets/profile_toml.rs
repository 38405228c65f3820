//! Profile files (TOML) never panic the parser.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = gpushare_agent::profile::parse_profile(text, "fuzz.toml", Some("fuzz"));
    }
});
