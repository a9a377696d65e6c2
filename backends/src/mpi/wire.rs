//! The bytes of one message between two MPI ranks: a fixed header naming the message, the element
//! type and the shape, then the payload's elements.
//!
//! Layout (all integers little-endian):
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 4 | magic `PWV1` (pipeweave wire, version 1) |
//! | 4 | 1 | direction: 0 activation, 1 gradient |
//! | 5 | 1 | dtype code ([`WireDType::code`]) |
//! | 6 | 2 | number of dimensions `n` (at most [`MAX_DIMS`]) |
//! | 8 | 4 | producing stage |
//! | 12 | 4 | consuming stage |
//! | 16 | 4 | microbatch |
//! | 20 | 4 | shape slot |
//! | 24 | 8 n | the dimensions, u64 each |
//! | 24 + 8 n | | the elements, row-major, little-endian, `product(dims) * dtype size` bytes |
//!
//! [`decode`] never reinterprets bytes: a buffer that is not a pipeweave message, a message other
//! than the expected one ([`TransportFailure::Unexpected`], naming both), an element type or shape
//! other than the one the payload type expects, or a length that does not match the shape
//! ([`TransportFailure::Broken`], naming both shapes) is an error. None of this needs MPI; it is
//! tested on plain byte buffers.

use crate::transport::TransportFailure;
use pipeweave_core::{Direction, Message, MicrobatchId, RankId, ShapeSlot, StageId};
use std::fmt;

/// The first four bytes of every message.
pub const MAGIC: [u8; 4] = *b"PWV1";

/// The most dimensions a payload may have.
pub const MAX_DIMS: usize = 16;

/// Bytes of the header before the dimensions.
const FIXED: usize = 24;

/// The element type of a payload on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WireDType {
    /// 64-bit float.
    F64,
    /// 32-bit float.
    F32,
    /// 16-bit float (IEEE half).
    F16,
    /// bfloat16.
    BF16,
    /// 64-bit signed integer.
    I64,
    /// 32-bit unsigned integer.
    U32,
    /// Bytes.
    U8,
}

impl WireDType {
    const ALL: [WireDType; 7] = [
        WireDType::F64,
        WireDType::F32,
        WireDType::F16,
        WireDType::BF16,
        WireDType::I64,
        WireDType::U32,
        WireDType::U8,
    ];

    /// The code in the header.
    pub fn code(self) -> u8 {
        match self {
            WireDType::F64 => 1,
            WireDType::F32 => 2,
            WireDType::F16 => 3,
            WireDType::BF16 => 4,
            WireDType::I64 => 5,
            WireDType::U32 => 6,
            WireDType::U8 => 7,
        }
    }

    /// The type of a header code, if it is one.
    pub fn from_code(code: u8) -> Option<WireDType> {
        WireDType::ALL.into_iter().find(|d| d.code() == code)
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            WireDType::F64 | WireDType::I64 => 8,
            WireDType::F32 | WireDType::U32 => 4,
            WireDType::F16 | WireDType::BF16 => 2,
            WireDType::U8 => 1,
        }
    }
}

impl fmt::Display for WireDType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WireDType::F64 => "f64",
            WireDType::F32 => "f32",
            WireDType::F16 => "f16",
            WireDType::BF16 => "bf16",
            WireDType::I64 => "i64",
            WireDType::U32 => "u32",
            WireDType::U8 => "u8",
        })
    }
}

/// A payload the MPI transport can carry: it knows its element type and shape and turns into and
/// back from its elements' bytes (row-major, little-endian). Implemented here for `f64` (the
/// scalar of [`crate::numeric`]); a tensor type implements it the same way, returning its own
/// dtype and shape, and [`WirePayload::expected`] where the receiver knows what must arrive.
pub trait WirePayload: Sized {
    /// The element type of this payload.
    fn dtype(&self) -> WireDType;

    /// The dimensions of this payload (empty for a scalar).
    fn shape(&self) -> Vec<usize>;

    /// The elements, row-major and little-endian: exactly `product(shape) * dtype.size()` bytes.
    fn to_bytes(&self) -> Vec<u8>;

    /// The payload of `bytes` (whose length the transport has already checked against `dtype`
    /// and `shape`); an error names what this type cannot hold.
    fn from_bytes(dtype: WireDType, shape: &[usize], bytes: &[u8]) -> Result<Self, String>;

    /// The element type and shape a receive of `message` must carry, when the type knows it in
    /// advance; `None` leaves the check to [`WirePayload::from_bytes`].
    fn expected(_message: &Message) -> Option<(WireDType, Vec<usize>)> {
        None
    }
}

impl WirePayload for f64 {
    fn dtype(&self) -> WireDType {
        WireDType::F64
    }

    fn shape(&self) -> Vec<usize> {
        Vec::new()
    }

    fn to_bytes(&self) -> Vec<u8> {
        self.to_le_bytes().to_vec()
    }

