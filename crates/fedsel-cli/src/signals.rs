//! SIGINT (Ctrl-C) and SIGTERM (a scheduler's or `kill`'s stop) end a run between rounds,
//! so that it leaves its `summary.json` as any failed run does; a second signal exits at
//! once, for a run that should not wait for its round.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use signal_hook::SigId;
use signal_hook::consts::{SIGINT, SIGTERM};

/// The handlers of a run in progress; dropping it unregisters them.
pub(crate) struct Stop {
    /// The number of the first signal caught, 0 before one is.
    caught: Arc<AtomicUsize>,
    ids: Vec<SigId>,
}

impl Stop {
    /// Registers the handlers: the first signal is recorded for [`Stop::caught`], a second
    /// one exits with status 128 + its number, as a shell reports a process it killed.
    pub(crate) fn install() -> std::io::Result<Self> {
        let caught = Arc::new(AtomicUsize::new(0));
        let stopping = Arc::new(AtomicBool::new(false));
        let mut ids = Vec::with_capacity(6);
        for signal in [SIGINT, SIGTERM] {
            // Handlers run in the order registered: the exit sees only an earlier signal.
            ids.push(signal_hook::flag::register_conditional_shutdown(
                signal,
                128 + signal,
                Arc::clone(&stopping),
            )?);
            ids.push(signal_hook::flag::register(signal, Arc::clone(&stopping))?);
            let number = usize::try_from(signal).expect("signal numbers are positive");
            ids.push(signal_hook::flag::register_usize(
                signal,
                Arc::clone(&caught),
                number,
            )?);
        }
        Ok(Self { caught, ids })
    }

    /// The signal that asked the run to stop, if one did.
    pub(crate) fn caught(&self) -> Option<i32> {
        match self.caught.load(Ordering::SeqCst) {
            0 => None,
            n => i32::try_from(n).ok(),
        }
    }
}

impl Drop for Stop {
    fn drop(&mut self) {
        for id in self.ids.drain(..) {
            signal_hook::low_level::unregister(id);
        }
    }
}

/// A signal's name for messages.
pub(crate) fn name(signal: i32) -> String {
    match signal {
        SIGINT => "SIGINT".into(),
        SIGTERM => "SIGTERM".into(),
        n => format!("signal {n}"),
    }
}
