//! [`LossCurve`]: a loss-curve plot as a standalone SVG string — the training loss per step as
//! a line, the evaluation loss at its steps as a line with dots, axes with ticks and a legend.
//! Non-finite losses are left out.

use pipeweave_core::formats::svg_markup::{escape, open_document};
use std::fmt::Write;

/// Plot size and margins, in SVG user units.
const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 420.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 24.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;
const TRAIN_COLOUR: &str = "#1f77b4";
const EVAL_COLOUR: &str = "#d62728";

/// The losses of a run, by optimizer step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LossCurve {
    /// The plot's title.
    pub title: String,
    /// `(step, training loss)`.
    pub train: Vec<(u64, f64)>,
    /// `(step, evaluation loss)`.
    pub eval: Vec<(u64, f64)>,
}

/// A value range of an axis and its ticks.
#[derive(Debug, Clone)]
struct Axis {
    lo: f64,
    hi: f64,
    ticks: Vec<f64>,
    decimals: usize,
}

impl Axis {
    /// An axis over `values` (at least `[0, 1]` wide if they are all equal or none), with
    /// "nice" ticks (1, 2 or 5 times a power of ten), at least `min_step` apart.
    fn over(values: impl Iterator<Item = f64>, pad: f64, min_step: f64) -> Axis {
        let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
        let (lo, hi) = match lo.is_finite() && hi.is_finite() {
            true if hi > lo => (lo - pad * (hi - lo), hi + pad * (hi - lo)),
            true => (lo - 0.5, hi + 0.5),
            false => (0.0, 1.0),
        };
        let step = nice_step((hi - lo) / 6.0).max(min_step);
        let first = (lo / step).ceil() as i64;
        let last = (hi / step).floor() as i64;
        let ticks = (first..=last).map(|k| k as f64 * step).collect();
        let decimals = (-step.log10().floor()).max(0.0) as usize;
        Axis {
            lo,
            hi,
            ticks,
            decimals,
        }
    }

    /// Where `value` falls on a span from `start` to `end` (pixels).
    fn map(&self, value: f64, start: f64, end: f64) -> f64 {
        start + (value - self.lo) / (self.hi - self.lo) * (end - start)
    }
}

/// The smallest of 1, 2, 5 times a power of ten that is at least `raw`.
fn nice_step(raw: f64) -> f64 {
    if !(raw.is_finite() && raw > 0.0) {
        return 1.0;
    }
    let power = 10f64.powf(raw.log10().floor());
    let scaled = raw / power;
    let nice = [1.0, 2.0, 5.0, 10.0].into_iter().find(|&n| scaled <= n);
    nice.unwrap_or(10.0) * power
}

impl LossCurve {
    /// A curve titled `title` of these losses.
    pub fn new(title: impl Into<String>, train: Vec<(u64, f64)>, eval: Vec<(u64, f64)>) -> Self {
        LossCurve {
            title: title.into(),
            train,
            eval,
        }
    }

    /// The plot as a standalone SVG document.
    pub fn to_svg(&self) -> String {
        let finite = |points: &[(u64, f64)]| -> Vec<(f64, f64)> {
            let kept = points.iter().filter(|(_, loss)| loss.is_finite());
            kept.map(|&(step, loss)| (step as f64, loss)).collect()
        };
        let (train, eval) = (finite(&self.train), finite(&self.eval));
        let all = || train.iter().chain(&eval);
        let x = Axis::over(all().map(|p| p.0), 0.0, 1.0);
        let y = Axis::over(all().map(|p| p.1), 0.05, 0.0);
        let mut svg = open_document(WIDTH, HEIGHT, "sans-serif", 12.0);
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="24" text-anchor="middle" font-size="15">{}</text>"#,
            WIDTH / 2.0,
            escape(&self.title)
        );
        axes(&mut svg, &x, &y);
        series(&mut svg, "train", TRAIN_COLOUR, &train, &x, &y, false);
        series(&mut svg, "eval", EVAL_COLOUR, &eval, &x, &y, true);
        legend(&mut svg);
        svg.push_str("</svg>\n");
        svg
    }
}

/// The plot area's corners: `(left, right, top, bottom)` in pixels.
fn area() -> (f64, f64, f64, f64) {
    (LEFT, WIDTH - RIGHT, TOP, HEIGHT - BOTTOM)
}

/// Both axes with their ticks, tick labels, grid lines and titles.
fn axes(svg: &mut String, x: &Axis, y: &Axis) {
    let (l, r, t, b) = area();
    svg.push_str("<g class=\"axes\" stroke=\"black\" fill=\"none\">\n");
    let _ = writeln!(svg, r#"<line x1="{l}" y1="{b}" x2="{r}" y2="{b}"/>"#);
    let _ = writeln!(svg, r#"<line x1="{l}" y1="{t}" x2="{l}" y2="{b}"/>"#);
    svg.push_str("</g>\n<g class=\"ticks\">\n");
    for &tick in &x.ticks {
        let px = x.map(tick, l, r);
        let _ = writeln!(
            svg,
            r##"<line x1="{px:.1}" y1="{b}" x2="{px:.1}" y2="{}" stroke="black"/>"##,
            b + 5.0
        );
        let _ = writeln!(
            svg,
            r#"<text x="{px:.1}" y="{}" text-anchor="middle">{:.*}</text>"#,
            b + 18.0,
            x.decimals,
            tick
        );
    }
    for &tick in &y.ticks {
        let py = y.map(tick, b, t);
        let _ = writeln!(
            svg,
            r##"<line x1="{l}" y1="{py:.1}" x2="{r}" y2="{py:.1}" stroke="#e0e0e0"/>"##
        );
        let _ = writeln!(
            svg,
            r#"<line x1="{}" y1="{py:.1}" x2="{l}" y2="{py:.1}" stroke="black"/>"#,
            l - 5.0
        );
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{:.1}" text-anchor="end">{:.*}</text>"#,
            l - 8.0,
            py + 4.0,
            y.decimals,
            tick
        );
    }
    svg.push_str("</g>\n");
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" text-anchor="middle">step</text>"#,
        (l + r) / 2.0,
        HEIGHT - 12.0
    );
    let (lx, ly) = (18.0, (t + b) / 2.0);
    let rotate = format!("rotate(-90 {lx} {ly})");
    let _ = writeln!(
        svg,
        r#"<text x="{lx}" y="{ly}" text-anchor="middle" transform="{rotate}">loss</text>"#
    );
}