    fn from_bytes(dtype: WireDType, shape: &[usize], bytes: &[u8]) -> Result<f64, String> {
        if dtype != WireDType::F64 || !shape.is_empty() {
            return Err(format!(
                "an f64 scalar cannot hold {}",
                Layout::describe(dtype, shape)
            ));
        }
        let array: [u8; 8] = bytes
            .try_into()
            .map_err(|_| format!("an f64 scalar is 8 bytes, not {}", bytes.len()))?;
        Ok(f64::from_le_bytes(array))
    }

    fn expected(_message: &Message) -> Option<(WireDType, Vec<usize>)> {
        Some((WireDType::F64, Vec::new()))
    }
}

/// A dtype with a shape, for messages.
struct Layout;

impl Layout {
    fn describe(dtype: WireDType, shape: &[usize]) -> String {
        let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
        format!("{dtype} [{}]", dims.join(", "))
    }
}

/// The header of one message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// Which message.
    pub message: Message,
    /// The element type.
    pub dtype: WireDType,
    /// The dimensions.
    pub shape: Vec<usize>,
}

impl Header {
    /// The header's bytes.
    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&MAGIC);
        out.push(match self.message.direction {
            Direction::Activation => 0,
            Direction::Gradient => 1,
        });
        out.push(self.dtype.code());
        // `encode` refuses more than MAX_DIMS dimensions, so the count fits in a u16.
        out.extend_from_slice(&(self.shape.len() as u16).to_le_bytes());
        for value in [
            self.message.from_stage.get(),
            self.message.to_stage.get(),
            self.message.microbatch.get(),
            self.message.slot.get(),
        ] {
            out.extend_from_slice(&value.to_le_bytes());
        }
        for &dim in &self.shape {
            out.extend_from_slice(&(dim as u64).to_le_bytes());
        }
    }

    /// Reads a header from the front of `bytes`; returns it and the payload bytes after it.
    pub fn parse(bytes: &[u8]) -> Result<(Header, &[u8]), String> {
        if bytes.len() < FIXED || bytes[..4] != MAGIC {
            return Err(format!(
                "{} bytes that are not a pipeweave message (no `PWV1` header)",
                bytes.len()
            ));
        }
        let direction = match bytes[4] {
            0 => Direction::Activation,
            1 => Direction::Gradient,
            other => return Err(format!("a header with direction code {other}")),
        };
        let dtype = WireDType::from_code(bytes[5])
            .ok_or_else(|| format!("a header with element-type code {}", bytes[5]))?;
        let dims = usize::from(u16::from_le_bytes([bytes[6], bytes[7]]));
        if dims > MAX_DIMS {
            return Err(format!(
                "a header with {dims} dimensions (at most {MAX_DIMS})"
            ));
        }
        let u32_at = |at: usize| {
            u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        let message = Message {
            direction,
            from_stage: StageId::new(u32_at(8)),
            to_stage: StageId::new(u32_at(12)),
            microbatch: MicrobatchId::new(u32_at(16)),
            slot: ShapeSlot::after(StageId::new(u32_at(20))),
        };
        let end = FIXED + 8 * dims;
        if bytes.len() < end {
            return Err(format!(
                "a header of {dims} dimensions cut off after {} bytes",
                bytes.len()
            ));
        }
        let mut shape = Vec::with_capacity(dims);
        for chunk in bytes[FIXED..end].chunks_exact(8) {
            let mut array = [0u8; 8];
            array.copy_from_slice(chunk);
            let dim = usize::try_from(u64::from_le_bytes(array))
                .map_err(|_| "a dimension larger than this machine's address space".to_string())?;
            shape.push(dim);
        }
        Ok((
            Header {
                message,
                dtype,
                shape,
            },
            &bytes[end..],
        ))
    }

    /// The number of payload bytes the dtype and shape take, if it fits in a `usize`.
    pub fn payload_len(&self) -> Option<usize> {
        self.shape
            .iter()
            .try_fold(self.dtype.size(), |n, &d| n.checked_mul(d))
    }
}

/// The bytes of `message` carrying `payload`: header, then elements.
pub fn encode<T: WirePayload>(message: Message, payload: &T) -> Result<Vec<u8>, TransportFailure> {
    let header = Header {
        message,
        dtype: payload.dtype(),
        shape: payload.shape(),
    };
    if header.shape.len() > MAX_DIMS {
        return Err(TransportFailure::Broken(format!(
            "cannot send {message}: {} dimensions (at most {MAX_DIMS})",
            header.shape.len()
        )));
    }
    let data = payload.to_bytes();
    if header.payload_len() != Some(data.len()) {
        return Err(TransportFailure::Broken(format!(
            "cannot send {message}: {} takes {} bytes, but the payload gave {}",
            Layout::describe(header.dtype, &header.shape),
            header
                .payload_len()
                .map_or_else(|| "more than usize::MAX".to_string(), |n| n.to_string()),
            data.len()
        )));
    }
    let mut out = Vec::with_capacity(FIXED + 8 * header.shape.len() + data.len());
    header.write(&mut out);
    out.extend_from_slice(&data);
    Ok(out)
}

