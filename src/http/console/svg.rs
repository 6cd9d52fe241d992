//! Small bar charts as inline SVG markup: no script, no images to fetch, readable without
//! JS. A chart says what it counts: a y axis with labelled gridlines in its unit, time
//! labels under the x axis, and a `<title>` on each bar so hovering shows its exact
//! values. The y scale tops out at a round number at or above the largest bar, so the
//! gridlines read as round values rather than as fractions of whatever the peak was.

use maud::{Markup, html};

/// One bar: its full label (shown on hover), a short label for the x axis, and stacked
/// values drawn in `classes` order. An unsampled bar (a time nothing was counted) is
/// drawn as a shaded slot, not as a zero.
#[derive(Debug)]
pub(super) struct Bar {
    pub(super) label: String,
    pub(super) tick: String,
    pub(super) values: Vec<u64>,
    pub(super) sampled: bool,
}

/// What the y axis counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Unit {
    /// Extractions (or any count).
    Count,
    /// Micro-dollars, labelled as dollars.
    Micros,
}

impl Unit {
    fn label(self, value: u64) -> String {
        match self {
            Unit::Count => value.to_string(),
            Unit::Micros => dollar_tick(value),
        }
    }
}

/// A chart's fixed frame: the viewBox, and the plot area within it, leaving room on the
/// left for the y labels and below for the x labels.
const WIDTH: f64 = 960.0;
const HEIGHT: f64 = 200.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 8.0;
const TOP: f64 = 10.0;
const BOTTOM: f64 = 24.0;
/// Gridlines above the zero line.
const GRIDLINES: u64 = 4;
/// At most this many x labels, so they never run into each other.
const X_LABELS: usize = 7;

/// Stacked bars, one per entry, on a y axis in `unit` from zero to a round value at or
/// above the largest total; `classes` names each series' CSS class (colours live in the
/// stylesheet, which the CSP allows).
pub(super) fn bars(title: &str, bars: &[Bar], classes: &[&str], unit: Unit) -> Markup {
    let largest = bars.iter().map(|b| b.values.iter().sum::<u64>()).max().unwrap_or(0);
    let top = round_up(largest, unit);
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let slot = plot_w / bars.len().max(1) as f64;
    let width = (slot * 0.8).max(1.0);
    let label_every = bars.len().div_ceil(X_LABELS).max(1);
    html! {
        svg.chart viewBox=(format!("0 0 {WIDTH} {HEIGHT}")) role="img" aria-label=(title) {
            title { (title) }
            @for step in 0..=GRIDLINES {
                @let value = top / GRIDLINES * step;
                @let y = TOP + plot_h - plot_h * step as f64 / GRIDLINES as f64;
                line class=(if step == 0 { "axis" } else { "grid" }) x1=(LEFT) y1=(fmt(y)) x2=(WIDTH - RIGHT) y2=(fmt(y)) {}
                text.y-tick x=(LEFT - 6.0) y=(fmt(y + 4.0)) text-anchor="end" { (unit.label(value)) }
            }
            line.axis x1=(LEFT) y1=(TOP) x2=(LEFT) y2=(TOP + plot_h) {}
            @for (i, bar) in bars.iter().enumerate() {
                @let x = LEFT + i as f64 * slot + (slot - width) / 2.0;
                @if bar.sampled {
                    g {
                        title { (bar.label) ": " (bar.values.iter().map(|v| unit.label(*v)).collect::<Vec<_>>().join(" / ")) }
                        @for (class, y, h) in stack(&bar.values, classes, top, plot_h) {
                            rect class=(class) x=(fmt(x)) y=(fmt(y)) width=(fmt(width)) height=(fmt(h)) {}
                        }
                    }
                } @else {
                    rect.unsampled x=(fmt(LEFT + i as f64 * slot)) y=(TOP) width=(fmt(slot)) height=(fmt(plot_h)) {
                        title { (bar.label) ": not sampled" }
                    }
                }
                // Labels count back from the last bar, so the newest one is always named.
                @if (bars.len() - 1 - i).is_multiple_of(label_every) {
                    text.x-tick x=(fmt(x + width / 2.0)) y=(fmt(HEIGHT - 6.0)) text-anchor="middle" { (bar.tick) }
                }
            }
        }
    }
}

fn fmt(v: f64) -> String {
    format!("{v:.1}")
}

/// Each value's (class, top, height), stacked from the axis up, scaled so `top` fills
/// the plot's height.
fn stack<'a>(values: &[u64], classes: &[&'a str], top: u64, plot_h: f64) -> Vec<(&'a str, f64, f64)> {
    let mut base = TOP + plot_h;
    let mut out = Vec::new();
    for (value, class) in values.iter().zip(classes) {
        let h = *value as f64 / top as f64 * plot_h;
        base -= h;
        out.push((*class, base, h));
    }
    out
}

