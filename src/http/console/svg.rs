//! Small bar charts as inline SVG markup: no script, no images to fetch, readable without
//! JS. Each bar has a `<title>` so hovering shows its value.

use maud::{Markup, html};

/// One bar: a label (shown on hover), and stacked values drawn in `class` order.
#[derive(Debug)]
pub(super) struct Bar {
    pub(super) label: String,
    pub(super) values: Vec<u64>,
}

const WIDTH: u64 = 600;
const HEIGHT: u64 = 120;

/// Stacked bars, one per entry, scaled to the largest total; `classes` names each
/// series' CSS class (colours live in the stylesheet, which the CSP allows).
pub(super) fn bars(title: &str, bars: &[Bar], classes: &[&str]) -> Markup {
    let max = bars.iter().map(|b| b.values.iter().sum::<u64>()).max().unwrap_or(0).max(1);
    let slot = WIDTH as f64 / bars.len().max(1) as f64;
    let width = (slot * 0.8).max(1.0);
    html! {
        svg.chart viewBox=(format!("0 0 {WIDTH} {HEIGHT}")) role="img" aria-label=(title) preserveAspectRatio="none" {
            title { (title) }
            line.axis x1="0" y1=(HEIGHT) x2=(WIDTH) y2=(HEIGHT) {}
            @for (i, bar) in bars.iter().enumerate() {
                @let x = i as f64 * slot + (slot - width) / 2.0;
                g {
                    title { (bar.label) ": " (bar.values.iter().map(u64::to_string).collect::<Vec<_>>().join(" / ")) }
                    @for (class, y, h) in stack(&bar.values, classes, max) {
                        rect class=(class) x=(format!("{x:.1}")) y=(format!("{y:.1}")) width=(format!("{width:.1}")) height=(format!("{h:.1}")) {}
                    }
                }
            }
        }
    }
}

/// Each value's (class, top, height), stacked from the axis up.
fn stack<'a>(values: &[u64], classes: &[&'a str], max: u64) -> Vec<(&'a str, f64, f64)> {
    let mut base = HEIGHT as f64;
    let mut out = Vec::new();
    for (value, class) in values.iter().zip(classes) {
        let h = *value as f64 / max as f64 * (HEIGHT as f64 - 4.0);
        base -= h;
        out.push((*class, base, h));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_scale_to_the_largest() {
        let svg = bars(
            "t",
            &[Bar { label: "a".into(), values: vec![2, 0] }, Bar { label: "b".into(), values: vec![4, 4] }],
            &["x", "y"],
        )
        .into_string();
        assert!(svg.starts_with("<svg"), "{svg}");
        assert_eq!(svg.matches("<rect").count(), 4);
        // The tallest stack fills the height (less the margin): 8 of 8.
        assert!(svg.contains("height=\"58.0\""), "{svg}");
        assert!(svg.contains("<title>b: 4 / 4</title>"), "{svg}");
    }
}