/// The payload of `bytes`, received from rank `from` where the program expects `expected`.
pub fn decode<T: WirePayload>(
    from: RankId,
    expected: Message,
    bytes: &[u8],
) -> Result<T, TransportFailure> {
    let (header, data) = Header::parse(bytes).map_err(|reason| {
        TransportFailure::Broken(format!(
            "rank {from} sent {reason} where {expected} was expected"
        ))
    })?;
    if header.message != expected {
        return Err(TransportFailure::Unexpected {
            from,
            expected,
            got: header.message,
        });
    }
    let got = Layout::describe(header.dtype, &header.shape);
    if let Some((dtype, shape)) = T::expected(&expected) {
        if dtype != header.dtype || shape != header.shape {
            return Err(TransportFailure::Broken(format!(
                "rank {from} sent {expected} as {got}, but this rank expects {}",
                Layout::describe(dtype, &shape)
            )));
        }
    }
    if header.payload_len() != Some(data.len()) {
        return Err(TransportFailure::Broken(format!(
            "rank {from} sent {expected} as {got} with {} payload bytes, which is not that shape's size",
            data.len()
        )));
    }
    T::from_bytes(header.dtype, &header.shape, data).map_err(|reason| {
        TransportFailure::Broken(format!("rank {from} sent {expected} as {got}: {reason}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn act(from: u32, to: u32, mb: u32) -> Message {
        Message::activation(StageId::new(from), StageId::new(to), MicrobatchId::new(mb))
    }

    /// A payload of any dtype and shape, for the checks `f64` cannot reach.
    #[derive(Debug, PartialEq)]
    struct Raw {
        dtype: WireDType,
        shape: Vec<usize>,
        data: Vec<u8>,
    }

    impl WirePayload for Raw {
        fn dtype(&self) -> WireDType {
            self.dtype
        }
        fn shape(&self) -> Vec<usize> {
            self.shape.clone()
        }
        fn to_bytes(&self) -> Vec<u8> {
            self.data.clone()
        }
        fn from_bytes(dtype: WireDType, shape: &[usize], bytes: &[u8]) -> Result<Raw, String> {
            Ok(Raw {
                dtype,
                shape: shape.to_vec(),
                data: bytes.to_vec(),
            })
        }
    }

    #[test]
    fn a_message_round_trips() {
        let message = Message::gradient(StageId::new(3), StageId::new(2), MicrobatchId::new(7));
        let bytes = encode(message, &1.25f64).unwrap();
        assert_eq!(bytes.len(), FIXED + 8);
        assert_eq!(
            decode::<f64>(RankId::new(1), message, &bytes).unwrap(),
            1.25
        );
        let raw = Raw {
            dtype: WireDType::F32,
            shape: vec![2, 3],
            data: (0..24).collect(),
        };
        let bytes = encode(act(0, 1, 4), &raw).unwrap();
        assert_eq!(
            decode::<Raw>(RankId::new(0), act(0, 1, 4), &bytes).unwrap(),
            raw
        );
    }

    #[test]
    fn another_message_is_unexpected_and_names_both() {
        let bytes = encode(act(0, 1, 4), &1.0f64).unwrap();
        let err = decode::<f64>(RankId::new(0), act(0, 1, 5), &bytes).unwrap_err();
        assert_eq!(
            err,
            TransportFailure::Unexpected {
                from: RankId::new(0),
                expected: act(0, 1, 5),
                got: act(0, 1, 4),
            }
        );
    }

    #[test]
    fn another_dtype_or_shape_is_broken_and_names_both() {
        let raw = Raw {
            dtype: WireDType::F32,
            shape: vec![2],
            data: vec![0; 8],
        };
        let bytes = encode(act(0, 1, 0), &raw).unwrap();
        let err = decode::<f64>(RankId::new(0), act(0, 1, 0), &bytes).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("f32 [2]") && text.contains("f64 []"),
            "{text}"
        );
    }

    #[test]
    fn bad_bytes_are_refused() {
        let from = RankId::new(2);
        let err = decode::<f64>(from, act(0, 1, 0), b"hello").unwrap_err();
        assert!(err.to_string().contains("not a pipeweave message"), "{err}");
        let mut bytes = encode(act(0, 1, 0), &1.0f64).unwrap();
        bytes.pop();
        let err = decode::<f64>(from, act(0, 1, 0), &bytes).unwrap_err();
        assert!(err.to_string().contains("7 payload bytes"), "{err}");
        // A payload whose bytes do not match its own shape is refused at the sender.
        let raw = Raw {
            dtype: WireDType::F64,
            shape: vec![2],
            data: vec![0; 3],
        };
        assert!(encode(act(0, 1, 0), &raw).is_err());
    }
}
