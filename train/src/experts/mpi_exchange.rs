//! The MPI backend's expert parallelism (cargo feature `mpi`): [`MpiExchange`], the kernels'
//! [`ExpertExchange`] between the `X` processes of a group, and [`gather_gradients`], a
//! position's weight gradients on every process of the group, each parameter's from its owner.
//!
//! A group is the `X` expert ranks of one pipeline rank `p` of one replica `d` (world ranks
//! `(d·X + x)·P + p`), on a communicator of their own where expert rank `x` is rank `x`. Its
//! processes run the same program, so they call each phase for the same layers in the same order.
//!
//! **A call.** One message to every other rank of the group, posted immediately
//! ([`SharedMailbox`]: the send never waits for the peer's receive and is completed by later
//! polls, at the latest by [`MpiExchange::finish`] at the end of the step), then one message from
//! every other rank, waited for by polling with the rank's compute slot given up meanwhile
//! ([`while_waiting`]): the other half of an overlapped pair computes. The two phases are two
//! tags (the threads' lanes) with a call count each, so the two halves of a pair call them from
//! two threads at once and neither matches the other's messages; MPI keeps one sender's messages
//! of one tag in order, and the message's call number and phase are checked on receipt as on
//! threads. A wait longer than the run's receive timeout fails with
//! [`KernelError::ExpertExchange`] naming the rank waited for; a process whose step fails ends
//! the MPI job (`MPI_Abort`), so nothing waits on a dead peer longer than that.
//!
//! **The message** (integers little-endian): magic `PWX1`, the phase's lane (1 byte), the call
//! number (u64), the number of experts' rows (u32), then per rows the expert (u32), the element
//! type ([`WireDType::code`], 1 byte), the number of dimensions (1 byte) and each dimension
//! (u64), then every rows' elements in that order. Received rows move to the step's device.
//!
//! **Gradients.** After the step's data-parallel reduction each process of a group holds its
//! share's sums (the replicated parameters and its experts'); every process sends the others the
//! parameters it owns ([`super::ExpertParallel`]: expert rank 0 the replicated ones, each expert's
//! holder its experts') and takes each parameter from its owner, as the threads backend's merge
//! does: every process of the group updates the whole position with the same gradients.

use super::exchange::{gather_rows, gone, lane, waited, Member, Message};
use super::slot::handed_over;
use super::{ExpertParallel, ExpertRank};
use crate::error::TrainError;
use crate::mpi::WireTensor;
use crate::reduce::{decode, encode};
use candle_core::{Device, Tensor};
use pipeweave_backends::mpi::rsmpi;
use pipeweave_backends::mpi::{SharedMailbox, WireDType, WirePayload};
use pipeweave_kernels::{ExchangePhase, ExpertExchange, ExpertRows, KernelError};
use rsmpi::collective::CommunicatorCollectives;
use rsmpi::datatype::PartitionMut;
use rsmpi::topology::SimpleCommunicator;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The first four bytes of every message.
const MAGIC: [u8; 4] = *b"PWX1";

/// The first byte of each expert rank's part of a position's gradients.
const GRADIENTS_MARK: u8 = b'G';

/// The phase of a lane's code.
fn phase_of(code: u8) -> Option<ExchangePhase> {
    [ExchangePhase::Combine, ExchangePhase::DispatchBackward]
        .into_iter()
        .find(|&phase| lane(phase) == usize::from(code))
}

/// The tag of `phase`'s messages.
fn tag(phase: ExchangePhase) -> u16 {
    lane(phase) as u16
}

/// One expert rank's endpoint of its group's exchange over MPI, for one step.
#[derive(Debug)]
pub(crate) struct MpiExchange {
    at: Member,
    /// The group's mailbox, where expert rank `x` is rank `x`.
    mailbox: Arc<SharedMailbox>,
    /// Per phase's lane, its calls so far (held through a call: one call per phase at a time).
    calls: [Mutex<u64>; 2],
    /// Where received rows go.
    device: Device,
    timeout: Duration,
    /// The emulated all-to-all's least duration ([`super::settle`]).
    latency: Duration,
}

