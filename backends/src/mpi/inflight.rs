//! Nonblocking MPI operations on buffers they own, so that a send can outlive the communication
//! group that posted it (its buffer stays alive until [`crate::transport::Transport::finish`]).
//!
//! rsmpi ties a request's buffer to a lexical scope ([`::mpi::request::scope`]) or to `'static`.
//! The transport needs neither: a send's bytes are made inside one `exchange` and must live until a
//! later call completes them. [`InFlight`] therefore moves the bytes to the heap, lends them to MPI
//! as `'static` for the request's lifetime, and takes them back (or frees them) only once MPI
//! reports the request complete. An operation that never completes (the run is being aborted)
//! leaks its buffer rather than free memory MPI may still touch.
//!
//! This is the MPI backend's `unsafe` code but for [`super::shared`]'s `Send` (a mailbox made at
//! `MPI_THREAD_MULTIPLE`); the invariant is stated where it is used.

use ::mpi::point_to_point::{Destination, Message as Matched};
use ::mpi::request::{Request, StaticScope};
use ::mpi::Tag;
use std::ptr::NonNull;

/// One immediate send or receive with the buffer it owns.
pub(crate) struct InFlight {
    /// The request, until MPI reports it complete.
    request: Option<Request<'static, [u8]>>,
    /// The buffer, from `Box::into_raw`. Invariant: while `request` is `Some`, MPI may read or
    /// write it, and the only references to it are the one held by `request`; once `request` is
    /// `None` nothing else refers to it.
    buffer: NonNull<[u8]>,
}

impl InFlight {
    /// Posts an immediate send of `bytes` to `to` with `tag`.
    pub(crate) fn send<D: Destination>(to: &D, tag: Tag, bytes: Vec<u8>) -> InFlight {
        let buffer = NonNull::from(Box::leak(bytes.into_boxed_slice()));
        // SAFETY: `buffer` comes from a leaked box: valid and unaliased. The shared reference
        // lives in the request only; `InFlight` frees the box after the request completed (and
        // with it that reference), never before.
        let data: &'static [u8] = unsafe { buffer.as_ref() };
        let request = to.immediate_send_with_tag(StaticScope, data, tag);
        InFlight {
            request: Some(request),
            buffer,
        }
    }

    /// Posts the immediate receive of a matched message of `len` bytes.
    pub(crate) fn receive(matched: Matched, len: usize) -> InFlight {
        let mut buffer = NonNull::from(Box::leak(vec![0u8; len].into_boxed_slice()));
        // SAFETY: as in `send`: the mutable reference is lent to MPI through the request only and
        // the box is taken back after the request completed.
        let data: &'static mut [u8] = unsafe { buffer.as_mut() };
        let request = matched.immediate_matched_receive_into(StaticScope, data);
        InFlight {
            request: Some(request),
            buffer,
        }
    }

    /// Whether the operation has completed (tests it once if it has not yet).
    pub(crate) fn test(&mut self) -> bool {
        match self.request.take() {
            None => true,
            Some(request) => match request.test() {
                Ok(_) => true,
                Err(request) => {
                    self.request = Some(request);
                    false
                }
            },
        }
    }

    /// The buffer of a completed operation; the operation itself while it is still in flight.
    pub(crate) fn into_bytes(mut self) -> Result<Vec<u8>, InFlight> {
        if !self.test() {
            return Err(self);
        }
        let buffer = self.buffer;
        // Leaves `Drop` nothing to free: the box is owned by the result below.
        self.buffer = NonNull::slice_from_raw_parts(NonNull::dangling(), 0);
        // SAFETY: the request completed, so MPI no longer touches the buffer and no reference
        // to it remains; it came from `Box::leak` and is taken back exactly once.
        let boxed = unsafe { Box::from_raw(buffer.as_ptr()) };
        Ok(boxed.into_vec())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        match self.request.take() {
            // Still in flight (the run is being abandoned): MPI may still read or write the
            // buffer, so neither the request nor the buffer may be released.
            Some(request) => std::mem::forget(request),
            None => {
                if !self.buffer.is_empty() {
                    // SAFETY: completed, so unused by MPI and unreferenced; from `Box::leak`,
                    // freed exactly once (`into_bytes` empties `buffer` when it takes the box).
                    drop(unsafe { Box::from_raw(self.buffer.as_ptr()) });
                }
            }
        }
    }
}
