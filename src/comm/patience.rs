//! How long a collective has waited for a peer, not counting the time this process was not
//! running.
//!
//! A timeout exists to turn a peer that will never come (a hung kernel, a rank stuck in
//! user code, an MPI process gone quiet) into an error instead of a hang. Wall-clock time
//! also counts time in which nobody could have made progress: `kill -STOP` and `fg`, Ctrl-Z,
//! a paused VM, a laptop lid, or a machine so loaded that the waiting thread itself was not
//! scheduled. When every rank lives in one process they all stop together, and on waking
//! every waiter would see the whole pause as its peer's delay and abort a healthy run.
//!
//! A waiter checks its peer at least every few milliseconds, so a long gap between two
//! consecutive checks means this thread was not running: [`Patience`] leaves such gaps out.
//! A peer in another process that stops while this one runs is still timed in full.

use std::time::{Duration, Instant};

/// A gap between two checks longer than this is taken as this process not running and is
/// not counted. Waiters check at least every few milliseconds (they sleep 1 ms at a time),
/// so a healthy wait never comes near it.
pub const PAUSE_GAP: Duration = Duration::from_millis(500);

/// A timeout that counts only the time this thread was observably running.
#[derive(Debug, Clone, Copy)]
pub struct Patience {
    limit: Duration,
    counted: Duration,
    last: Instant,
}

impl Patience {
    /// Starts counting now, up to `limit`.
    pub fn new(limit: Duration) -> Self {
        Self::since(limit, Instant::now())
    }

    /// Starts counting at `start` (the tests' clock).
    fn since(limit: Duration, start: Instant) -> Self {
        Patience {
            limit,
            counted: Duration::ZERO,
            last: start,
        }
    }

    /// Time counted so far, this check included (a gap longer than [`PAUSE_GAP`] since the
    /// previous check is left out).
    pub fn waited(&mut self) -> Duration {
        self.waited_at(Instant::now())
    }

    /// [`Patience::waited`], checked at `now`.
    fn waited_at(&mut self, now: Instant) -> Duration {
        let gap = now.saturating_duration_since(self.last);
        if gap <= PAUSE_GAP {
            self.counted += gap;
        }
        self.last = now;
        self.counted
    }

    /// Whether the counted time has passed the limit.
    pub fn expired(&mut self) -> bool {
        self.expired_at(Instant::now())
    }

    /// [`Patience::expired`], checked at `now`.
    fn expired_at(&mut self, now: Instant) -> bool {
        self.waited_at(now) > self.limit
    }

    /// Time left before the limit, as counted now.
    pub fn left(&mut self) -> Duration {
        self.limit.saturating_sub(self.waited())
    }
}

/// Wall-clock time since its start that leaves out the time the whole process was stopped,
/// as [`Patience`] does, for a rate over work that waits on nothing (an epoch's images/s):
/// a thread of its own ticks every few milliseconds and counts each gap up to
/// [`PAUSE_GAP`]; a longer one, the process stopped, is left out. The thread ends with the
/// clock.
pub struct RunningClock {
    shared: std::sync::Arc<Ticks>,
    ticker: Option<std::thread::JoinHandle<()>>,
}

/// What the ticker and the readers share: the time counted up to the last tick, that tick,
/// and whether to stop.
struct Ticks {
    counted: std::sync::Mutex<(Duration, Instant)>,
    stop: std::sync::atomic::AtomicBool,
}

/// How often a [`RunningClock`] ticks.
const TICK: Duration = Duration::from_millis(5);

impl RunningClock {
    /// Starts counting now.
    pub fn start() -> Self {
        let shared = std::sync::Arc::new(Ticks {
            counted: std::sync::Mutex::new((Duration::ZERO, Instant::now())),
            stop: std::sync::atomic::AtomicBool::new(false),
        });
        let ticks = shared.clone();
        let ticker = std::thread::Builder::new()
            .name("running-clock".into())
            .spawn(move || {
                while !ticks.stop.load(std::sync::atomic::Ordering::Relaxed) {
                    std::thread::sleep(TICK);
                    if let Ok(mut c) = ticks.counted.lock() {
                        *c = counted_to(*c, Instant::now());
                    }
                }
            })
            .ok();
        RunningClock { shared, ticker }
    }

    /// Seconds counted so far (all of the wall clock where the ticker could not start).
    pub fn seconds(&self) -> f64 {
        let now = Instant::now();
        let counted = match self.shared.counted.lock() {
            Ok(c) if self.ticker.is_some() => counted_to(*c, now).0,
            Ok(c) => c.1.elapsed() + c.0,
            Err(_) => Duration::ZERO,
        };
        counted.as_secs_f64()
    }
}

/// `(counted, last)` moved on to `now`: the gap counted unless it is longer than
/// [`PAUSE_GAP`].
fn counted_to((counted, last): (Duration, Instant), now: Instant) -> (Duration, Instant) {
    let gap = now.saturating_duration_since(last);
    (
        if gap <= PAUSE_GAP {
            counted + gap
        } else {
            counted
        },
        now,
    )
}

impl Drop for RunningClock {
    fn drop(&mut self) {
        self.shared
            .stop
            .store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.ticker.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // On a clock of its own (instants the test makes), so the verdict does not depend on how
    // promptly a loaded machine wakes a sleeping thread.
    #[test]
    fn counts_frequent_checks_and_leaves_out_a_pause() {
        let ms = Duration::from_millis;
        let mut now = Instant::now();
        let mut p = Patience::since(ms(300), now);
        for _ in 0..20 {
            now += ms(5);
            assert!(!p.expired_at(now));
        }
        assert_eq!(p.waited_at(now), ms(100));
        // A gap longer than PAUSE_GAP: this thread "was stopped"; not counted.
        now += PAUSE_GAP + ms(100);
        assert!(
            !p.expired_at(now),
            "the pause counted: {:?}",
            p.waited_at(now)
        );
        assert_eq!(p.waited_at(now), ms(100));
        // A gap of exactly PAUSE_GAP still counts (a slow check, not a pause).
        now += PAUSE_GAP;
        assert_eq!(p.waited_at(now), ms(600));
        assert!(p.expired_at(now));
        // Checking on keeps counting past the limit.
        now += ms(5);
        assert_eq!(p.waited_at(now), ms(605));
    }

    #[test]
    fn a_running_clock_counts_gaps_up_to_a_pause() {
        let ms = Duration::from_millis;
        let t0 = Instant::now();
        let c = counted_to((Duration::ZERO, t0), t0 + ms(5));
        assert_eq!(c.0, ms(5));
        let c = counted_to(c, t0 + ms(5) + PAUSE_GAP + ms(1));
        assert_eq!(c.0, ms(5), "a pause is left out");
        // The real clock counts, and never more than the wall clock (a loaded machine may
        // leave its ticker unscheduled past PAUSE_GAP, which then counts as a pause).
        let wall = Instant::now();
        let clock = RunningClock::start();
        std::thread::sleep(ms(50));
        let s = clock.seconds();
        assert!(s > 0.0 && s <= wall.elapsed().as_secs_f64(), "{s}");
    }

    #[test]
    fn the_real_clock_counts_from_now() {
        let mut p = Patience::new(Duration::from_secs(3600));
        assert!(p.left() > Duration::from_secs(3500));
        assert!(!p.expired());
    }
}
