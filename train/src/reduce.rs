//! The ordered gradient reduction between processes: every position's weight gradients summed
//! over the microbatches of all its holders (data-parallel replicas, DualPipe's mirrored stages),
//! in a fixed order, without a collective call, so that it can start while the pipeline still runs.
//!
//! **The order.** The global batch's microbatches `0 .. D M` are visited in order; each is owned by
//! the process that computes its gradients at the position. With `deterministic`, a *unit* is a
//! maximal run of consecutive microbatches of one owner, and the sum is the left fold
//! `((g₀ + g₁) + g₂) + …` in microbatch order — exactly what the in-process fold of
//! [`crate::gradients::LocalGradients`] computes, so one process per rank gives the bits of one
//! thread per rank. Without it, each owner first sums its own gradients as they arrive and the
//! units are the owners, in the order of their first microbatch.
//!
//! **The exchange.** A running sum travels from the owner of one unit to the owner of the next
//! (tag `2 k` for position `k`); the owner of the last unit sends the total to every other
//! holder (tag `2 k + 1`). Every owner adds its units as soon as its gradients and the running sum
//! are there, so the reduction overlaps the rest of the pipeline; [`Reduction::pump`] never
//! blocks, and the caller pumps until [`Reduction::done`] at the end of the program. Nothing
//! waits in a cycle: a unit waits only for the units before it.
//!
//! Messages go through a [`Courier`] (an MPI mailbox, or an in-memory one in tests); payloads
//! are the tensors' elements, little-endian, in parameter order ([`encode`], [`decode`]).

use crate::cut::ModelCut;
use candle_core::{DType, Tensor};
use pipeweave_core::{MicrobatchId, Problem};
use std::collections::BTreeMap;

/// Where a process's reduction messages go.
pub trait Courier {
    /// Sends `bytes` to process `to` with `tag` (without blocking).
    fn post(&mut self, to: usize, tag: u16, bytes: Vec<u8>) -> Result<(), String>;
    /// The next message from `from` with `tag`, if it has arrived (without blocking).
    fn try_receive(&mut self, from: usize, tag: u16) -> Result<Option<Vec<u8>>, String>;
}

/// For every position, which process computes the gradients of each global microbatch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GradientOwners {
    /// Per position, the owner of each global microbatch (`None`: it has no work there).
    owners: Vec<Vec<Option<usize>>>,
}

impl GradientOwners {
    /// The owners when `replicas` copies of `problem`'s pipeline run side by side, replica `d`
    /// being processes `d P .. (d + 1) P` and running global microbatches `d M .. (d + 1) M`.
    pub fn new(problem: &Problem, cut: &ModelCut, replicas: u32) -> GradientOwners {
        let (p, m) = (problem.ranks() as usize, problem.microbatches());
        let mut owners = vec![vec![None; replicas as usize * m as usize]; cut.positions()];
        for d in 0..replicas as usize {
            for local in 0..m {
                let Some(route) = problem.route_of(MicrobatchId::new(local)) else {
                    continue;
                };
                for &stage in route.stages() {
                    let (Some(position), Some(rank)) =
                        (cut.position(stage), problem.rank_of(stage))
                    else {
                        continue;
                    };
                    if let Some(slot) = owners
                        .get_mut(position)
                        .and_then(|o| o.get_mut(d * m as usize + local as usize))
                    {
                        *slot = Some(d * p + rank.index());
                    }
                }
            }
        }
        GradientOwners { owners }
    }

    /// Number of positions.
    pub fn positions(&self) -> usize {
        self.owners.len()
    }

    /// The processes that hold `position`, in ascending order.
    pub fn holders(&self, position: usize) -> Vec<usize> {
        let mut holders: Vec<usize> = self
            .owners
            .get(position)
            .map(|o| o.iter().flatten().copied().collect())
            .unwrap_or_default();
        holders.sort_unstable();
        holders.dedup();
        holders
    }

