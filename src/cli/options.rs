//! Parsing of the options' values: the `key=value,...` options (`--costs`,
//! `--activation-memory`, `--stage-costs`), and the counts and numbers clap reads ([`count`],
//! [`number`]), every number read as expressions read them ([`pipeweave_core::parse_number`]).

use crate::cli::profile_options::read_memory_limit;
use crate::error::Error;
use crate::memory_limit::MemoryLimit;
use pipeweave_core::ir::cost::MAX_DURATION;
use pipeweave_core::{
    checked_size, parse_number, parse_whole, show_number, StageCosts, StageCostsSpec, StageMemory,
    StageMemorySpec,
};

/// The costs `plan` and `tune` assume without `--costs`.
pub const DEFAULT_COSTS: &str = "F=1,I=1,W=1,comm=0";
/// The activation memory they assume without `--activation-memory`.
pub const DEFAULT_ACTIVATION_MEMORY: &str = "total=1";

/// A clap value parser for a count `what` (`ranks`, ...) of option `option`, in `1..=max`: a
/// whole number as expressions write it, negative ones included (so that `-p -4` is refused by
/// its range, as Python's `ranks=-4` is, not by clap's syntax).
pub fn count(
    option: &'static str,
    what: &'static str,
    max: u64,
) -> impl Fn(&str) -> Result<u32, Error> + Clone + Send + Sync + 'static {
    move |text: &str| {
        let value = parse_whole(text).map_err(|e| Error::Option {
            option,
            message: e.describe(text),
        })?;
        Ok(checked_size(what, value, max)?)
    }
}

/// A clap value parser for a number of option `option` (`1e3` as `1000`; `inf` and `nan` are
/// not numbers).
pub fn number(option: &'static str) -> impl Fn(&str) -> Result<f64, Error> + Clone + Send + Sync {
    move |text: &str| {
        parse_number(text).map_err(|e| Error::Option {
            option,
            message: e.describe(text),
        })
    }
}

fn pairs(option: &'static str, text: &str, keys: &[&str]) -> Result<Vec<(String, f64)>, Error> {
    let mut out: Vec<(String, f64)> = Vec::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (key, value) = item.split_once('=').ok_or_else(|| Error::Option {
            option,
            message: format!("`{item}` is not key=value"),
        })?;
        let key = key.trim();
        if !keys.contains(&key) {
            return Err(Error::Option {
                option,
                message: format!("unknown key `{key}`; expected one of {}", keys.join(", ")),
            });
        }
        if out.iter().any(|(k, _)| k == key) {
            return Err(Error::Option {
                option,
                message: format!("`{key}` is given twice"),
            });
        }
        let value = parse_number(value).map_err(|e| Error::Option {
            option,
            message: format!("{} (key `{key}`)", e.describe(value.trim())),
        })?;
        out.push((key.to_string(), value));
    }
    Ok(out)
}

fn get(pairs: &[(String, f64)], key: &str) -> Option<f64> {
    pairs.iter().find(|(k, _)| k == key).map(|(_, v)| *v)
}

/// The keys of one share's costs (`--costs` adds `comm`, `--stage-costs` takes these).
const COST_KEYS: [&str; 9] = ["F", "I", "W", "B", "FB", "R", "offload", "a2a", "experts"];

/// Parses `F=1,I=1,W=1,B=2,FB=3,R=1,offload=1,a2a=0,experts=0.5,comm=0` (every key optional;
/// defaults F=I=W=1, B=I+W, FB=F+B, R=F, offload=F, no all-to-all, half of each compute in the
/// experts, comm=0).
pub fn parse_costs(text: &str) -> Result<(StageCosts, f64), Error> {
    let mut keys = COST_KEYS.to_vec();
    keys.push("comm");
    let p = pairs("--costs", text, &keys)?;
    let costs = stage_costs(&p)?;
    let comm = get(&p, "comm").unwrap_or(0.0);
    if !(0.0..=MAX_DURATION).contains(&comm) {
        return Err(Error::Option {
            option: "--costs",
            message: format!(
                "comm = {} must be a latency between 0 and {}",
                show_number(comm),
                show_number(MAX_DURATION)
            ),
        });
    }
    Ok((costs, comm))
}

