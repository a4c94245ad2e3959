//! Where the state engine's time goes, phase by phase (`benchmarks/engine_phases.py`). The phases are inlined
//! into one another, so a sampling profiler gives most of their time to the loop that calls them; a clock read
//! at each phase's end does not. Compiled in only with the `phase-times` feature, a build of its own: reading
//! the clock twenty times a change costs a few percent. Without it every call here is empty and compiles away.

/// A stretch of the engine's work. Phases nest: the sum of the `Partition*` ones is the threads' time, and each
/// of the others is part of the one listed before it with fewer leading words (the events of a TTL sweep count in
/// `Events*` and `PartitionMerge`, not in `MergeEvents`).
#[derive(Clone, Copy)]
pub enum Phase {
    /// a partition's records read from the cell log, replica copies dropped
    PartitionRecords,
    /// its stored state decoded from the stored records
    PartitionStored,
    /// its state merged with its records, and its events written
    PartitionMerge,
    /// the visible rows before and after each change (`partition_images`)
    MergeImages,
    /// the records applied to the state
    MergeApply,
    /// one event per changed row (`Emitter::diff`)
    MergeEvents,
    /// the Python reprs an event id hashes
    EventsIdText,
    /// SHA-256 of them
    EventsIdHash,
    /// the event's JSON envelope
    EventsJson,
    /// the event's key JSON
    EventsKey,
    /// its state rows (`change_rows`)
    PartitionStateRows,
    /// a partition's batch begun and ended: what its stored state holds kept aside (its rows' keys), whether the
    /// batch changed it (no copy of the stored state since e807c7b's round: the phase's name kept for the figures)
    PartitionCopies,
}

pub const PHASES: usize = 12;

/// Each phase's name, as `benchmarks/engine_phases.py` prints it.
pub const NAMES: [&str; PHASES] = [
    "partition: records", "partition: stored state", "partition: merge and events", "merge: images",
    "merge: apply", "merge: events", "events: id text", "events: id hash", "events: JSON", "events: key JSON",
    "partition: state rows", "partition: copies",
];

#[cfg(feature = "phase-times")]
mod timed {
    use super::{Phase, PHASES};
    use std::cell::Cell;
    use std::sync::Mutex;

    thread_local! {
        static HERE: Cell<[u64; PHASES]> = const { Cell::new([0; PHASES]) };
    }
    static TOTAL: Mutex<[u64; PHASES]> = Mutex::new([0; PHASES]);

    /// Ticks: the time-stamp counter where there is one (a few nanoseconds a read), nanoseconds elsewhere.
    #[inline(always)]
    fn ticks() -> u64 {
        #[cfg(target_arch = "x86_64")]
        {
            // SAFETY: RDTSC exists on every x86-64 processor
            unsafe { core::arch::x86_64::_rdtsc() }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            use std::sync::OnceLock;
            static START: OnceLock<std::time::Instant> = OnceLock::new();
            START.get_or_init(std::time::Instant::now).elapsed().as_nanos() as u64
        }
    }

    /// A clock that adds the time since it started, or since its last lap, to a phase.
    pub struct Clock(u64);

    impl Clock {
        #[inline(always)]
        pub fn start() -> Clock {
            Clock(ticks())
        }

        #[inline(always)]
        pub fn lap(&mut self, p: Phase) {
            let now = ticks();
            HERE.with(|h| {
                let mut t = h.get();
                t[p as usize] += now - self.0;
                h.set(t);
            });
            self.0 = now;
        }
    }

    /// Add this thread's times to the process's (at the end of a run of partitions).
    pub fn flush() {
        let mine = HERE.with(|h| h.replace([0; PHASES]));
        let mut total = TOTAL.lock().unwrap_or_else(|e| e.into_inner());
        for (t, m) in total.iter_mut().zip(mine) {
            *t += m;
        }
    }

    /// The ticks of each phase since the last call.
    pub fn take() -> Option<[u64; PHASES]> {
        Some(std::mem::replace(&mut *TOTAL.lock().unwrap_or_else(|e| e.into_inner()), [0; PHASES]))
    }
}

#[cfg(not(feature = "phase-times"))]
mod timed {
    use super::{Phase, PHASES};

    pub struct Clock;

    impl Clock {
        #[inline(always)]
        pub fn start() -> Clock {
            Clock
        }

        #[inline(always)]
        pub fn lap(&mut self, _: Phase) {}
    }

    #[inline(always)]
    pub fn flush() {}

    /// None: this build times no phase.
    pub fn take() -> Option<[u64; PHASES]> {
        None
    }
}

pub use timed::{flush, take, Clock};