/// One series as a polyline (and dots if `dots`), in a group of class `class`.
fn series(
    svg: &mut String,
    class: &str,
    colour: &str,
    points: &[(f64, f64)],
    x: &Axis,
    y: &Axis,
    dots: bool,
) {
    let (l, r, t, b) = area();
    let pixels: Vec<(f64, f64)> = points
        .iter()
        .map(|&(s, v)| (x.map(s, l, r), y.map(v, b, t)))
        .collect();
    let _ = writeln!(svg, r#"<g class="{class}" stroke="{colour}" fill="none">"#);
    let coordinates: Vec<String> = pixels
        .iter()
        .map(|(px, py)| format!("{px:.1},{py:.1}"))
        .collect();
    let _ = writeln!(
        svg,
        r#"<polyline stroke-width="1.5" points="{}"/>"#,
        coordinates.join(" ")
    );
    if dots {
        for (px, py) in &pixels {
            let _ = writeln!(
                svg,
                r#"<circle cx="{px:.1}" cy="{py:.1}" r="3" fill="{colour}"/>"#
            );
        }
    }
    svg.push_str("</g>\n");
}

/// The legend in the top-right corner of the plot area.
fn legend(svg: &mut String) {
    let (x, y) = (WIDTH - RIGHT - 150.0, TOP + 10.0);
    svg.push_str("<g class=\"legend\">\n");
    let _ = writeln!(
        svg,
        r##"<rect x="{x}" y="{y}" width="140" height="46" fill="white" stroke="#999"/>"##
    );
    for (row, (label, colour)) in [("train loss", TRAIN_COLOUR), ("eval loss", EVAL_COLOUR)]
        .iter()
        .enumerate()
    {
        let ly = y + 16.0 + 18.0 * row as f64;
        let _ = writeln!(
            svg,
            r#"<line x1="{}" y1="{ly}" x2="{}" y2="{ly}" stroke="{colour}" stroke-width="2"/>"#,
            x + 10.0,
            x + 34.0
        );
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}">{label}</text>"#,
            x + 42.0,
            ly + 4.0
        );
    }
    svg.push_str("</g>\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Checks that every tag is closed in order; returns the names of the elements opened.
    fn balanced(svg: &str) -> Vec<String> {
        let (mut stack, mut seen) = (Vec::<String>::new(), Vec::new());
        let mut rest = svg;
        while let Some(open) = rest.find('<') {
            let close = rest[open..].find('>').expect("unterminated tag") + open;
            let tag = &rest[open + 1..close];
            assert!(!tag.contains('<'), "nested '<' in {tag}");
            if let Some(name) = tag.strip_prefix('/') {
                assert_eq!(stack.pop().as_deref(), Some(name), "closing {name}");
            } else {
                let name = tag
                    .split_whitespace()
                    .next()
                    .unwrap()
                    .trim_end_matches('/')
                    .to_string();
                seen.push(name.clone());
                if !tag.ends_with('/') {
                    stack.push(name);
                }
            }
            rest = &rest[close + 1..];
        }
        assert!(stack.is_empty(), "unclosed {stack:?}");
        seen
    }

    #[test]
    fn the_svg_is_well_formed_with_both_series() {
        let train: Vec<(u64, f64)> = (1..=50).map(|s| (s, 5.5 / (s as f64).sqrt())).collect();
        let eval = vec![(10, 2.0), (20, 1.6), (50, f64::NAN), (40, 1.3)];
        let svg = LossCurve::new("GPT <bytes> & \"quotes\"", train, eval).to_svg();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        let elements = balanced(&svg);
        assert_eq!(elements.iter().filter(|e| *e == "polyline").count(), 2);
        assert_eq!(
            elements.iter().filter(|e| *e == "circle").count(),
            3,
            "NaN left out"
        );
        assert!(svg.contains(r#"class="train""#) && svg.contains(r#"class="eval""#));
        assert!(svg.contains("train loss") && svg.contains("eval loss"));
        assert!(svg.contains("GPT &lt;bytes&gt; &amp; &quot;quotes&quot;"));
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
    }

    #[test]
    fn ticks_are_nice_and_cover_the_data() {
        let axis = Axis::over([0.93, 5.61].into_iter(), 0.0, 0.0);
        assert_eq!(axis.ticks, vec![1.0, 2.0, 3.0, 4.0, 5.0]);
        assert_eq!(axis.decimals, 0);
        let steps = Axis::over([1.0, 3.0].into_iter(), 0.0, 1.0);
        assert!(steps.ticks.iter().all(|t| t.fract() == 0.0));
        assert_eq!(nice_step(0.013), 0.02);
        assert_eq!(nice_step(70.0), 100.0);
    }

    #[test]
    fn empty_and_single_point_curves_still_draw() {
        for curve in [
            LossCurve::default(),
            LossCurve::new("one", vec![(1, 3.0)], vec![]),
        ] {
            let svg = curve.to_svg();
            balanced(&svg);
            assert!(!svg.contains("NaN") && !svg.contains("inf"));
        }
    }
}