    /// The units of `position` in summation order (see the module doc).
    fn units(&self, position: usize, deterministic: bool) -> Vec<Unit> {
        let owned = self
            .owners
            .get(position)
            .into_iter()
            .flatten()
            .enumerate()
            .filter_map(|(g, o)| o.map(|o| (g as u32, o)));
        let mut units: Vec<Unit> = Vec::new();
        for (microbatch, owner) in owned {
            let existing = if deterministic {
                units.last_mut().filter(|u| u.owner == owner)
            } else {
                units.iter_mut().find(|u| u.owner == owner)
            };
            match existing {
                Some(unit) => unit.microbatches.push(microbatch),
                None => units.push(Unit {
                    owner,
                    microbatches: vec![microbatch],
                }),
            }
        }
        units
    }
}

/// Consecutive terms of a position's sum, added by one process.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Unit {
    owner: usize,
    microbatches: Vec<u32>,
}

/// One position's reduction on this process.
#[derive(Debug)]
struct PositionReduction {
    position: usize,
    units: Vec<Unit>,
    holders: Vec<usize>,
    /// Gradients received from the stage, by global microbatch (deterministic).
    grads: BTreeMap<u32, Vec<Tensor>>,
    /// This process's own sum in arrival order (not deterministic).
    own_sum: Option<Vec<Tensor>>,
    own_added: usize,
    /// The first gradients this process took: the layout a received sum takes.
    template: Option<Vec<Tensor>>,
    /// The next unit this process has to add or wait past.
    cursor: usize,
    /// The running sum after unit `cursor - 1`, when this process holds it.
    running: Option<Vec<Tensor>>,
    total: Option<Vec<Tensor>>,
}

/// Every position's reduction on one process for one step (see the module doc).
#[derive(Debug)]
pub struct Reduction {
    me: usize,
    deterministic: bool,
    positions: BTreeMap<usize, PositionReduction>,
}

/// What a process is waiting for, for a report of who waits on whom.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Awaited {
    /// The position.
    pub position: usize,
    /// The process that must send it.
    pub from: usize,
    /// Whether it is the total (else a running sum).
    pub total: bool,
}

impl Reduction {
    /// The reduction of the positions process `me` holds.
    pub fn new(owners: &GradientOwners, me: usize, deterministic: bool) -> Reduction {
        let positions = (0..owners.positions())
            .filter(|&k| owners.holders(k).contains(&me))
            .map(|k| {
                let reduction = PositionReduction {
                    position: k,
                    units: owners.units(k, deterministic),
                    holders: owners.holders(k),
                    grads: BTreeMap::new(),
                    own_sum: None,
                    own_added: 0,
                    template: None,
                    cursor: 0,
                    running: None,
                    total: None,
                };
                (k, reduction)
            })
            .collect();
        Reduction {
            me,
            deterministic,
            positions,
        }
    }

    /// The positions this process holds.
    pub fn held(&self) -> impl Iterator<Item = usize> + '_ {
        self.positions.keys().copied()
    }

    /// Takes the gradients of global microbatch `microbatch` at `position`.
    pub fn add(
        &mut self,
        position: usize,
        microbatch: u32,
        grads: Vec<Tensor>,
    ) -> Result<(), String> {
        let me = self.me;
        let deterministic = self.deterministic;
        let reduction = self
            .positions
            .get_mut(&position)
            .ok_or_else(|| format!("process {me} does not hold position {position}"))?;
        let owned = reduction
            .units
            .iter()
            .any(|u| u.owner == me && u.microbatches.contains(&microbatch));
        if !owned {
            return Err(format!(
                "position {position}: microbatch {microbatch} is not process {me}'s"
            ));
        }
        if reduction.template.is_none() {
            reduction.template = Some(grads.clone());
        }
        if deterministic {
            if reduction.grads.insert(microbatch, grads).is_some() {
                return Err(format!(
                    "position {position}: the gradient of microbatch {microbatch} arrived twice"
                ));
            }
        } else {
            reduction.own_sum = Some(add_into(reduction.own_sum.take(), grads)?);
            reduction.own_added += 1;
        }
        Ok(())
    }

    /// Advances every position as far as it can without waiting.
    pub fn pump(&mut self, courier: &mut dyn Courier) -> Result<(), String> {
        let me = self.me;
        let deterministic = self.deterministic;
        for reduction in self.positions.values_mut() {
            reduction.advance(me, deterministic, courier)?;
        }
        Ok(())
    }

    /// Whether every held position has its total.
    pub fn done(&self) -> bool {
        self.positions.values().all(|r| r.total.is_some())
    }

    /// The first message this process still waits for, if any.
    pub fn awaited(&self) -> Option<Awaited> {
        self.positions
            .values()
            .find(|r| r.total.is_none())
            .and_then(|r| r.awaited(self.me))
    }

    /// Every held position's total (call after [`Reduction::done`]).
    pub fn into_totals(self) -> Result<BTreeMap<usize, Vec<Tensor>>, String> {
        self.positions
            .into_iter()
            .map(|(k, r)| {
                r.total
                    .map(|t| (k, t))
                    .ok_or_else(|| format!("position {k}: the gradient sum is not complete"))
            })
            .collect()
    }
}

