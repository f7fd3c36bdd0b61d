//! The signals that end a run early: with `enable_autocheckpoint`, SIGTERM (preemption) ends it
//! after the current step with a checkpoint of it; SIGINT ends it after the current step (a
//! second SIGINT exits at once).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{anyhow, Result};

/// SIGTERM (with `enable_autocheckpoint`) and SIGINT, noted by flags the loop checks after each
/// step; the handlers are removed when the run ends.
pub(super) struct Signals {
    terminate: Arc<AtomicBool>,
    interrupt: Arc<AtomicBool>,
    ids: Vec<signal_hook::SigId>,
}

impl Signals {
    pub fn install(autocheckpoint: bool) -> Result<Signals> {
        use signal_hook::consts::{SIGINT, SIGTERM};
        use signal_hook::flag;
        let terminate = Arc::new(AtomicBool::new(false));
        let interrupt = Arc::new(AtomicBool::new(false));
        let mut ids = Vec::new();
        let fail = |e: std::io::Error| anyhow!("cannot install a signal handler: {e}");
        // A second SIGINT exits at once (130 = 128 + SIGINT), as an impatient user expects.
        ids.push(flag::register_conditional_shutdown(SIGINT, 130, interrupt.clone()).map_err(fail)?);
        ids.push(flag::register(SIGINT, interrupt.clone()).map_err(fail)?);
        if autocheckpoint {
            ids.push(flag::register(SIGTERM, terminate.clone()).map_err(fail)?);
        }
        Ok(Signals { terminate, interrupt, ids })
    }

    /// The signal seen so far, SIGTERM first.
    pub fn stop_requested(&self) -> Option<&'static str> {
        if self.terminate.load(Ordering::Relaxed) {
            Some("SIGTERM")
        } else if self.interrupt.load(Ordering::Relaxed) {
            Some("SIGINT")
        } else {
            None
        }
    }
}

impl Drop for Signals {
    fn drop(&mut self) {
        for id in self.ids.drain(..) {
            signal_hook::low_level::unregister(id);
        }
    }
}
