//! Issue 10, item 1: no document a caller may send (up to the size limit) costs the agent
//! more than time linear-ish in its size, and another client's `status` is answered all
//! along (its times are printed; scripts/bench --floods measures them).
//! Every user may call `ValidateProfile` and `PlanDocument`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use gpushare_proto::{AgentProxy, PROFILE_MAX_BYTES};
use gpushare_tests::{Agent, AgentOptions};

/// A document of the family `kind`, of about `bytes` bytes (never more).
fn document(kind: &str, bytes: usize) -> (String, &'static str) {
    let fill = |unit: &str, head: &str, tail: &str| {
        let mut text = head.to_string();
        while text.len() + unit.len() + tail.len() <= bytes {
            text.push_str(unit);
        }
        text.push_str(tail);
        text
    };
    match kind {
        // Rule after rule: over the rule limit, refused.
        "rules" => (fill("[[gpu]]\nselect = \"all\"\n", "name = \"x\"\n", ""), "hostile.toml"),
        // One rule, padded with comments to the size.
        "comments" => {
            (fill("# padding padding padding\n", "[[gpu]]\nselect = \"all\"\n", ""), "hostile.toml")
        }
        // One long string.
        "string" => {
            (fill("a", "description = \"", "\"\n[[gpu]]\nselect = \"all\"\n"), "hostile.toml")
        }
        // Arrays nested as deep as the size allows.
        "nesting" => {
            let depth = bytes.saturating_sub(40) / 2;
            let text = format!("[[gpu]]\nselect = {}{}\n", "[".repeat(depth), "]".repeat(depth));
            (text, "hostile.toml")
        }
        // Inline tables nested likewise.
        "tables" => {
            let depth = bytes.saturating_sub(40) / 6;
            let text = format!(
                "[[gpu]]\nselect = \"all\"\nmig = {}{}\n",
                "{a=".repeat(depth),
                "}".repeat(depth)
            );
            (text, "hostile.toml")
        }
        // mig-parted configs, many of them.
        "yaml" => (
            fill(
                "  c:\n    - devices: all\n      mig-enabled: false\n",
                "version: v1\nmig-configs:\n",
                "",
            ),
            "hostile.yaml",
        ),
        other => panic!("no family {other}"),
    }
}

const FAMILIES: [&str; 6] = ["rules", "comments", "string", "nesting", "tables", "yaml"];

#[test]
fn hostile_documents_cost_linear_time_and_never_hold_up_status() {
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:8"));
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().unwrap();
    runtime.block_on(async {
        let connection =
            zbus::connection::Builder::address(agent.bus.address()).unwrap().build().await.unwrap();
        let agent_proxy = AgentProxy::new(&connection).await.unwrap();

        // Another client reads status all along, and times each answer.
        let done = Arc::new(AtomicBool::new(false));
        let watcher = {
            let proxy = agent_proxy.clone();
            let done = Arc::clone(&done);
            tokio::spawn(async move {
                let mut slowest = Duration::ZERO;
                let mut answers = 0;
                while !done.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    proxy.status().await.expect("status answers");
                    slowest = slowest.max(started.elapsed());
                    answers += 1;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                (slowest, answers)
            })
        };

        for kind in FAMILIES {
            let mut times = Vec::new();
            for bytes in [PROFILE_MAX_BYTES / 8, PROFILE_MAX_BYTES] {
                let (text, origin) = document(kind, bytes);
                assert!(text.len() <= PROFILE_MAX_BYTES, "{kind}: {} bytes", text.len());
                // Four callers at once: more than the agent has worker threads.
                let started = Instant::now();
                let calls = (0..4).map(|_| {
                    let proxy = agent_proxy.clone();
                    let text = text.clone();
                    async move { proxy.validate_profile(&text, origin).await }
                });
                let answers = futures_util::future::join_all(calls).await;
                let took = started.elapsed();
                for answer in answers {
                    if let Err(e) = answer {
                        let message = e.to_string();
                        assert!(!message.contains('\n'), "{kind}: one line: {message}");
                    }
                }
                times.push(took);
            }
            // Eight times the size costs well under the square of it: linear-ish, with room
            // for a busy machine (the small one is mostly fixed cost, counted as 5 ms at
            // least so that a lucky small batch does not decide).
            let (small, large) = (times[0].max(Duration::from_millis(5)), times[1]);
            eprintln!("{kind}: {:?} at 1/8 the size, {large:?} at the limit", times[0]);
            assert!(
                large < small * 64,
                "{kind}: {small:?} at 1/8 the size, {large:?} at the limit"
            );
        }

        // One byte over the limit is refused, in one line naming the limit.
        let (mut text, origin) = document("comments", PROFILE_MAX_BYTES);
        text.push_str(&"#".repeat(PROFILE_MAX_BYTES + 1 - text.len()));
        let refused = agent_proxy.validate_profile(&text, origin).await.unwrap_err().to_string();
        assert!(refused.contains("KiB"), "{refused}");

        done.store(true, Ordering::Relaxed);
        // Status answered all along (the watcher fails on an error); how fast is printed,
        // not bounded: on a loaded machine it follows the load (scripts/bench --floods
        // measures another user's status under floods of documents).
        let (slowest, answers) = watcher.await.unwrap();
        assert!(answers > 0);
        eprintln!("status: {answers} answers while documents were parsed, the slowest {slowest:?}");
    });
}
