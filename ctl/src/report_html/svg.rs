//! A line chart of figures against the replica count, drawn as inline SVG: axes with
//! round ticks, dashed reference lines, error bars, a polyline and markers per series,
//! and the legend. What is charted is [`super::charts`]'s.

use std::fmt::Write as _;

use super::markup::escape;
use super::text::figure;

/// One line of a chart: a strategy's figure at each replica count it has one for.
pub(super) struct Series {
    /// Legend text.
    pub(super) label: String,
    /// Stroke and marker colour.
    pub(super) color: &'static str,
    /// Dashed line and hollow markers.
    pub(super) dashed: bool,
    /// `(N, figure)`; `None` breaks the line.
    pub(super) points: Vec<(f64, Option<f64>)>,
    /// `(N, [low, high])`: the figures' intervals, drawn as error bars.
    pub(super) bars: Vec<(f64, [f64; 2])>,
    /// The unit in marker tooltips (`units/s`).
    pub(super) unit: &'static str,
}

/// A horizontal reference line, dashed.
pub(super) struct Reference {
    /// Its height.
    pub(super) y: f64,
    /// The text on the line.
    pub(super) label: String,
    /// The text in the legend.
    pub(super) legend: String,
    /// Its colour.
    pub(super) color: &'static str,
}

/// A line chart of figures against the replica count.
pub(super) struct Chart {
    /// Accessible name.
    pub(super) title: String,
    /// The vertical axis's title.
    pub(super) y_label: &'static str,
    pub(super) series: Vec<Series>,
    pub(super) references: Vec<Reference>,
}

/// Chart geometry, in SVG units.
const WIDTH: f64 = 900.0;
const HEIGHT: f64 = 400.0;
const LEFT: f64 = 78.0;
const RIGHT: f64 = 210.0;
const TOP: f64 = 20.0;
const BOTTOM: f64 = 56.0;

/// Round tick steps: 1, 2, 2.5 or 5 times a power of ten, about `span / 5`.
pub fn tick_step(span: f64) -> f64 {
    let raw = (span / 5.0).max(f64::MIN_POSITIVE);
    let power = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0].into_iter().find(|m| m * power >= raw).unwrap_or(10.0);
    step * power
}

/// A tick label: `0`, `2.5`, `1200`, `15k`, `2.5M`.
pub(super) fn tick_label(value: f64) -> String {
    let magnitude = value.abs();
    let compact = |scaled: f64, suffix: &str| {
        let text = format!("{scaled:.1}");
        format!("{}{suffix}", text.trim_end_matches('0').trim_end_matches('.'))
    };
    if magnitude >= 1e6 {
        compact(value / 1e6, "M")
    } else if magnitude >= 1e4 {
        compact(value / 1e3, "k")
    } else if magnitude >= 1.0 || magnitude == 0.0 {
        compact(value, "")
    } else {
        figure(value)
    }
}

impl Chart {
    /// The SVG, or a line saying there is nothing to draw.
    pub(super) fn svg(&self) -> String {
        let xs: Vec<f64> = self.series.iter().flat_map(|s| s.points.iter().map(|p| p.0)).collect();
        let ys: Vec<f64> = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().filter_map(|p| p.1))
            .chain(self.series.iter().flat_map(|s| s.bars.iter().map(|b| b.1[1])))
            .chain(self.references.iter().map(|r| r.y))
            .filter(|y| y.is_finite())
            .collect();
        let drawn = self.series.iter().any(|s| s.points.iter().any(|p| p.1.is_some()));
        if !drawn {
            return "<p class=\"empty\">No figures to chart: no run measured any.</p>\n".into();
        }
        let x_max = xs.iter().copied().fold(1.0, f64::max);
        let y_top = ys.iter().copied().fold(0.0, f64::max);
        let step = tick_step(if y_top > 0.0 { y_top } else { 1.0 });
        let y_max = ((y_top * 1.05) / step).ceil().max(1.0) * step;
        let x_hi = x_max + (x_max * 0.06).max(0.5);
        let (plot_w, plot_h) = (WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM);
        let px = |x: f64| LEFT + x / x_hi * plot_w;
        let py = |y: f64| TOP + plot_h - (y.clamp(0.0, y_max) / y_max) * plot_h;