impl MpiExchange {
    /// The endpoint of expert rank `expert` of pipeline rank `rank` of replica `replica`, on its
    /// group's `mailbox` (where it is rank `expert`); received rows go to `device`, a wait lasts
    /// at most `timeout`.
    pub(crate) fn new(
        (replica, rank, expert): (u32, pipeweave_core::RankId, ExpertRank),
        mailbox: Arc<SharedMailbox>,
        device: Device,
        (timeout, latency): (Duration, Duration),
    ) -> Result<MpiExchange, TrainError> {
        if mailbox.rank() != expert.get() as usize {
            return Err(TrainError::invariant(format!(
                "expert rank {} is rank {} of its group's communicator",
                expert.get(),
                mailbox.rank()
            )));
        }
        Ok(MpiExchange {
            at: Member {
                replica,
                rank,
                expert,
            },
            mailbox,
            calls: [Mutex::new(0), Mutex::new(0)],
            device,
            timeout,
            latency,
        })
    }

    /// The other expert ranks of the group.
    fn peers(&self) -> impl Iterator<Item = ExpertRank> + '_ {
        (0..self.mailbox.size() as u32)
            .map(ExpertRank::new)
            .filter(move |&x| x != self.at.expert)
    }

    /// Waits (within the timeout) until every message this endpoint sent has been received: the
    /// end of a step.
    pub(crate) fn finish(&self) -> Result<(), TrainError> {
        let done = self
            .mailbox
            .finish_within(self.timeout)
            .map_err(|e| self.failure(e.to_string()))?;
        if !done {
            let what = format!(
                "the group did not receive its rows within {} s of the end of the step",
                self.timeout.as_secs_f64()
            );
            return Err(self.failure(what));
        }
        Ok(())
    }

    /// The error of this endpoint outside a call, saying `what`.
    fn failure(&self, what: String) -> TrainError {
        TrainError::Mpi {
            what: format!("the expert exchange of {}: {what}", self.at),
        }
    }

    /// `peer`'s message of this call of `phase`, decoded (an error after the timeout).
    fn receive(&self, phase: ExchangePhase, peer: ExpertRank) -> Result<Message, KernelError> {
        let from = peer.get() as usize;
        let received = match handed_over() {
            true => self.mailbox.receive_napping(from, tag(phase), self.timeout),
            false => self.mailbox.receive_within(from, tag(phase), self.timeout),
        };
        let bytes = received
            .map_err(|e| self.at.error(phase, format!("{}: {e}", gone(peer))))?
            .ok_or_else(|| self.at.error(phase, waited(self.timeout, peer)))?;
        self.decode(phase, peer, &bytes)
    }

    /// `peer`'s message of this call of `phase` if it has arrived (one poll).
    fn arrived(
        &self,
        phase: ExchangePhase,
        peer: ExpertRank,
    ) -> Result<Option<Message>, KernelError> {
        let from = peer.get() as usize;
        let polled = self
            .mailbox
            .receive_within(from, tag(phase), Duration::ZERO);
        match polled.map_err(|e| self.at.error(phase, format!("{}: {e}", gone(peer))))? {
            Some(bytes) => self.decode(phase, peer, &bytes).map(Some),
            None => Ok(None),
        }
    }

    /// `peer`'s message decoded from `bytes`.
    fn decode(
        &self,
        phase: ExchangePhase,
        peer: ExpertRank,
        bytes: &[u8],
    ) -> Result<Message, KernelError> {
        let what = |e: String| format!("expert rank {}'s rows: {e}", peer.get());
        read_message(bytes, &self.device).map_err(|e| self.at.error(phase, what(e)))
    }
}