/// The smallest value at or above `largest` that `GRIDLINES` divides into round steps
/// (1, 2, 3, 4, 5, 6 or 8 times a power of ten; for dollars, at least a cent a step).
fn round_up(largest: u64, unit: Unit) -> u64 {
    let floor = match unit {
        Unit::Count => 1,
        Unit::Micros => 10_000,
    };
    let needed = largest.div_ceil(GRIDLINES).max(floor);
    let mut magnitude = 1u64;
    while magnitude.saturating_mul(10) <= needed {
        magnitude *= 10;
    }
    let step = [1, 2, 3, 4, 5, 6, 8, 10].into_iter().map(|m| m * magnitude).find(|s| *s >= needed).unwrap_or(needed);
    step * GRIDLINES
}

/// The ledger's dollars (`$1.500000`) without the trailing zeros past the cents: `$1.50`.
fn dollar_tick(micros: u64) -> String {
    let exact = crate::engine::ledger::dollars(micros);
    let cents_end = exact.find('.').map_or(exact.len(), |dot| dot + 3);
    let end = exact.trim_end_matches('0').len().max(cents_end);
    exact[..end].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bar(label: &str, values: Vec<u64>) -> Bar {
        Bar { label: label.into(), tick: label.into(), values, sampled: true }
    }

    #[test]
    fn the_tallest_bar_reaches_its_value_on_a_round_axis() {
        let svg = bars("t", &[bar("a", vec![2, 0]), bar("b", vec![3, 4])], &["x", "y"], Unit::Count).into_string();
        assert!(svg.starts_with("<svg"), "{svg}");
        assert_eq!(svg.matches("<rect").count(), 4);
        // 7 rounds up to 8 (2 a gridline): the gridlines read 0, 2, 4, 6, 8.
        for label in ["0", "2", "4", "6", "8"] {
            assert!(svg.contains(&format!("text-anchor=\"end\">{label}</text>")), "no y label {label}: {svg}");
        }
        // 7 of 8 of the 166-unit plot: the stack's top is at 10 + 166/8 = 30.75.
        assert!(svg.contains("y=\"30.8\""), "{svg}");
        assert!(svg.contains("<title>b: 3 / 4</title>"), "{svg}");
    }

    #[test]
    fn dollar_axes_are_labelled_in_dollars() {
        let svg = bars("t", &[bar("d1", vec![37_909])], &["x"], Unit::Micros).into_string();
        // $0.037909 rounds up to $0.04, in cent steps.
        assert!(svg.contains(">$0.04</text>") && svg.contains(">$0.01</text>"), "{svg}");
        assert!(svg.contains("<title>d1: $0.037909</title>"), "{svg}");
    }

    #[test]
    fn x_labels_are_thinned_and_always_name_the_newest_bar() {
        let many: Vec<Bar> = (0..60).map(|i| bar(&format!("m{i}"), vec![1])).collect();
        let svg = bars("t", &many, &["x"], Unit::Count).into_string();
        let labels = svg.matches("class=\"x-tick\"").count();
        assert!((2..=X_LABELS).contains(&labels), "{labels} x labels: {svg}");
        assert!(svg.contains(">m59</text>"), "{svg}");
    }

    #[test]
    fn unsampled_bars_are_shaded_not_drawn_as_zero() {
        let unsampled = Bar { sampled: false, ..bar("early", vec![0]) };
        let svg = bars("t", &[unsampled, bar("late", vec![1])], &["x"], Unit::Count).into_string();
        assert!(svg.contains("class=\"unsampled\"") && svg.contains("<title>early: not sampled</title>"), "{svg}");
        assert!(svg.contains("<title>late: 1</title>") && !svg.contains("<title>early: 0</title>"), "{svg}");
    }

    #[test]
    fn an_empty_chart_still_has_an_axis() {
        let svg = bars("t", &[bar("a", vec![0])], &["x"], Unit::Count).into_string();
        assert!(svg.contains(">4</text>") && svg.contains(">0</text>"), "{svg}");
    }

    #[test]
    fn round_tops() {
        assert_eq!(round_up(0, Unit::Count), 4);
        assert_eq!(round_up(9, Unit::Count), 12);
        assert_eq!(round_up(41, Unit::Count), 80);
        assert_eq!(round_up(1_234, Unit::Count), 1_600);
        assert_eq!(round_up(37_909, Unit::Micros), 40_000);
        assert_eq!(round_up(2_500_000, Unit::Micros), 3_200_000);
        assert_eq!(dollar_tick(1_500_000), "$1.50");
        assert_eq!(dollar_tick(1_234_500), "$1.2345");
    }
}
