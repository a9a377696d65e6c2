//! Precise waiting: emulated kernels that last what the cost model says, and polling loops that
//! notice a message within microseconds. Linux lets a sleeping thread wake up to 50 us late by
//! default (its timer slack); the threads that wait here ask for 1 ns instead.

use std::time::{Duration, Instant};

/// The last stretch of a delay, spent polling the clock rather than sleeping: a sleep may end tens
/// of microseconds late (measured on a 2-core VM: 1 ms sleeps ended 33-45 us late on average, a
/// few in a hundred over 100 us, even with a 1 ns timer slack). The poll yields the processor
/// between looks: ranks in step end their kernels together, and eight ranks spinning on two cores
/// without yielding made each kernel end 55 us late on average, against 10 us when yielding.
const FINAL_STRETCH: Duration = Duration::from_micros(150);

/// Spends the time until `deadline` as an emulated kernel would: close to exactly. The thread's
/// timer slack is set to its minimum first (Linux lets a sleep end up to 50 us late by default,
/// 5% of a 1 ms op), then it sleeps until shortly before the deadline and looks at the clock for
/// the last stretch, yielding the processor between looks.
pub fn sleep_until(deadline: Instant) {
    precise_timers();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        if left > FINAL_STRETCH {
            std::thread::sleep(left - FINAL_STRETCH);
        } else {
            std::thread::yield_now();
        }
    }
}

/// Sets this thread's timer slack to 1 ns, once (Linux; elsewhere nothing to do).
pub fn precise_timers() {
    #[cfg(target_os = "linux")]
    {
        thread_local! {
            static SET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
        }
        SET.with(|set| {
            if !set.replace(true) {
                // SAFETY: PR_SET_TIMERSLACK takes one integer argument and changes only the
                // calling thread's timer slack; it touches no memory of ours. A failure leaves
                // the default slack, which only makes delays less precise.
                unsafe {
                    libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0);
                }
            }
        });
    }
}
