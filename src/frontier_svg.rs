//! The memory/time frontier as an SVG picture (`tune --frontier --svg FILE`): makespan against
//! peak memory, one line per ladder family, the other schedules as dots coloured by family, the
//! frontier's points ringed and joined as a step line, and the limit under it.

use crate::frontier::Frontier;
use crate::frontier_limit::FrontierLimit;
use crate::search_space::{Family, LADDER_FAMILIES, NAMED_SCHEDULES};
use crate::tune::Candidate;
use pipeweave_core::formats::svg_markup::{
    escape, legend_entry, open_document, polyline, titled_circle,
};
use pipeweave_core::TOLERANCE;

/// The frontier as an SVG picture: makespan against peak memory, one line per ladder family,
/// fixed schedules and the residency stage's plans as dots (recompute and offload coloured),
/// the frontier's points ringed and joined as a step line.
pub fn frontier_svg(frontier: &Frontier, title: &str) -> String {
    const W: f64 = 900.0;
    const H: f64 = 460.0;
    const LEFT: f64 = 80.0;
    const RIGHT: f64 = 340.0;
    const TOP: f64 = 40.0;
    const BOTTOM: f64 = 60.0;
    let all = &frontier.evaluated;
    let best = frontier.frontier.last().map_or(1.0, |p| p.makespan);
    // The picture shows what matters: up to 1.25 times the fastest point's peak, and makespans up
    // to three times the fastest (the tightest limits run far slower and would flatten the rest).
    // Wide enough for 1F1B's peak too, so the named schedules stay in view where the frontier's
    // fastest point needs far less memory.
    let f1b_peak = all
        .iter()
        .find(|(_, c)| c.expression == "f1b(gpipe)")
        .map_or(0.0, |(_, c)| c.peak_activations * 1.1);
    let max_x = frontier
        .frontier
        .last()
        .map_or(1.0, |p| p.peak_activations * 1.25)
        .max(f1b_peak)
        .max(1e-9);
    let max_y = all
        .iter()
        .map(|(_, c)| c.makespan)
        .filter(|m| *m <= best * 3.0)
        .fold(best, f64::max);
    // Low enough for the limit under the frontier where it is within a fifth of the fastest.
    let floor = frontier
        .limit
        .as_ref()
        .map_or(best, |l| l.any)
        .max(best * 0.8);
    let min_y = best.min(floor) * 0.95;
    let shown =
        |c: &Candidate| c.makespan <= max_y + TOLERANCE && c.peak_activations <= max_x + TOLERANCE;
    let x = |v: f64| LEFT + (v / max_x) * (W - LEFT - RIGHT);
    let y = |v: f64| TOP + (1.0 - (v - min_y) / (max_y - min_y).max(1e-9)) * (H - TOP - BOTTOM);
    // The legend's entry `row` (from the top), right of the plot.
    let legend_row = |row: u32, colour: &str, name: &str| {
        legend_entry(W - RIGHT + 16.0, TOP + 18.0 * f64::from(row), colour, name)
    };
    let mut svg = open_document(W, H, "sans-serif", 12.0);
    svg.push_str(&format!(
        "<text x=\"{LEFT}\" y=\"22\" font-size=\"14\">{}</text>\n",
        escape(title)
    ));
    let (x0, y0, x1, y1) = (x(0.0), y(min_y), x(max_x), y(max_y));
    svg.push_str(&format!(
        "<line x1=\"{x0:.1}\" y1=\"{y0:.1}\" x2=\"{x1:.1}\" y2=\"{y0:.1}\" stroke=\"black\"/>\n\
         <line x1=\"{x0:.1}\" y1=\"{y0:.1}\" x2=\"{x0:.1}\" y2=\"{y1:.1}\" stroke=\"black\"/>\n\
         <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">peak activations per rank</text>\n\
         <text x=\"18\" y=\"{:.1}\" transform=\"rotate(-90 18 {:.1})\" text-anchor=\"middle\">makespan</text>\n",
        (x0 + x1) / 2.0,
        H - 18.0,
        (y0 + y1) / 2.0,
        (y0 + y1) / 2.0
    ));
    for k in 0..=4 {
        let v = min_y + (max_y - min_y) * f64::from(k) / 4.0;
        svg.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{v:.1}</text>\n",
            x0 - 6.0,
            y(v) + 4.0
        ));
        let m = max_x * f64::from(k) / 4.0;
        svg.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{m:.1}</text>\n",
            x(m),
            y0 + 16.0
        ));
    }
    let colours = ["#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd"];
    let mut legend = 0;
    for (i, inner) in LADDER_FAMILIES.iter().enumerate() {
        let family = Family::Ladder(inner);
        let name = family.to_string();
        let mut line: Vec<(f64, f64)> = all
            .iter()
            .filter(|(f, c)| *f == family && shown(c))
            .map(|(_, c)| (c.peak_activations, c.makespan))
            .collect();
        line.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
        line.dedup_by(|a, b| (a.0 - b.0).abs() < TOLERANCE);
        if line.is_empty() {
            continue;
        }
        let path: Vec<String> = line
            .iter()
            .map(|&(px, py)| format!("{:.1},{:.1}", x(px), y(py)))
            .collect();
        let colour = colours[i % colours.len()];
        svg.push_str(&polyline(
            &path,
            &format!("stroke=\"{colour}\" stroke-width=\"1.5\""),
        ));
        svg.push_str(&legend_row(legend, colour, &name));
        legend += 1;
    }
    // Fixed schedules grey; recompute and offload in colours of their own.
    let dot = |family: Family| match family {
        Family::Recompute => "#8c564b",
        Family::Offload => "#e377c2",
        Family::ChunkOffload => "#17becf",
        Family::Fixed | Family::Ladder(_) => "#7f7f7f",
    };
    for (family, c) in all
        .iter()
        .filter(|(f, c)| !matches!(f, Family::Ladder(_)) && shown(c))
    {
        svg.push_str(&titled_circle(
            &point_title(&c.expression, c.makespan, c.peak_activations),
            x(c.peak_activations),
            y(c.makespan),
            3.0,
            &format!("fill=\"{}\"", dot(*family)),
        ));
        if let Some((_, name)) = NAMED_SCHEDULES.iter().find(|(e, _)| *e == c.expression) {
            svg.push_str(&format!(
                "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\">{name}</text>\n",
                x(c.peak_activations) + 5.0,
                y(c.makespan) - 5.0
            ));
        }
    }
    for (name, family) in [
        ("fixed schedules", Family::Fixed),
        ("recompute(...)", Family::Recompute),
        ("offload(...)", Family::Offload),
        ("offload(block, chunks=K)", Family::ChunkOffload),
    ] {
        svg.push_str(&legend_row(legend, dot(family), name));
        legend += 1;
    }
    let mut steps = Vec::new();
    for (i, p) in frontier.frontier.iter().enumerate() {
        if p.makespan > max_y + TOLERANCE {
            continue;
        }
        steps.push(format!("{:.1},{:.1}", x(p.peak_activations), y(p.makespan)));
        let next = frontier
            .frontier
            .get(i + 1)
            .map_or(max_x, |n| n.peak_activations);
        steps.push(format!("{:.1},{:.1}", x(next), y(p.makespan)));
        svg.push_str(&titled_circle(
            &point_title(&p.expression, p.makespan, p.peak_activations),
            x(p.peak_activations),
            y(p.makespan),
            5.0,
            "fill=\"none\" stroke=\"#d62728\" stroke-width=\"2\"",
        ));
    }
    svg.push_str(&polyline(
        &steps,
        "stroke=\"#d62728\" stroke-dasharray=\"4 3\"",
    ));
    svg.push_str(&legend_row(legend, "#d62728", "frontier"));
    legend += 1;
    if let Some(limit) = &frontier.limit {
        let (keeping, any) = limit_lines(limit, max_x, min_y, &x, &y);
        svg.push_str(&polyline(
            &keeping,
            "stroke=\"#000000\" stroke-width=\"1.5\"",
        ));
        svg.push_str(&legend_row(
            legend,
            "#000000",
            "the limit (keeping activations)",
        ));
        legend += 1;
        svg.push_str(&polyline(
            &any,
            "stroke=\"#000000\" stroke-dasharray=\"1 3\"",
        ));
        svg.push_str(&legend_row(
            legend,
            "#555555",
            "the limit (recompute, offload)",
        ));
    }
    svg.push_str("</svg>\n");
    svg
}

