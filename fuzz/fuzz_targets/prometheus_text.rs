//! A metrics page a bench replica serves (the caller's program's text, read inside the root
//! daemon) never panics the bench's Prometheus text parser; a histogram read from it is
//! one `delta` takes against itself; and a page refused is said in one line of at most
//! 2,000 characters, with nothing of the page in it that could change how a terminal or
//! the journal shows it. The same checks run on stable in the normal test suite
//! (`bench::histogram::tests::holds_for`), over the seeds in `seeds/prometheus_text/`.
#![no_main]
use gpushare_agent::bench::histogram;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(page) = std::str::from_utf8(data) else { return };
    for name in ["x", "request_latency_seconds", "rpc_duration_seconds", "lat_ms"] {
        match histogram::parse(page, name, "127.0.0.1:9101") {
            Ok(h) => {
                let none = histogram::delta(&h, &h).expect("a histogram minus itself");
                assert_eq!(none.count, 0);
                let _ = h.latencies_ms(name).percentile(99.0);
                let _ = h.rate(1.5);
            }
            Err(e) => {
                assert!(!e.contains('\n'), "{e:?}");
                assert!(e.chars().count() <= 2000, "{} chars", e.len());
                assert!(gpushare_agent::sys::text::is_printable(&e), "{e:?}");
            }
        }
    }
});
