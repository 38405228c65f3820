use super::*;

/// The fields the parser accepts where `table` (`""`: the top level) is, from its refusal
/// of an unknown one (serde lists the expected fields).
fn accepted(table: &str) -> Option<Vec<String>> {
    let text = if table.is_empty() {
        "no_such_key_here = 1\n".to_string()
    } else {
        format!("[{table}]\nno_such_key_here = 1\n")
    };
    let e = AgentConfig::parse(&text, "agent.toml").err()?;
    let (_, expected) = e.split_once("unknown field `no_such_key_here`, expected ")?;
    let expected = expected.strip_prefix("one of ").unwrap_or(expected);
    let fields = expected
        .split(", ")
        .flat_map(|f| f.split("` or `"))
        .map(|f| f.trim().trim_matches('`').to_string())
        .collect();
    Some(fields)
}

#[test]
fn every_key_the_parser_accepts_is_in_the_page() {
    let page = render(clap::Command::new("gpushare-agent")).unwrap();
    let top = accepted("").expect("the parser lists its top-level keys");
    let mut seen = 0;
    for field in &top {
        match accepted(field) {
            // A table: each of its keys.
            Some(inner) => {
                assert!(page.contains(&format!("[{field}]")), "no [{field}] in the page");
                for key in inner {
                    let named = keys().iter().any(|k| k.table == field && k.name == key);
                    assert!(named, "[{field}] {key} is accepted but not in the man page");
                    seen += 1;
                }
            }
            None => {
                let named = keys().iter().any(|k| k.table.is_empty() && k.name == *field);
                assert!(named, "{field} is accepted but not in the man page");
                seen += 1;
            }
        }
    }
    assert_eq!(seen, keys().len(), "the page names keys the parser does not accept");
    for k in keys() {
        assert!(page.contains(&escape(&format!("{} = ", k.name))), "{} not rendered", k.name);
    }
}

#[test]
fn every_default_in_the_page_is_the_parsers() {
    for k in keys().iter().filter(|k| k.default != "unset") {
        let text = if k.table.is_empty() {
            format!("{} = {}\n", k.name, k.default)
        } else {
            format!("[{}]\n{} = {}\n", k.table, k.name, k.default)
        };
        let mut parsed =
            AgentConfig::parse(&text, "agent.toml").unwrap_or_else(|e| panic!("{text}: {e}"));
        // Which keys the file wrote is not a value.
        parsed.written = Default::default();
        assert_eq!(parsed, AgentConfig::default(), "{text}");
    }
}

/// The variables the agent's and the simulated driver's code read, by constant or literal.
fn variables_read() -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut names = Vec::new();
    let mut dirs = vec![root.join("src"), root.join("../sim/nvml/src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.file_name().is_some_and(|n| n == "tests.rs")
                || path.extension().is_none_or(|e| e != "rs")
            {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or_default();
            for line in code.lines() {
                let quoted = line.split('"').nth(1).unwrap_or_default();
                let is_name = !quoted.is_empty()
                    && quoted.chars().all(|c| c.is_ascii_uppercase() || c == '_')
                    && quoted.contains('_');
                let reads = line.contains("env::var(\"") || line.contains("env::var_os(\"");
                let constant = line.contains("_ENV: &str = \"");
                if is_name && (reads || constant) {
                    names.push(quoted.to_string());
                }
            }
        }
    }
    names.sort();
    names.dedup();
    names
}

#[test]
fn every_variable_the_code_reads_is_in_the_page() {
    let page = render(clap::Command::new("gpushare-agent")).unwrap();
    let names = variables_read();
    assert!(names.len() > 10, "{names:?}");
    for name in names {
        assert!(page.contains(&escape(&name)), "{name} is read but not in the man page");
    }
    assert!(page.contains("GPUSHARE_BUS_ADDRESS"));
}

#[test]
fn the_page_has_its_sections_and_options() {
    let cmd = clap::Command::new("gpushare-agent")
        .arg(clap::Arg::new("simulate").long("simulate").help("Simulated GPUs"));
    let page = render(cmd).unwrap();
    for section in
        ["NAME", "SYNOPSIS", "OPTIONS", "FILES", "CONFIGURATION", "SIGNALS", "ENVIRONMENT"]
    {
        assert!(page.contains(&format!(".SH {section}")), "{section}");
    }
    assert!(page.contains("simulate"));
    for line in page.lines() {
        assert!(!line.starts_with('\'') && !line.starts_with(".SH \\&"), "{line}");
    }
    assert!(page.contains("SIGHUP") && page.contains("SIGTERM"));
}

#[test]
fn the_page_names_a_simulated_agents_own_place() {
    let page = render(clap::Command::new("gpushare-agent")).unwrap();
    assert!(
        page.contains(&escape(crate::simulator::ROOT_STATE_DIR)),
        "no {}",
        crate::simulator::ROOT_STATE_DIR
    );
}