/// The limit's two lines in picture coordinates: keeping activations as steps (a bound at a
/// limit holds for every peak up to it, so it is drawn from the limit before), and any
/// schedule's as a level line; bounds below the picture sit on its floor.
fn limit_lines(
    limit: &FrontierLimit,
    max_x: f64,
    min_y: f64,
    x: &dyn Fn(f64) -> f64,
    y: &dyn Fn(f64) -> f64,
) -> (Vec<String>, Vec<String>) {
    let mut keeping = Vec::new();
    let shown = limit
        .points
        .iter()
        .filter(|p| p.memory_limit <= max_x + TOLERANCE);
    let mut before = 0.0;
    for p in shown {
        let level = y(p.keeping_activations.max(min_y));
        keeping.push(format!("{:.1},{level:.1}", x(before)));
        keeping.push(format!("{:.1},{level:.1}", x(p.memory_limit)));
        before = p.memory_limit;
    }
    let level = y(limit.any.max(min_y));
    let any = vec![
        format!("{:.1},{level:.1}", x(0.0)),
        format!("{:.1},{level:.1}", x(max_x)),
    ];
    (keeping, any)
}

/// A point's tooltip: its expression, makespan and peak.
fn point_title(expression: &str, makespan: f64, peak: f64) -> String {
    format!("{expression}: {makespan} at {peak}")
}
