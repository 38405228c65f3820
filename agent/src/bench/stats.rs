//! The one statistics module of bench and probe (issue 12; being filled in).

/// A replica's latencies over a measurement window, as its method observed them.
#[derive(Debug, Clone, PartialEq)]
pub enum Latencies {
    /// One latency per unit, ms (units by line; wall times with `--until-exit`).
    Samples(Vec<f64>),
    /// A Prometheus histogram's bucket deltas over the window: (upper bound `le` in ms,
    /// cumulative count), ascending, the last bound `+Inf` (`f64::INFINITY`).
    Buckets(Vec<(f64, u64)>),
    /// Nothing was observed.
    None,
}