        let mut svg = String::new();
        let _ = write!(
            svg,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" width=\"{WIDTH}\" height=\"{HEIGHT}\" role=\"img\" font-family=\"system-ui, sans-serif\" font-size=\"12\">\n<title>{}</title>\n",
            escape(&self.title)
        );
        // Grid and vertical axis ticks.
        let mut y = 0.0;
        while y <= y_max + step / 2.0 {
            let at = py(y);
            let _ = writeln!(
                svg,
                "<line x1=\"{LEFT}\" x2=\"{:.1}\" y1=\"{at:.1}\" y2=\"{at:.1}\" stroke=\"#e5e7eb\"/>\
                 <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"#374151\">{}</text>",
                LEFT + plot_w,
                LEFT - 8.0,
                at + 4.0,
                tick_label(y)
            );
            y += step;
        }
        // Horizontal axis ticks: every replica count measured.
        let mut counts: Vec<f64> = xs.clone();
        counts.sort_by(f64::total_cmp);
        counts.dedup();
        for n in &counts {
            let at = px(*n);
            let _ = writeln!(
                svg,
                "<line x1=\"{at:.1}\" x2=\"{at:.1}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"#374151\"/>\
                 <text x=\"{at:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#374151\">{n}</text>",
                TOP + plot_h,
                TOP + plot_h + 5.0,
                TOP + plot_h + 19.0
            );
        }
        // Axes and their titles.
        let _ = write!(
            svg,
            "<line x1=\"{LEFT}\" x2=\"{LEFT}\" y1=\"{TOP}\" y2=\"{:.1}\" stroke=\"#374151\"/>\
             <line x1=\"{LEFT}\" x2=\"{:.1}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"#374151\"/>\n\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#111827\">replicas (N)</text>\n\
             <text transform=\"translate(18 {:.1}) rotate(-90)\" text-anchor=\"middle\" fill=\"#111827\">{}</text>\n",
            TOP + plot_h,
            LEFT + plot_w,
            TOP + plot_h,
            TOP + plot_h,
            LEFT + plot_w / 2.0,
            HEIGHT - 14.0,
            TOP + plot_h / 2.0,
            escape(self.y_label)
        );
        // References, under the lines.
        for r in &self.references {
            let at = py(r.y);
            let _ = writeln!(
                svg,
                "<line x1=\"{LEFT}\" x2=\"{:.1}\" y1=\"{at:.1}\" y2=\"{at:.1}\" stroke=\"{}\" stroke-width=\"1.5\" stroke-dasharray=\"3 4\"/>\
                 <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"{}\">{}</text>",
                LEFT + plot_w,
                r.color,
                LEFT + plot_w - 4.0,
                at - 5.0,
                r.color,
                escape(&r.label)
            );
        }
        // Error bars, under the lines: a vertical line from low to high, capped.
        for s in &self.series {
            for (n, [low, high]) in &s.bars {
                if !(low.is_finite() && high.is_finite()) {
                    continue;
                }
                let (x, top, bottom) = (px(*n), py(*high), py(*low));
                let tip = format!(
                    "{}, N={n}: interval {}–{} {}",
                    s.label,
                    figure(*low),
                    figure(*high),
                    s.unit
                );
                let _ = writeln!(
                    svg,
                    "<g class=\"interval\" stroke=\"{}\" stroke-width=\"1.5\"><title>{}</title>\
                     <line x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"{top:.1}\" y2=\"{bottom:.1}\"/>\
                     <line x1=\"{:.1}\" x2=\"{:.1}\" y1=\"{top:.1}\" y2=\"{top:.1}\"/>\
                     <line x1=\"{:.1}\" x2=\"{:.1}\" y1=\"{bottom:.1}\" y2=\"{bottom:.1}\"/></g>",
                    s.color,
                    escape(&tip),
                    x - 5.0,
                    x + 5.0,
                    x - 5.0,
                    x + 5.0
                );
            }
        }
        // The series: a polyline per unbroken stretch, and a marker per figure.
        for s in &self.series {
            let dash = if s.dashed { " stroke-dasharray=\"8 5\"" } else { "" };
            let mut stretch: Vec<String> = Vec::new();
            let flush = |stretch: &mut Vec<String>, svg: &mut String| {
                if stretch.len() > 1 {
                    let _ = writeln!(
                        svg,
                        "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2.5\"{dash} points=\"{}\"/>",
                        s.color,
                        stretch.join(" ")
                    );
                }
                stretch.clear();
            };
            for (n, value) in &s.points {
                match value {
                    Some(v) if v.is_finite() => {
                        stretch.push(format!("{:.1},{:.1}", px(*n), py(*v)))
                    }
                    _ => flush(&mut stretch, &mut svg),
                }
            }
            flush(&mut stretch, &mut svg);
            for (n, value) in &s.points {
                let Some(v) = value.filter(|v| v.is_finite()) else { continue };
                let tip = format!("{}, N={n}: {} {}", s.label, figure(v), s.unit);
                let (x, y) = (px(*n), py(v));
                let shape = if s.dashed {
                    format!(
                        "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"8\" height=\"8\" fill=\"#fff\" stroke=\"{}\" stroke-width=\"2\">",
                        x - 4.0,
                        y - 4.0,
                        s.color
                    )
                } else {
                    format!("<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"4.5\" fill=\"{}\">", s.color)
                };
                let close = if s.dashed { "</rect>" } else { "</circle>" };
                let _ = writeln!(svg, "{shape}<title>{}</title>{close}", escape(&tip));
            }
        }
        // The legend, right of the plot.
        let legend_x = LEFT + plot_w + 20.0;
        for (i, s) in self.series.iter().enumerate() {
            let y = TOP + 10.0 + i as f64 * 22.0;
            let dash = if s.dashed { " stroke-dasharray=\"6 4\"" } else { "" };
            let _ = writeln!(
                svg,
                "<line x1=\"{legend_x:.1}\" x2=\"{:.1}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"{}\" stroke-width=\"2.5\"{dash}/>\
                 <text x=\"{:.1}\" y=\"{:.1}\" fill=\"#111827\">{}</text>",
                legend_x + 28.0,
                s.color,
                legend_x + 36.0,
                y + 4.0,
                escape(&s.label)
            );
        }
        for (i, r) in self.references.iter().enumerate() {
            let y = TOP + 10.0 + (self.series.len() + i) as f64 * 22.0;
            let _ = writeln!(
                svg,
                "<line x1=\"{legend_x:.1}\" x2=\"{:.1}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"{}\" stroke-width=\"1.5\" stroke-dasharray=\"3 4\"/>\
                 <text x=\"{:.1}\" y=\"{:.1}\" fill=\"#111827\">{}</text>",
                legend_x + 28.0,
                r.color,
                legend_x + 36.0,
                y + 4.0,
                escape(&r.legend)
            );
        }
        svg.push_str("</svg>\n");
        svg
    }
}
