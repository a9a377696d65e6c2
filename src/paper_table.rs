//! The Zero Bubble paper's bubble-rate table (../shared/reference/zb_paper_table.json) recomputed
//! with our passes: 1F1B, ZB-H1, ZB-H2 and `auto` at the paper's ZB-1p and ZB-2p memory limits,
//! side by side with the paper's figures.

use crate::compile::build_plan;
use crate::config::PipelineConfig;
use crate::error::Error;
use pipeweave_core::{simulate, StageCostsSpec, StageMemorySpec};
use serde::Deserialize;

/// One row of the paper's table.
#[derive(Clone, Debug, Deserialize)]
pub struct PaperRow {
    /// Pipeline ranks.
    pub p: u32,
    /// Microbatches.
    pub m: u32,
    /// Forward time.
    #[serde(rename = "T_F")]
    pub t_f: f64,
    /// Input-gradient backward time.
    #[serde(rename = "T_B")]
    pub t_b: f64,
    /// Weight-gradient backward time.
    #[serde(rename = "T_W")]
    pub t_w: f64,
    /// Communication latency.
    #[serde(rename = "T_comm")]
    pub t_comm: f64,
    /// Hidden size.
    pub hidden: f64,
    /// Attention heads.
    pub heads: f64,
    /// Sequence length.
    pub seq_len: f64,
    /// The paper's bubble rates by schedule name.
    pub bubble_rate: std::collections::BTreeMap<String, f64>,
}

/// The table file.
#[derive(Clone, Debug, Deserialize)]
pub struct PaperTable {
    /// Its rows.
    pub rows: Vec<PaperRow>,
}

/// Our bubble rates for one row.
#[derive(Clone, Debug, PartialEq)]
pub struct OurRow {
    /// 1F1B.
    pub one_f_one_b: f64,
    /// ZB-H1.
    pub h1: f64,
    /// ZB-H2.
    pub h2: f64,
    /// `auto` at `p` activations.
    pub auto_1p: f64,
    /// `auto` at `2p` activations.
    pub auto_2p: f64,
}

impl PaperRow {
    /// The part of a microbatch's activations held until W in the paper's memory model:
    /// `M_W / M_B = 32h / (34h + 5as)`.
    pub fn weight_grad_fraction(&self) -> f64 {
        32.0 * self.hidden / (34.0 * self.hidden + 5.0 * self.heads * self.seq_len)
    }

    fn config(&self) -> Result<PipelineConfig, Error> {
        let costs = StageCostsSpec::builder()
            .forward(self.t_f)
            .input_grad(self.t_b)
            .weight_grad(self.t_w)
            .build()
            .validate()?;
        let memory = StageMemorySpec::builder()
            .total(1.0)
            .weight_grad(self.weight_grad_fraction())
            .build()
            .validate()?;
        Ok(PipelineConfig::new(self.p, self.m)?
            .with_costs(costs, self.t_comm)?
            .with_memory(memory))
    }

    fn bubble(&self, expression: &str) -> Result<f64, Error> {
        let plan = build_plan(expression, &self.config()?)?;
        Ok(simulate(&plan)?.bubble_rate())
    }

    /// Recomputes the row.
    pub fn ours(&self) -> Result<OurRow, Error> {
        Ok(OurRow {
            one_f_one_b: self.bubble("f1b(gpipe)")?,
            h1: self.bubble("zero_bubble(f1b(gpipe), policy=h1)")?,
            h2: self.bubble("zero_bubble(f1b(gpipe), policy=h2)")?,
            auto_1p: self.bubble(&format!(
                "zero_bubble(f1b(gpipe), policy=auto, memory={})",
                self.p
            ))?,
            auto_2p: self.bubble(&format!(
                "zero_bubble(f1b(gpipe), policy=auto, memory={})",
                2 * self.p
            ))?,
        })
    }
}

/// Reads the table file.
pub fn read_table(path: &str) -> Result<PaperTable, Error> {
    let text = crate::files::read_text(path)?;
    serde_json::from_str(&text).map_err(|e| Error::Json {
        path: path.to_string(),
        message: e.to_string(),
    })
}

/// The side-by-side text table.
pub fn render(table: &PaperTable) -> Result<String, Error> {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:>3} {:>4} | {:>15} | {:>15} | {:>15} | {:>15} | {:>15}",
        "p",
        "m",
        "1F1B ours/paper",
        "ZB-H1 ours/pap.",
        "ZB-H2 ours/pap.",
        "ZB-1p ours/pap.",
        "ZB-2p ours/pap."
    );
    for row in &table.rows {
        let ours = row.ours()?;
        let paper = |k: &str| row.bubble_rate.get(k).copied().unwrap_or(f64::NAN);
        let _ = writeln!(
            out,
            "{:>3} {:>4} | {:>7.4}/{:<7.4} | {:>7.4}/{:<7.4} | {:>7.4}/{:<7.4} | {:>7.4}/{:<7.4} | {:>7.4}/{:<7.4}",
            row.p,
            row.m,
            ours.one_f_one_b,
            paper("1F1B"),
            ours.h1,
            paper("ZB-H1"),
            ours.h2,
            paper("ZB-H2"),
            ours.auto_1p,
            paper("ZB-1p"),
            ours.auto_2p,
            paper("ZB-2p")
        );
    }
    Ok(out)
}