impl PositionReduction {
    fn partial_tag(&self) -> u16 {
        // Positions are few (the stages of one route); tags stay far below u16::MAX.
        u16::try_from(2 * self.position).unwrap_or(u16::MAX - 1)
    }

    fn total_tag(&self) -> u16 {
        self.partial_tag() + 1
    }

    /// The next unit of `me` at or after the cursor.
    fn next_own(&self, me: usize) -> Option<usize> {
        (self.cursor..self.units.len()).find(|&u| self.units[u].owner == me)
    }

    /// What this process waits for now.
    fn awaited(&self, me: usize) -> Option<Awaited> {
        match self.next_own(me) {
            Some(u) if u > 0 && self.units[u - 1].owner != me => Some(Awaited {
                position: self.position,
                from: self.units[u - 1].owner,
                total: false,
            }),
            Some(_) => None,
            None => self
                .units
                .last()
                .filter(|u| u.owner != me)
                .map(|u| Awaited {
                    position: self.position,
                    from: u.owner,
                    total: true,
                }),
        }
    }

    fn advance(
        &mut self,
        me: usize,
        deterministic: bool,
        courier: &mut dyn Courier,
    ) -> Result<(), String> {
        if self.total.is_some() {
            return Ok(());
        }
        while let Some(u) = self.next_own(me) {
            if !self.unit_ready(u, me, deterministic) {
                return Ok(());
            }
            if u > 0 && self.units[u - 1].owner != me {
                let from = self.units[u - 1].owner;
                let Some(bytes) = courier.try_receive(from, self.partial_tag())? else {
                    return Ok(());
                };
                self.running = Some(decode(&bytes, self.like()?)?);
            }
            let mut running = self.running.take();
            for grads in self.take_unit(u, deterministic)? {
                running = Some(add_into(running, grads)?);
            }
            self.cursor = u + 1;
            match self.units.get(u + 1) {
                Some(next) if next.owner != me => {
                    let sum = running.ok_or_else(|| self.empty())?;
                    courier.post(next.owner, self.partial_tag(), encode(&sum)?)?;
                }
                Some(_) => self.running = running,
                None => {
                    let total = running.ok_or_else(|| self.empty())?;
                    let bytes = encode(&total)?;
                    for &holder in self.holders.iter().filter(|&&h| h != me) {
                        courier.post(holder, self.total_tag(), bytes.clone())?;
                    }
                    self.total = Some(total);
                    return Ok(());
                }
            }
        }
        if let Some(last) = self.units.last().filter(|u| u.owner != me) {
            if let Some(bytes) = courier.try_receive(last.owner, self.total_tag())? {
                self.total = Some(decode(&bytes, self.like()?)?);
            }
        }
        Ok(())
    }

    fn empty(&self) -> String {
        format!(
            "position {}: a unit of the sum had no gradient",
            self.position
        )
    }

    /// Whether this process has every gradient of unit `u`.
    fn unit_ready(&self, u: usize, me: usize, deterministic: bool) -> bool {
        if deterministic {
            self.units[u]
                .microbatches
                .iter()
                .all(|m| self.grads.contains_key(m))
        } else {
            let own: usize = self
                .units
                .iter()
                .filter(|unit| unit.owner == me)
                .map(|unit| unit.microbatches.len())
                .sum();
            self.own_added == own
        }
    }

    /// The terms of unit `u`, in order.
    fn take_unit(&mut self, u: usize, deterministic: bool) -> Result<Vec<Vec<Tensor>>, String> {
        if !deterministic {
            return Ok(self.own_sum.take().into_iter().collect());
        }
        self.units[u]
            .microbatches
            .iter()
            .map(|m| {
                self.grads.remove(m).ok_or_else(|| {
                    format!("position {}: no gradient of microbatch {m}", self.position)
                })
            })
            .collect()
    }

