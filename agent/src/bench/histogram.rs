//! Prometheus histogram scrape (issue 12; being filled in).
