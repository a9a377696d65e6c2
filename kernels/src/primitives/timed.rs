//! [`TimedPrimitives`]: any [`Primitives`] with the time spent in each op summed by name: the
//! profile of a step by primitive, for `cargo bench --bench kernels`. Its [`Primitives`] impl is
//! generated with the trait's declaration, from the one list of the ops (see `mod.rs`).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::Primitives;

/// Another implementation's ops, each call timed and summed under the op's name.
#[derive(Debug)]
pub struct TimedPrimitives<P> {
    /// The timed implementation (its [`Primitives`] impl is declared with the trait).
    pub(super) inner: P,
    spent: Mutex<BTreeMap<&'static str, (Duration, u64)>>,
}

impl<P: Primitives> TimedPrimitives<P> {
    /// `inner`'s ops, timed.
    pub fn new(inner: P) -> Self {
        TimedPrimitives {
            inner,
            spent: Mutex::new(BTreeMap::new()),
        }
    }

    /// Per op: the time spent in it and the number of calls, since the last [`Self::take`].
    pub fn take(&self) -> BTreeMap<&'static str, (Duration, u64)> {
        self.spent
            .lock()
            .map(|mut m| std::mem::take(&mut *m))
            .unwrap_or_default()
    }

    /// Runs `call`, adding its time to `op`'s.
    pub(super) fn timed<T>(&self, op: &'static str, call: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let out = call();
        if let Ok(mut m) = self.spent.lock() {
            let entry = m.entry(op).or_default();
            entry.0 += start.elapsed();
            entry.1 += 1;
        }
        out
    }
}