impl ExpertExchange for MpiExchange {
    fn exchange(
        &self,
        phase: ExchangePhase,
        rows: Vec<ExpertRows>,
    ) -> Result<Vec<ExpertRows>, KernelError> {
        let mut calls = self.calls[lane(phase)]
            .lock()
            .map_err(|_| self.at.error(phase, "its call count was poisoned".into()))?;
        *calls += 1;
        let call = *calls;
        let bytes = write_message(phase, call, &rows).map_err(|e| self.at.error(phase, e))?;
        for peer in self.peers() {
            self.mailbox
                .post(peer.get() as usize, tag(phase), bytes.clone())
                .map_err(|e| self.at.error(phase, format!("{}: {e}", gone(peer))))?;
        }
        let issued = Instant::now();
        gather_rows(
            (phase, call),
            rows,
            self.peers().map(|peer| (peer, ())),
            |peer, ()| self.arrived(phase, peer),
            |peer, ()| self.receive(phase, peer),
            |what| self.at.error(phase, what),
            (issued, self.latency),
        )
    }
}

/// The bytes of call `call` of `phase` carrying `rows` (see the module doc).
fn write_message(phase: ExchangePhase, call: u64, rows: &[ExpertRows]) -> Result<Vec<u8>, String> {
    let mut out = MAGIC.to_vec();
    out.push(lane(phase) as u8);
    out.extend_from_slice(&call.to_le_bytes());
    out.extend_from_slice(
        &u32::try_from(rows.len())
            .map_err(|e| e.to_string())?
            .to_le_bytes(),
    );
    let mut tensors = Vec::with_capacity(rows.len());
    for entry in rows {
        let tensor = WireTensor(entry.rows().clone());
        let shape = tensor.shape();
        let expert = u32::try_from(entry.expert()).map_err(|e| e.to_string())?;
        out.extend_from_slice(&expert.to_le_bytes());
        out.push(tensor.dtype().code());
        out.push(u8::try_from(shape.len()).map_err(|e| e.to_string())?);
        for dim in shape {
            out.extend_from_slice(&(dim as u64).to_le_bytes());
        }
        tensors.push(tensor.0);
    }
    out.extend(encode(&tensors)?);
    Ok(out)
}

/// A message's fields in order.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    /// The next `n` bytes, naming `what` when the message ends first.
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&end| end <= self.bytes.len());
        let end = end.ok_or_else(|| {
            format!(
                "the message ends ({} bytes) before its {what}",
                self.bytes.len()
            )
        })?;
        let taken = &self.bytes[self.at..end];
        self.at = end;
        Ok(taken)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], String> {
        let bytes = self.take(N, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    fn u8(&mut self, what: &str) -> Result<u8, String> {
        Ok(self.array::<1>(what)?[0])
    }

    fn u32(&mut self, what: &str) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }
}

/// The message of `bytes` ([`write_message`]'s), its rows on `device`.
fn read_message(bytes: &[u8], device: &Device) -> Result<Message, String> {
    let mut reader = Reader { bytes, at: 0 };
    if reader.array::<4>("magic")? != MAGIC {
        return Err("not an expert exchange message (no PWX1 magic)".into());
    }
    let code = reader.u8("phase")?;
    let phase = phase_of(code).ok_or_else(|| format!("{code} is not a phase's code"))?;
    let call = reader.u64("call number")?;
    let count = reader.u32("rows count")?;
    let mut heads = Vec::new();
    for i in 0..count {
        let expert = reader.u32(&format!("rows {i}'s expert"))? as usize;
        let code = reader.u8(&format!("rows {i}'s element type"))?;
        let dtype = WireDType::from_code(code)
            .ok_or_else(|| format!("rows {i}: {code} is not an element type's code"))?;
        let dims = reader.u8(&format!("rows {i}'s dimensions"))?;
        let shape = (0..dims)
            .map(|_| {
                let dim = reader.u64(&format!("rows {i}'s shape"))?;
                usize::try_from(dim).map_err(|e| format!("rows {i}: dimension {dim}: {e}"))
            })
            .collect::<Result<Vec<usize>, String>>()?;
        heads.push((expert, dtype, shape));
    }
    let mut rows = Vec::with_capacity(heads.len());
    for (i, (expert, dtype, shape)) in heads.into_iter().enumerate() {
        let len = shape
            .iter()
            .try_fold(dtype.size(), |n, &d| n.checked_mul(d))
            .ok_or_else(|| format!("rows {i}: the shape {shape:?} overflows"))?;
        let elements = reader.take(len, &format!("rows {i}'s elements ({shape:?})"))?;
        let tensor = WireTensor::from_bytes(dtype, &shape, elements)
            .map_err(|e| format!("rows {i}: {e}"))?
            .0
            .to_device(device)
            .map_err(|e| format!("rows {i}: {e}"))?;
        rows.push(ExpertRows::new(expert, tensor));
    }
    if reader.at != bytes.len() {
        return Err(format!(
            "{} bytes follow the last rows' elements",
            bytes.len() - reader.at
        ));
    }
    Ok(Message { call, phase, rows })
}

