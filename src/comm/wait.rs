//! Waiting for a peer's progress: a [`Signal`] is one rank's progress flag with its doorbell,
//! and [`Signal::wait_for`] the one way any rank waits on it.
//!
//! # Contract
//!
//! * **What it waits for.** A signal holds a `u64` that only grows ([`Signal::raise`] is
//!   called by its one owner with ever larger values). `wait_for(target, ..)` returns `Ok`
//!   once the value is at least `target`, or once the owner has departed having raised it
//!   that far (a raise just before leaving counts).
//! * **Memory ordering.** The owner raises with `SeqCst` (which includes `Release`) after
//!   writing whatever the value announces; the waiter's successful load is `Acquire` (or
//!   `SeqCst`), so everything the owner wrote before raising is visible to the waiter once
//!   `wait_for` returns `Ok`.
//! * **How it waits.** With a core per waiter (`oversubscribed == false`) it spins for
//!   [`SPIN`]; then it yields its core until [`YIELD`] has passed (what MPI's
//!   `mpi_yield_when_idle` does; with more waiters than cores the owner may need this core);
//!   then it sleeps on the doorbell, 1 ms at a time, woken early by the owner's next raise
//!   or by [`Signal::wake`]. The sleeper count makes a raise with nobody asleep cost no lock.
//! * **Abort.** Every round checks the `aborted` flag given (SeqCst) and returns
//!   [`WaitEnd::Aborted`] once it is set; whoever sets it must [`Signal::wake`] every
//!   signal so that no sleeper waits out its millisecond.
//! * **Departure.** Every round checks the owner's `departed` flag (SeqCst): set with the
//!   target not reached, the wait ends with [`WaitEnd::Departed`].
//! * **Timeout, and the patience clock.** The time limit is counted by a
//!   [`Patience`]: time this process was stopped (a gap of over
//!   [`PAUSE_GAP`](super::patience::PAUSE_GAP) between two rounds) is left out, so a
//!   `kill -STOP` of the whole process does not time out its waits. Past the limit the wait
//!   ends with [`WaitEnd::TimedOut`], carrying the time counted. The clock starts on the
//!   first round that does not find the target reached.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::patience::Patience;

/// How long a waiter spins (when every waiter has a core) before yielding its core.
pub const SPIN: Duration = Duration::from_micros(20);
/// How long a waiter yields before it sleeps on the doorbell.
pub const YIELD: Duration = Duration::from_millis(1);
/// The longest one sleep on the doorbell lasts before the waiter checks again.
const NAP: Duration = Duration::from_millis(1);

/// A value alone on its cache lines (two, for the adjacent-line prefetcher).
#[repr(align(128))]
struct Padded<T>(T);

/// Why a wait ended without its target reached.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum WaitEnd {
    /// The `aborted` flag was set.
    Aborted,
    /// The signal's owner departed before raising it to the target.
    Departed,
    /// The patience ran out after this much counted time.
    TimedOut(Duration),
}

/// One rank's progress flag (a growing `u64`) and the doorbell its waiters sleep on.
pub struct Signal {
    value: Padded<AtomicU64>,
    sleepers: Padded<AtomicUsize>,
    bell: (Mutex<()>, Condvar),
}

impl Default for Signal {
    fn default() -> Self {
        Signal {
            value: Padded(AtomicU64::new(0)),
            sleepers: Padded(AtomicUsize::new(0)),
            bell: (Mutex::new(()), Condvar::new()),
        }
    }
}

impl Signal {
    /// Sets the value to `value` (never less than before: only the owner raises) and rings
    /// the doorbell for any sleeper.
    pub fn raise(&self, value: u64) {
        self.value.0.store(value, Ordering::SeqCst);
        self.ring();
    }

    /// Wakes the sleepers, if there are any (no lock otherwise).
    pub fn ring(&self) {
        if self.sleepers.0.load(Ordering::SeqCst) > 0 {
            self.wake();
        }
    }

    /// Wakes every sleeper unconditionally (after setting an abort flag they must see).
    pub fn wake(&self) {
        let _guard = self.bell.0.lock().unwrap_or_else(PoisonError::into_inner);
        self.bell.1.notify_all();
    }

    /// Waits until the value reaches `target` (see the module's contract), watching
    /// `aborted` and the owner's `departed`, for at most `timeout` of patience.
    pub fn wait_for(
        &self,
        target: u64,
        aborted: &AtomicBool,
        departed: &AtomicBool,
        timeout: Duration,
        oversubscribed: bool,
    ) -> Result<(), WaitEnd> {
        let value = &self.value.0;
        if value.load(Ordering::Acquire) >= target {
            return Ok(());
        }
        let start = Instant::now();
        let mut patience = Patience::new(timeout);
        loop {
            if value.load(Ordering::Acquire) >= target {
                return Ok(());
            }
            if aborted.load(Ordering::SeqCst) {
                return Err(WaitEnd::Aborted);
            }
            if departed.load(Ordering::SeqCst) {
                // It may have raised the value just before leaving.
                if value.load(Ordering::SeqCst) >= target {
                    return Ok(());
                }
                return Err(WaitEnd::Departed);
            }
            if patience.expired() {
                return Err(WaitEnd::TimedOut(patience.waited()));
            }
            let waited = start.elapsed();
            if waited < SPIN && !oversubscribed {
                std::hint::spin_loop();
            } else if waited < YIELD {
                std::thread::yield_now();
            } else {
                self.sleepers.0.fetch_add(1, Ordering::SeqCst);
                let guard = self.bell.0.lock().unwrap_or_else(PoisonError::into_inner);
                if value.load(Ordering::SeqCst) < target
                    && !aborted.load(Ordering::SeqCst)
                    && !departed.load(Ordering::SeqCst)
                {
                    let _ = self
                        .bell
                        .1
                        .wait_timeout(guard, NAP)
                        .unwrap_or_else(PoisonError::into_inner);
                }
                self.sleepers.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }
}