fn stage_costs(p: &[(String, f64)]) -> Result<StageCosts, Error> {
    let spec = StageCostsSpec::builder()
        .forward(get(p, "F").unwrap_or(1.0))
        .input_grad(get(p, "I").unwrap_or(1.0))
        .weight_grad(get(p, "W").unwrap_or(1.0))
        .full_backward_opt(get(p, "B"))
        .overlapped_opt(get(p, "FB"))
        .recompute_opt(get(p, "R"))
        .offload_opt(get(p, "offload"))
        .a2a(get(p, "a2a").unwrap_or(0.0))
        .expert_share(get(p, "experts").unwrap_or(0.5))
        .build();
    Ok(spec.validate()?)
}

/// Parses `total=1,weight_grad=0.43,checkpoint=0.05,experts=0.2` (every key optional; `experts`,
/// the part a mixture's experts keep until their W, default none).
pub fn parse_activation_memory(text: &str) -> Result<StageMemory, Error> {
    let p = pairs(
        "--activation-memory",
        text,
        &["total", "weight_grad", "checkpoint", "experts"],
    )?;
    let spec = StageMemorySpec::builder()
        .total(get(&p, "total").unwrap_or(1.0))
        .weight_grad_opt(get(&p, "weight_grad"))
        .checkpoint(get(&p, "checkpoint").unwrap_or(0.0))
        .experts(get(&p, "experts").unwrap_or(0.0))
        .build();
    Ok(spec.validate()?)
}

/// Parses `--activation-memory` and `--memory-limit` (the options `plan` and `tune` share).
pub fn parse_memory_options(
    activation_memory: &str,
    memory_limit: Option<&str>,
) -> Result<(StageMemory, Option<MemoryLimit>), Error> {
    Ok((
        parse_activation_memory(activation_memory)?,
        memory_limit.map(read_memory_limit).transpose()?,
    ))
}

/// Reads `--stage-costs FILE.json`: a JSON list with one object per rank's share, keys as in
/// `--costs` (`F`, `I`, `W`, optional `B`, `FB`).
pub fn read_stage_costs(path: &str) -> Result<Vec<StageCosts>, Error> {
    let text = crate::files::read_text(path)?;
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| Error::Json {
        path: path.to_string(),
        message: e.to_string(),
    })?;
    let items = value.as_array().ok_or_else(|| Error::Json {
        path: path.to_string(),
        message: "expected a list with one cost object per rank".to_string(),
    })?;
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let object = item.as_object().ok_or_else(|| Error::Json {
                path: path.to_string(),
                message: format!("entry {i} is not an object"),
            })?;
            let mut p = Vec::new();
            for (key, value) in object {
                if !COST_KEYS.contains(&key.as_str()) {
                    return Err(Error::Json {
                        path: path.to_string(),
                        message: format!(
                            "entry {i}: unknown key `{key}`; expected {}",
                            COST_KEYS.join(", ")
                        ),
                    });
                }
                let v = value.as_f64().ok_or_else(|| Error::Json {
                    path: path.to_string(),
                    message: format!("entry {i}: `{key}` is not a number"),
                })?;
                p.push((key.clone(), v));
            }
            stage_costs(&p)
        })
        .collect()
}

/// How the ranks reach host memory (`plan`, `run`, `tune`).
#[derive(Clone, Debug, clap::Args)]
pub struct LinkArgs {
    /// Consecutive ranks that share one host link for offload transfers (2: neighbours; 4: four
    /// GPUs behind one PCIe switch); while their transfers overlap each moves at the link's
    /// speed over their number. Default: a link per rank.
    #[arg(long, value_name = "K", default_value_t = 1)]
    pub ranks_per_link: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn costs_parse_with_defaults() {
        let (c, comm) = parse_costs("F=1,I=0.5,W=0.25,comm=0.1").unwrap();
        assert_eq!(
            (c.forward(), c.full_backward(), c.overlapped(), comm),
            (1.0, 0.75, 1.75, 0.1)
        );
        let (c, _) = parse_costs("FB=3").unwrap();
        assert_eq!(c.overlapped(), 3.0);
    }

    #[test]
    fn bad_costs_name_the_key() {
        for (text, why) in [
            ("F=1,X=2", "unknown key `X`"),
            ("F", "is not key=value"),
            ("F=abc", "`abc` is not a number"),
            ("F=-1", "F = -1 must be a duration between 0 and 1e100"),
            ("F=1,F=2", "given twice"),
            ("comm=-1", "comm = -1"),
        ] {
            let err = parse_costs(text).unwrap_err().to_string();
            assert!(err.contains(why), "{text}: {err}");
        }
        let err = parse_activation_memory("total=1,weight_grad=2")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("weight_grad = 2 must lie between 0 and total = 1"),
            "{err}"
        );
    }
}