/// Position `k`'s weight gradients in the whole model's parameter order (`whole`: its
/// parameters, for their shapes), on every process of the `group` of expert ranks (collective
/// over it: every process calls it for the same positions in the same order): expert rank `x`'s
/// `own` sums (its share's, in its own order) give the parameters it owns, the others' theirs.
pub(crate) fn gather_gradients(
    parallel: &ExpertParallel,
    group: &SimpleCommunicator,
    (x, k): (ExpertRank, usize),
    own: &[Tensor],
    whole: &[Tensor],
) -> Result<Vec<Tensor>, TrainError> {
    let owners = parallel
        .owners
        .get(k)
        .ok_or_else(|| TrainError::invariant(format!("the expert ranks have no position {k}")))?;
    if owners.len() != whole.len() {
        return Err(TrainError::invariant(format!(
            "position {k} has {} parameters and {} owners",
            whole.len(),
            owners.len()
        )));
    }
    // Per expert rank, the parameters it owns (as the whole model has them: shapes, types).
    let owned_by = |r: usize| -> Vec<Tensor> {
        (owners.iter().zip(whole))
            .filter(|((owner, _), _)| *owner == r)
            .map(|(_, t)| t.clone())
            .collect()
    };
    let mine = (owners.iter())
        .filter(|(owner, _)| *owner == x.get() as usize)
        .map(|&(_, i)| {
            own.get(i).cloned().ok_or_else(|| {
                TrainError::invariant(format!(
                    "expert rank {} has no gradient {i} at position {k}",
                    x.get()
                ))
            })
        })
        .collect::<Result<Vec<Tensor>, TrainError>>()?;
    let mpi = |what: String| TrainError::Mpi {
        what: format!(
            "the gradients of position {k} within expert rank {}'s group: {what}",
            x.get()
        ),
    };
    // Each part starts with a mark: no part is empty (an empty slice's address may be
    // MPI_IN_PLACE's).
    let bytes = [vec![GRADIENTS_MARK], encode(&mine).map_err(mpi)?].concat();
    let ranks = parallel.ranks() as usize;
    let likes: Vec<Vec<Tensor>> = (0..ranks).map(owned_by).collect();
    let counts = (likes.iter())
        .map(|like| {
            let len: usize = like
                .iter()
                .map(|t| t.elem_count() * t.dtype().size_in_bytes())
                .sum::<usize>()
                + 1;
            i32::try_from(len).map_err(|_| mpi(format!("{len} bytes are more than MPI counts")))
        })
        .collect::<Result<Vec<i32>, TrainError>>()?;
    if usize::try_from(counts[x.get() as usize]).ok() != Some(bytes.len()) {
        return Err(TrainError::invariant(format!(
            "expert rank {}'s gradients at position {k} are {} bytes, its parameters {}",
            x.get(),
            bytes.len(),
            counts[x.get() as usize]
        )));
    }
    let displs: Vec<i32> = counts
        .iter()
        .scan(0i32, |at, &n| {
            let start = *at;
            *at += n;
            Some(start)
        })
        .collect();
    let total: usize = counts.iter().map(|&n| n as usize).sum();
    let mut all = vec![0u8; total];
    {
        let mut partition = PartitionMut::new(&mut all[..], &counts[..], &displs[..]);
        group.all_gather_varcount_into(&bytes[..], &mut partition);
    }
    let mut per_rank = Vec::with_capacity(ranks);
    for (r, like) in likes.iter().enumerate() {
        let start = displs[r] as usize;
        let part = &all[start..start + counts[r] as usize];
        let Some((&GRADIENTS_MARK, elements)) = part.split_first() else {
            return Err(mpi(format!("expert rank {r}'s part is not gradients")));
        };
        per_rank.push(decode(elements, like).map_err(mpi)?.into_iter());
    }
    owners
        .iter()
        .map(|&(owner, i)| {
            per_rank
                .get_mut(owner)
                .and_then(Iterator::next)
                .ok_or_else(|| mpi(format!("expert rank {owner} sent no gradient {i}")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::DType;

    fn rows(expert: usize, n: usize) -> ExpertRows {
        let values: Vec<f32> = (0..n * 3).map(|v| v as f32 + expert as f32 / 8.0).collect();
        ExpertRows::new(
            expert,
            Tensor::from_vec(values, (n, 3), &Device::Cpu).unwrap(),
        )
    }

    fn bits(rows: &ExpertRows) -> Vec<u32> {
        let flat = rows.rows().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        flat.into_iter().map(f32::to_bits).collect()
    }

    #[test]
    fn a_message_carries_its_call_phase_and_rows_bit_for_bit() {
        let sent = vec![rows(2, 4), rows(3, 0), rows(5, 1)];
        let bytes = write_message(ExchangePhase::DispatchBackward, 7, &sent).unwrap();
        let got = read_message(&bytes, &Device::Cpu).unwrap();
        assert_eq!((got.call, got.phase), (7, ExchangePhase::DispatchBackward));
        assert_eq!(got.rows.len(), 3);
        for (a, b) in sent.iter().zip(&got.rows) {
            assert_eq!(a.expert(), b.expert());
            assert_eq!(a.rows().dims(), b.rows().dims());
            assert_eq!(bits(a), bits(b));
        }
        let rows = got.rows_of(ExpertRank::new(1), 7, ExchangePhase::DispatchBackward);
        assert_eq!(rows.unwrap().len(), 3);
    }

    #[test]
    fn a_message_of_another_call_or_phase_is_refused() {
        let bytes = write_message(ExchangePhase::Combine, 3, &[rows(0, 2)]).unwrap();
        let message = read_message(&bytes, &Device::Cpu).unwrap();
        let err = message
            .rows_of(ExpertRank::new(1), 4, ExchangePhase::Combine)
            .unwrap_err();
        assert_eq!(
            err,
            "expert rank 1 sent its rows of call 3 (combine) for call 4 (combine): the group's \
             ranks ran different programs"
        );
    }

    #[test]
    fn broken_messages_are_refused_with_what_is_wrong() {
        let bytes = write_message(ExchangePhase::Combine, 1, &[rows(0, 2)]).unwrap();
        let check = |bytes: &[u8], expected: &str| {
            let err = read_message(bytes, &Device::Cpu).unwrap_err();
            assert!(err.contains(expected), "{err}");
        };
        check(
            &bytes[..bytes.len() - 1],
            "before its rows 0's elements ([2, 3])",
        );
        check(
            &[bytes.as_slice(), &[0]].concat(),
            "1 bytes follow the last rows",
        );
        check(b"PWV1", "no PWX1 magic");
        let mut phase = bytes.clone();
        phase[4] = 9;
        check(&phase, "9 is not a phase's code");
        let mut dtype = bytes.clone();
        dtype[4 + 1 + 8 + 4 + 4] = 0;
        check(&dtype, "0 is not an element type's code");
        let mut ints = bytes.clone();
        ints[4 + 1 + 8 + 4 + 4] = WireDType::U32.code();
        check(&ints, "cannot be of type u32");
        let f64_rows = ExpertRows::new(1, Tensor::zeros((1, 2), DType::F64, &Device::Cpu).unwrap());
        let bytes = write_message(ExchangePhase::Combine, 1, &[f64_rows]).unwrap();
        let got = read_message(&bytes, &Device::Cpu).unwrap();
        assert_eq!(got.rows[0].rows().dtype(), DType::F64);
    }
}
