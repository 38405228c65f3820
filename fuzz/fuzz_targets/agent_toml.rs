//! agent.toml never panics the configuration parser.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = gpushare_agent::config::AgentConfig::parse(text, "agent.toml");
    }
});
