//! `tune --frontier`: the memory/time frontier, the fastest schedule found for every memory limit.
//!
//! The search: every fixed candidate of [`crate::tune::candidate_expressions`] (gpipe, 1F1B,
//! interleaving, ZB-H1/H2, V-Half, V-Min, DualPipe, ...; each has one peak), and for each
//! memory-driven family, `zero_bubble(INNER, policy=auto, memory=r)` on 1F1B, 2-chunk
//! interleaving and the V layout, at a ladder of limits `r`: every multiple of half a
//! microbatch's activations (`total / 2`) from there up to twice 1F1B's peak (`2P`, where `auto`
//! stops gaining). Every expression is built by [`build_plan`] as `plan` builds it, so each
//! point given back to `plan` with the same options gives the same figures.
//!
//! The frontier: for each limit, the fastest expression whose peak fits; its rows are the limits
//! where that changes (the point's own peak), so it is monotone by construction: a larger limit
//! keeps every schedule a smaller one had. Ties go to the smaller peak, then to the candidate
//! listed first (fixed schedules before the ladder, lower rungs first).

use crate::config::{build_plan, PipelineConfig};
use crate::tune::{candidate_expressions, tune, Candidate};
use serde::Serialize;

/// The inner plans whose `zero_bubble(..., policy=auto, memory=r)` runs on the ladder.
pub const LADDER_FAMILIES: [&str; 3] = [
    "f1b(gpipe)",
    "vpp(f1b(gpipe), chunks=2)",
    "vpp(f1b(gpipe), chunks=2, layout=v)",
];

/// One point of the frontier.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct FrontierPoint {
    /// The smallest limit at which this point is the fastest (its own peak).
    pub memory_limit: f64,
    /// The expression (give it to `plan` with the same options).
    pub expression: String,
    /// Its makespan.
    pub makespan: f64,
    /// Its peak activations (units of a rank's share).
    pub peak_activations: f64,
    /// The family it belongs to: the expression itself for fixed schedules, `auto on INNER`
    /// for the ladder.
    pub family: String,
}

/// What the frontier search found.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Frontier {
    /// The points, by increasing memory and decreasing makespan.
    pub frontier: Vec<FrontierPoint>,
    /// Every schedule evaluated, with its family (for the picture).
    #[serde(skip)]
    pub evaluated: Vec<(String, Candidate)>,
    /// How many expressions were built.
    pub expressions: usize,
}

/// The ladder's limits for `ranks` ranks and one microbatch's activations `total`, up to `cap`.
pub fn ladder(ranks: u32, total: f64, cap: Option<f64>) -> Vec<f64> {
    let step = total / 2.0;
    let top = 2.0 * f64::from(ranks) * total;
    let top = cap.map_or(top, |c| c.min(top));
    (1..)
        .map(|k| f64::from(k) * step)
        .take_while(|r| *r <= top + 1e-9)
        .collect()
}

fn ladder_expression(inner: &str, limit: f64) -> String {
    format!("zero_bubble({inner}, policy=auto, memory={limit})")
}

/// Every expression of the search, with its family, in tie-breaking order; the ladder stops at
/// the config's memory limit.
pub fn frontier_expressions(config: &PipelineConfig) -> Vec<(String, String)> {
    let cap = config.memory_limit();
    let mut out: Vec<(String, String)> = candidate_expressions(config.ranks(), cap)
        .into_iter()
        .map(|e| (e.clone(), e))
        .collect();
    for limit in ladder(config.ranks(), config.memory().total(), cap) {
        for inner in LADDER_FAMILIES {
            out.push((ladder_expression(inner, limit), format!("auto on {inner}")));
        }
    }
    out
}

