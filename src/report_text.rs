//! The text form of a plan's report ([`PlanReport::to_text`]): the header, the grid, the
//! per-rank table and the totals, as `pipeweave plan` prints them.

use crate::report::{BoundBasis, PlanReport};
use crate::text_table::{Align, TextTable};
use pipeweave_core::{render_grid, Plan, Simulation};
use std::fmt::Write;

impl PlanReport {
    /// The per-rank figures as a table (busy, idle, peak; recomputes and transfers where the
    /// plan has them).
    fn rank_table(&self) -> String {
        let mut columns = vec![
            ("rank", Align::Right, 4),
            ("busy", Align::Right, 9),
            ("idle", Align::Right, 9),
            ("peak activations", Align::Right, 17),
        ];
        let experts = self.experts_peak_per_rank.as_ref();
        if experts.is_some() {
            columns.push(("of it experts", Align::Right, 14));
        }
        let recomputes = self.recomputes_per_rank.as_ref();
        let transfers = match (
            &self.offloads_per_rank,
            &self.host_peak_per_rank,
            &self.link_busy_per_rank,
        ) {
            (Some(o), Some(h), Some(l)) => Some((o, h, l)),
            _ => None,
        };
        if recomputes.is_some() {
            columns.push(("recomputes", Align::Right, 11));
        }
        if transfers.is_some() {
            columns.extend([
                ("offloads", Align::Right, 9),
                ("host peak", Align::Right, 10),
                ("link busy", Align::Right, 10),
            ]);
        }
        let mut table = TextTable::new(&columns);
        for r in 0..self.ranks as usize {
            let mut cells = vec![
                r.to_string(),
                format!("{:.3}", self.busy_per_rank[r]),
                format!("{:.3}", self.idle_per_rank[r]),
                format!("{:.3}", self.peak_activations_per_rank[r]),
            ];
            if let Some(experts) = experts {
                cells.push(format!("{:.3}", experts[r]));
            }
            if let Some(recomputes) = recomputes {
                cells.push(recomputes[r].to_string());
            }
            if let Some((offloads, host, link)) = transfers {
                cells.extend([
                    offloads[r].to_string(),
                    format!("{:.3}", host[r]),
                    format!("{:.3}", link[r]),
                ]);
            }
            table.row(cells);
        }
        table.render()
    }

    /// The text form: header, grid, per-rank figures, totals.
    pub fn to_text(&self, plan: &Plan, simulation: &Simulation) -> String {
        let mut out = String::new();
        let microbatches = plan.problem().describe_microbatches();
        let _ = writeln!(
            out,
            "{}  ({} ranks, {} stages, {microbatches}; passes: {})",
            self.expression,
            self.ranks,
            self.stages,
            if self.passes.is_empty() {
                "none".to_string()
            } else {
                self.passes.join(" -> ")
            }
        );
        out.push('\n');
        out.push_str(&render_grid(plan, simulation));
        out.push('\n');
        out.push_str(&self.rank_table());
        out.push('\n');
        if let Some(costs) = &self.costs {
            let _ = writeln!(out, "costs        {costs}");
        }
        let _ = writeln!(out, "makespan     {:.3}", self.makespan);
        let _ = writeln!(out, "bubble rate  {:.4}", self.bubble_rate);
        let _ = writeln!(
            out,
            "lower bound  {:.3} (no schedule of this problem{} is faster; this one is {})",
            self.lower_bound,
            match (self.lower_bound_basis, self.memory_limit) {
                (BoundBasis::Relaxed, _) | (_, None) => String::new(),
                (_, Some(limit)) => {
                    format!(" that keeps its activations within {limit}")
                }
            },
            if self.optimality_gap.abs() < 5e-5 {
                "at it: optimal".to_string()
            } else {
                format!("{:.2}% above it", 100.0 * self.optimality_gap)
            }
        );
        if let Some(limit) = self.memory_limit {
            let _ = writeln!(out, "memory limit {limit}");
        }
        if let (Some(hidden), Some(exposed), Some(share), Some(paired)) = (
            self.a2a_hidden,
            self.a2a_exposed,
            self.a2a_hidden_fraction,
            self.a2a_paired_fraction,
        ) {
            let sequential = self
                .a2a_sequential_makespan
                .filter(|_| paired > 0.0)
                .map_or(String::new(), |m| {
                    format!("; pairs run one half after the other: makespan {m:.3}")
                });
            let _ = writeln!(
                out,
                "all-to-all   {hidden:.3} hidden ({:.1}%), {exposed:.3} exposed; {:.1}% of forwards \
                 and backwards in F&B pairs{sequential}",
                100.0 * share,
                100.0 * paired
            );
        }
        if let Some(per_link) = self.ranks_per_link {
            let busy = self
                .shared_link_busy
                .as_ref()
                .map_or(String::new(), |busy| {
                    let shown: Vec<String> = busy.iter().map(|b| format!("{b:.3}")).collect();
                    format!("; busy {}", shown.join(" "))
                });
            let _ = writeln!(out, "host links   {per_link} ranks per link{busy}");
        }
        if let (Some(layers), Some(bytes)) =
            (&self.layers_per_stage, &self.peak_activation_bytes_per_rank)
        {
            let shown: Vec<String> = layers.iter().map(usize::to_string).collect();
            let mib: Vec<String> = bytes
                .iter()
                .map(|b| format!("{:.1}", b / (1024.0 * 1024.0)))
                .collect();
            let _ = writeln!(
                out,
                "profile      layers per stage {}; peak activations per rank {} MiB",
                shown.join(","),
                mib.join(", ")
            );
        }
        let _ = writeln!(
            out,
            "verified     ok (placement, completeness, dependencies, acyclic{})",
            if self.memory_limit.is_some() {
                ", memory bound"
            } else {
                ""
            }
        );
        if !self.communication_checked.is_empty() {
            let _ = writeln!(
                out,
                "programs     ok ({} messages in {} groups; sends match receives; completes under {} semantics)",
                self.messages,
                self.communication_groups,
                self.communication_checked.join(" and ")
            );
            let _ = writeln!(
                out,
                "recv buffers {} (most received tensors waiting per rank)",
                self.receive_buffers_per_rank
                    .iter()
                    .map(|b| b.to_string())
                    .collect::<Vec<_>>()
                    .join(" ")
            );
            let _ = writeln!(
                out,
                "parameters   {}",
                if self.parameter_actions.is_empty() {
                    "no UNSHARD/RESHARD or REDUCE_GRAD (PyTorch would neither scale nor reduce the gradients)".to_string()
                } else {
                    format!("{} in order", self.parameter_actions.join(" and "))
                }
            );
        }
        out
    }
}
