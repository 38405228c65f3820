//! What the page's HTML and SVG share: escaping text for them, and each strategy's
//! colour (in charts, legends and the runs' headings). A leaf.

/// Escapes text for HTML content and quoted attributes.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The colour of a strategy in charts and legends.
pub(super) fn color(strategy: &str, position: usize) -> &'static str {
    const OTHERS: [&str; 4] = ["#8c564b", "#e377c2", "#7f7f7f", "#bcbd22"];
    match strategy {
        "time-slicing" => "#1f77b4",
        "mps" => "#d62728",
        "mps-limited" => "#2ca02c",
        "mig" => "#9467bd",
        _ => OTHERS[position % OTHERS.len()],
    }
}