    /// Tensors of this position's shapes and types (a received sum takes their layout).
    fn like(&self) -> Result<&[Tensor], String> {
        self.template.as_deref().ok_or_else(|| {
            format!(
                "position {}: a sum arrived before any gradient of this process",
                self.position
            )
        })
    }
}

/// `sum + grads` element by element (`grads` when there is no sum yet), as the in-process fold.
fn add_into(sum: Option<Vec<Tensor>>, grads: Vec<Tensor>) -> Result<Vec<Tensor>, String> {
    match sum {
        None => Ok(grads),
        Some(sum) => sum
            .iter()
            .zip(&grads)
            .map(|(a, b)| a.add(b).map_err(|e| e.to_string()))
            .collect(),
    }
}

/// The elements of `tensors`, little-endian, one after the other.
pub fn encode(tensors: &[Tensor]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    for t in tensors {
        let flat = t.flatten_all().map_err(|e| e.to_string())?;
        match t.dtype() {
            DType::F32 => {
                for x in flat.to_vec1::<f32>().map_err(|e| e.to_string())? {
                    out.extend_from_slice(&x.to_le_bytes());
                }
            }
            DType::F64 => {
                for x in flat.to_vec1::<f64>().map_err(|e| e.to_string())? {
                    out.extend_from_slice(&x.to_le_bytes());
                }
            }
            other => return Err(format!("gradients of type {other:?} cannot be sent")),
        }
    }
    Ok(out)
}