/// Runs the search (on every core, every expression built under `config`, its memory limit
/// included) and builds the frontier; `progress` as in [`tune`].
pub fn frontier(config: &PipelineConfig, progress: &(dyn Fn(usize) + Sync)) -> Frontier {
    let cap = config.memory_limit();
    let jobs = frontier_expressions(config);
    let expressions: Vec<String> = jobs.iter().map(|(e, _)| e.clone()).collect();
    let report = tune(config, &expressions, progress);
    let family = |e: &str| {
        jobs.iter()
            .find(|(x, _)| x == e)
            .map_or_else(|| e.to_string(), |(_, f)| f.clone())
    };
    let rank = |e: &str| {
        expressions
            .iter()
            .position(|x| x == e)
            .unwrap_or(usize::MAX)
    };
    let mut evaluated: Vec<(String, Candidate)> = report
        .candidates
        .into_iter()
        .map(|c| (family(&c.expression), c))
        .collect();
    // By peak, then makespan, then listing order: a walk keeps each strict improvement.
    evaluated.sort_by(|(_, a), (_, b)| {
        a.peak_activations
            .total_cmp(&b.peak_activations)
            .then(a.makespan.total_cmp(&b.makespan))
            .then(rank(&a.expression).cmp(&rank(&b.expression)))
    });
    let mut points: Vec<FrontierPoint> = Vec::new();
    for (family, c) in &evaluated {
        if cap.is_some_and(|cap| c.peak_activations > cap + 1e-9) {
            continue;
        }
        if points
            .last()
            .is_some_and(|p| c.makespan >= p.makespan - 1e-9)
        {
            continue;
        }
        // A candidate at the same peak as the last point but faster replaces it.
        if points
            .last()
            .is_some_and(|p| (p.peak_activations - c.peak_activations).abs() < 1e-9)
        {
            points.pop();
        }
        points.push(FrontierPoint {
            memory_limit: c.peak_activations,
            expression: c.expression.clone(),
            makespan: c.makespan,
            peak_activations: c.peak_activations,
            family: family.clone(),
        });
    }
    Frontier {
        frontier: points,
        evaluated,
        expressions: expressions.len(),
    }
}

/// The frontier's point for `limit`: the fastest whose peak fits.
pub fn point_within(frontier: &Frontier, limit: f64) -> Option<&FrontierPoint> {
    frontier
        .frontier
        .iter()
        .rev()
        .find(|p| p.peak_activations <= limit + 1e-9)
}

/// The frontier as an SVG picture: makespan against peak memory, one line per ladder family,
/// fixed schedules as dots, the frontier's points ringed and joined as a step line.
pub fn frontier_svg(frontier: &Frontier, title: &str) -> String {
    const W: f64 = 860.0;
    const H: f64 = 460.0;
    const LEFT: f64 = 80.0;
    const RIGHT: f64 = 300.0;
    const TOP: f64 = 40.0;
    const BOTTOM: f64 = 60.0;
    let all = &frontier.evaluated;
    let best = frontier.frontier.last().map_or(1.0, |p| p.makespan);
    // The picture shows what matters: up to 1.25 times the fastest point's peak, and makespans up
    // to three times the fastest (the tightest limits run far slower and would flatten the rest).
    let max_x = frontier
        .frontier
        .last()
        .map_or(1.0, |p| p.peak_activations * 1.25)
        .max(1e-9);
    let max_y = all
        .iter()
        .map(|(_, c)| c.makespan)
        .filter(|m| *m <= best * 3.0)
        .fold(best, f64::max);
    let min_y = best * 0.95;
    let shown = |c: &Candidate| c.makespan <= max_y + 1e-9 && c.peak_activations <= max_x + 1e-9;
    let x = |v: f64| LEFT + (v / max_x) * (W - LEFT - RIGHT);
    let y = |v: f64| TOP + (1.0 - (v - min_y) / (max_y - min_y).max(1e-9)) * (H - TOP - BOTTOM);
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"{W}\" height=\"{H}\" fill=\"white\"/>\n\
         <text x=\"{LEFT}\" y=\"22\" font-size=\"14\">{}</text>\n",
        escape(title)
    );
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
    for (i, family) in LADDER_FAMILIES.iter().enumerate() {
        let name = format!("auto on {family}");
        let mut line: Vec<(f64, f64)> = all
            .iter()
            .filter(|(f, c)| *f == name && shown(c))
            .map(|(_, c)| (c.peak_activations, c.makespan))
            .collect();
        line.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
        line.dedup_by(|a, b| (a.0 - b.0).abs() < 1e-9);
        if line.is_empty() {
            continue;
        }
        let path: Vec<String> = line
            .iter()
            .map(|&(px, py)| format!("{:.1},{:.1}", x(px), y(py)))
            .collect();
        let colour = colours[i % colours.len()];
        svg.push_str(&format!(
            "<polyline points=\"{}\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.5\"/>\n",
            path.join(" ")
        ));
        svg.push_str(&legend_entry(
            W - RIGHT + 16.0,
            TOP + 18.0 * f64::from(legend),
            colour,
            &name,
        ));
        legend += 1;
    }
    for (family, c) in all
        .iter()
        .filter(|(f, c)| !f.starts_with("auto on ") && shown(c))
    {
        svg.push_str(&format!(
            "<g><title>{}: {} at {}</title><circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"#7f7f7f\"/></g>\n",
            escape(family),
            c.makespan,
            c.peak_activations,
            x(c.peak_activations),
            y(c.makespan)
        ));
    }
    svg.push_str(&legend_entry(
        W - RIGHT + 16.0,
        TOP + 18.0 * f64::from(legend),
        "#7f7f7f",
        "fixed schedules",
    ));
    legend += 1;
    let mut steps = Vec::new();
    for (i, p) in frontier.frontier.iter().enumerate() {
        if p.makespan > max_y + 1e-9 {
            continue;
        }
        steps.push(format!("{:.1},{:.1}", x(p.peak_activations), y(p.makespan)));
        let next = frontier
            .frontier
            .get(i + 1)
            .map_or(max_x, |n| n.peak_activations);
        steps.push(format!("{:.1},{:.1}", x(next), y(p.makespan)));
        svg.push_str(&format!(
            "<g><title>{}: {} at {}</title><circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"5\" fill=\"none\" stroke=\"#d62728\" stroke-width=\"2\"/></g>\n",
            escape(&p.expression),
            p.makespan,
            p.peak_activations,
            x(p.peak_activations),
            y(p.makespan)
        ));
    }
    svg.push_str(&format!(
        "<polyline points=\"{}\" fill=\"none\" stroke=\"#d62728\" stroke-dasharray=\"4 3\"/>\n",
        steps.join(" ")
    ));
    svg.push_str(&legend_entry(
        W - RIGHT + 16.0,
        TOP + 18.0 * f64::from(legend),
        "#d62728",
        "frontier",
    ));
    svg.push_str("</svg>\n");
    svg
}

