//! A rank's one compute stream ([`ComputeSlot`]) and the rule that an exchange's wait gives it
//! up ([`while_waiting`]).
//!
//! An overlapped F&B pair (DualPipe's) runs its two halves on two threads of its rank, the way a
//! GPU runs them on one compute stream beside a communication stream: only one half computes at
//! a time (it holds the slot), and a half that waits for an all-to-all's rows gives the slot to
//! the other half meanwhile. So the pair takes the time of its computes plus whatever of its
//! all-to-alls the other half's compute could not cover, not the time of two computes at once:
//! what it gains over the halves in turn is only the hidden communication, as on a device.
//!
//! A thread holds a slot through the guard [`ComputeSlot::hold`] returns; the exchanges call
//! [`while_waiting`] around their waits without knowing whether a pair is running (a thread that
//! holds no slot just waits).

use std::cell::{Cell, RefCell};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// One rank's compute stream: held by at most one thread at a time.
#[derive(Debug, Default)]
pub(crate) struct ComputeSlot {
    busy: Mutex<bool>,
    freed: Condvar,
}

thread_local! {
    /// The slot this thread holds, if any.
    static HELD: RefCell<Option<Arc<ComputeSlot>>> = const { RefCell::new(None) };
    /// Whether this thread gave its slot to the other half of its pair for a wait.
    static HANDED_OVER: Cell<bool> = const { Cell::new(false) };
}

impl ComputeSlot {
    /// A free slot.
    pub(crate) fn new() -> Arc<ComputeSlot> {
        Arc::new(ComputeSlot::default())
    }

    /// Waits until the slot is free and holds it on this thread until the guard drops.
    pub(crate) fn hold(self: &Arc<Self>) -> Held {
        self.acquire();
        HELD.with(|held| *held.borrow_mut() = Some(Arc::clone(self)));
        Held {
            slot: Arc::clone(self),
        }
    }

    /// The flag, whether or not a thread panicked while it was locked (the flag is a plain
    /// bool: it is never left half-written).
    fn flag(&self) -> MutexGuard<'_, bool> {
        self.busy
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn acquire(&self) {
        let mut busy = self.flag();
        while *busy {
            busy = self
                .freed
                .wait(busy)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        *busy = true;
    }

    fn release(&self) {
        *self.flag() = false;
        self.freed.notify_one();
    }
}

/// A thread's hold on its rank's slot; dropping it frees the slot.
#[derive(Debug)]
pub(crate) struct Held {
    slot: Arc<ComputeSlot>,
}

impl Drop for Held {
    fn drop(&mut self) {
        HELD.with(|held| *held.borrow_mut() = None);
        self.slot.release();
    }
}

/// Runs `wait` with the calling thread's slot, if it holds one, given up meanwhile (the other
/// half of its pair computes), and holds the slot again before returning.
pub(crate) fn while_waiting<T>(wait: impl FnOnce() -> T) -> T {
    let held = HELD.with(|held| held.borrow().clone());
    match held {
        None => wait(),
        Some(slot) => {
            slot.release();
            HANDED_OVER.with(|handed| handed.set(true));
            let result = wait();
            HANDED_OVER.with(|handed| handed.set(false));
            slot.acquire();
            result
        }
    }
}

/// Whether the calling thread is waiting inside [`while_waiting`] with its slot given to the
/// other half of its pair: a wait that polls should then sleep between polls rather than spin,
/// so as not to take the processor that half computes on (the MPI exchange's does).
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub(crate) fn handed_over() -> bool {
    HANDED_OVER.with(Cell::get)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::mpsc::channel;
    use std::time::Duration;

    #[test]
    fn one_thread_computes_at_a_time_and_a_wait_hands_the_slot_over() {
        let slot = ComputeSlot::new();
        let computing = AtomicU32::new(0);
        let most = AtomicU32::new(0);
        let (tx, rx) = channel::<u32>();
        let compute = || {
            let now = computing.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(20));
            computing.fetch_sub(1, Ordering::SeqCst);
        };
        std::thread::scope(|scope| {
            // The waiter holds the slot first, then waits for a message only the other thread
            // sends once it computes: this finishes only if the wait gives the slot up.
            let _first = slot.hold();
            let sender = scope.spawn(|| {
                let _held = slot.hold();
                compute();
                tx.send(7).unwrap();
                compute();
            });
            compute();
            let got = while_waiting(|| rx.recv().unwrap());
            compute();
            assert_eq!(got, 7);
            drop(_first);
            sender.join().unwrap();
        });
        assert_eq!(most.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_thread_without_a_slot_just_waits() {
        assert_eq!(while_waiting(|| 3), 3);
        assert!(!while_waiting(handed_over));
        let slot = ComputeSlot::new();
        let held = slot.hold();
        assert!(while_waiting(handed_over) && !handed_over());
        drop(held);
        let slot = ComputeSlot::new();
        drop(slot.hold());
        // Free again: a second hold does not block.
        drop(slot.hold());
        assert_eq!(while_waiting(|| 4), 4);
    }
}