/// Tensors of the shapes and types of `like` from [`encode`]'s bytes; the length must match.
pub fn decode(bytes: &[u8], like: &[Tensor]) -> Result<Vec<Tensor>, String> {
    let expected: usize = like
        .iter()
        .map(|t| t.elem_count() * t.dtype().size_in_bytes())
        .sum();
    if bytes.len() != expected {
        return Err(format!(
            "a gradient sum of {} bytes arrived where {expected} were expected",
            bytes.len()
        ));
    }
    let mut offset = 0;
    like.iter()
        .map(|t| {
            let len = t.elem_count() * t.dtype().size_in_bytes();
            let chunk = &bytes[offset..offset + len];
            offset += len;
            let tensor = match t.dtype() {
                DType::F32 => {
                    let v: Vec<f32> = chunk
                        .chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect();
                    Tensor::from_vec(v, t.shape(), t.device())
                }
                DType::F64 => {
                    let v: Vec<f64> = chunk
                        .chunks_exact(8)
                        .map(|c| {
                            f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])
                        })
                        .collect();
                    Tensor::from_vec(v, t.shape(), t.device())
                }
                other => return Err(format!("gradients of type {other:?} cannot be received")),
            };
            tensor.map_err(|e| e.to_string())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradients::{GradSync, LocalGradients};
    use candle_core::Device;
    use pipeweave_core::testing::problem;
    use pipeweave_core::ProblemSpec;
    use pipeweave_kernels::GptConfig;
    use std::collections::VecDeque;

    /// Messages in memory: per (from, to, tag), in order.
    #[derive(Default)]
    struct Post {
        queues: BTreeMap<(usize, usize, u16), VecDeque<Vec<u8>>>,
    }

    struct Desk<'a> {
        me: usize,
        post: &'a mut Post,
    }

    impl Courier for Desk<'_> {
        fn post(&mut self, to: usize, tag: u16, bytes: Vec<u8>) -> Result<(), String> {
            self.post
                .queues
                .entry((self.me, to, tag))
                .or_default()
                .push_back(bytes);
            Ok(())
        }

        fn try_receive(&mut self, from: usize, tag: u16) -> Result<Option<Vec<u8>>, String> {
            Ok(self
                .post
                .queues
                .get_mut(&(from, self.me, tag))
                .and_then(VecDeque::pop_front))
        }
    }

    fn grads(g: u32, k: usize) -> Vec<Tensor> {
        // Values whose f32 sum depends on the order.
        let x = if g % 3 == 0 {
            1.0e8f32
        } else {
            1.0 + g as f32 + k as f32
        };
        let sign = if g % 2 == 0 { 1.0 } else { -1.0 };
        vec![Tensor::new(&[x * sign, 0.5 * g as f32], &Device::Cpu).unwrap()]
    }

    fn bits(t: &[Tensor]) -> Vec<u32> {
        t[0].to_vec1::<f32>()
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect()
    }

    /// Runs the reduction of every process of `replicas` copies of `problem` in memory, pumping
    /// them round-robin, and compares each total with the in-process fold.
    fn reduces_like_one_process(problem: &Problem, replicas: u32, deterministic: bool) {
        let config = GptConfig::new(4, 8, 2, 4).unwrap();
        let cut = ModelCut::new(&config, problem).unwrap();
        let owners = GradientOwners::new(problem, &cut, replicas);
        let world = problem.ranks() as usize * replicas as usize;
        let mut reductions: Vec<Reduction> = (0..world)
            .map(|w| Reduction::new(&owners, w, deterministic))
            .collect();
        let local = LocalGradients::new(cut.positions(), deterministic);
        // Gradients arrive in reverse microbatch order on every process.
        let g_count = problem.microbatches() * replicas;
        for g in (0..g_count).rev() {
            for k in 0..cut.positions() {
                let owner = owners.owners[k][g as usize].unwrap();
                reductions[owner].add(k, g, grads(g, k)).unwrap();
                local.add(k, g, grads(g, k)).unwrap();
            }
        }
        let mut post = Post::default();
        for _round in 0..4 * world * cut.positions() + 4 {
            for (w, r) in reductions.iter_mut().enumerate() {
                r.pump(&mut Desk {
                    me: w,
                    post: &mut post,
                })
                .unwrap();
            }
        }
        assert!(reductions.iter().all(Reduction::done));
        let expected = local.into_sums().unwrap();
        for (w, r) in reductions.into_iter().enumerate() {
            for (k, total) in r.into_totals().unwrap() {
                let want = expected[k].0.as_ref().unwrap();
                if deterministic {
                    assert_eq!(bits(&total), bits(want), "process {w} position {k}");
                } else {
                    let (a, b) = (
                        total[0].to_vec1::<f32>().unwrap(),
                        want[0].to_vec1::<f32>().unwrap(),
                    );
                    assert!((a[1] - b[1]).abs() < 1e-3, "process {w} position {k}");
                }
            }
        }
    }

    #[test]
    fn data_parallel_sums_equal_the_in_process_fold_bit_for_bit() {
        let problem = problem(2, 4);
        reduces_like_one_process(&problem, 2, true);
        reduces_like_one_process(&problem, 3, true);
        reduces_like_one_process(&problem, 2, false);
    }

    #[test]
    fn mirrored_stages_are_summed_in_microbatch_order() {
        let problem = ProblemSpec::dualpipe(4, 8).validate().unwrap();
        reduces_like_one_process(&problem, 1, true);
        reduces_like_one_process(&problem, 2, true);
        reduces_like_one_process(&problem, 2, false);
    }

    #[test]
    fn a_sum_waits_only_for_the_units_before_it() {
        let problem = problem(1, 2);
        let config = GptConfig::new(1, 8, 2, 4).unwrap();
        let cut = ModelCut::new(&config, &problem).unwrap();
        let owners = GradientOwners::new(&problem, &cut, 2);
        let mut second = Reduction::new(&owners, 1, true);
        second.add(0, 2, grads(2, 0)).unwrap();
        second.add(0, 3, grads(3, 0)).unwrap();
        let mut post = Post::default();
        second
            .pump(&mut Desk {
                me: 1,
                post: &mut post,
            })
            .unwrap();
        assert!(!second.done());
        assert_eq!(
            second.awaited(),
            Some(Awaited {
                position: 0,
                from: 0,
                total: false
            })
        );
        assert!(second
            .add(0, 0, grads(0, 0))
            .unwrap_err()
            .contains("not process 1's"));
    }

    #[test]
    fn a_sum_of_the_wrong_size_is_an_error() {
        let like = grads(1, 0);
        let bytes = encode(&like).unwrap();
        assert_eq!(bits(&decode(&bytes, &like).unwrap()), bits(&like));
        assert!(decode(&bytes[1..], &like)
            .unwrap_err()
            .contains("bytes arrived"));
    }
}