fn legend_entry(x: f64, y: f64, colour: &str, name: &str) -> String {
    format!(
        "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"12\" height=\"4\" fill=\"{colour}\"/>\
         <text x=\"{:.1}\" y=\"{:.1}\">{}</text>\n",
        y - 4.0,
        x + 18.0,
        y + 1.0,
        escape(name)
    )
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Whether `expression` built under `config` gives `point`'s figures.
pub fn reproduces(config: &PipelineConfig, point: &FrontierPoint) -> bool {
    let Ok(plan) = build_plan(&point.expression, config) else {
        return false;
    };
    let Ok(sim) = pipeweave_core::simulate(&plan) else {
        return false;
    };
    let peak = pipeweave_core::max_peak(&plan);
    (sim.makespan() - point.makespan).abs() < 1e-6 && (peak - point.peak_activations).abs() < 1e-6
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_frontier_is_monotone_and_every_point_reproduces() {
        let config = PipelineConfig::new(4, 8).unwrap();
        let found = frontier(&config, &|_| {});
        assert!(found.frontier.len() >= 3, "{:?}", found.frontier);
        for pair in found.frontier.windows(2) {
            assert!(pair[1].peak_activations > pair[0].peak_activations);
            assert!(pair[1].makespan < pair[0].makespan);
        }
        for point in &found.frontier {
            assert!(reproduces(&config, point), "{point:?}");
        }
        let svg = frontier_svg(&found, "frontier");
        assert!(svg.starts_with("<svg") && svg.contains("frontier"));
    }

    #[test]
    fn a_point_within_a_limit_fits_it_and_no_faster_fits() {
        let config = PipelineConfig::new(4, 8).unwrap();
        let found = frontier(&config, &|_| {});
        let point = point_within(&found, 2.0).unwrap();
        assert!(point.peak_activations <= 2.0);
        assert!(found
            .evaluated
            .iter()
            .all(|(_, c)| c.peak_activations > 2.0 + 1e-9 || c.makespan >= point.makespan - 1e-9));
    }

    #[test]
    fn the_ladder_steps_by_half_a_microbatch_up_to_twice_1f1b() {
        assert_eq!(
            ladder(2, 1.0, None),
            [0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0]
        );
        assert_eq!(ladder(2, 1.0, Some(1.2)), [0.5, 1.0]);
    }
}
