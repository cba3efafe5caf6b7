//! Stopping a run by signal: SIGINT and SIGTERM finish the current step and
//! write everything (a checkpoint included); a second one exits at once.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use anyhow::Context;

/// A run stopped by SIGINT or SIGTERM after a whole step; the process exits
/// with 128 + the signal number, as a shell reports a killed command.
#[derive(Debug)]
pub struct Stopped {
    /// The signal (2: SIGINT, 15: SIGTERM).
    pub signal: i32,
    /// The last step completed (0 in the test pass after a fit).
    pub step: usize,
    /// Its epoch.
    pub epoch: usize,
    /// The phase before training it came in (`reading the data`), when it did.
    pub during: Option<&'static str>,
    /// The run folder to `--resume`, when it holds a checkpoint.
    pub resume: Option<PathBuf>,
    /// The stop's own checkpoint: written, or why not; `None` where the
    /// stop wrote none (a stop during the test pass).
    pub checkpoint: Option<Result<(), String>>,
}

impl std::fmt::Display for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self.signal {
            signal_hook::consts::SIGINT => "SIGINT",
            signal_hook::consts::SIGTERM => "SIGTERM",
            _ => "a signal",
        };
        if let Some(phase) = self.during {
            return write!(
                f,
                "interrupted by {name} while {phase}: stopped before training; no run folder \
                 was made and --save was not written"
            );
        }
        write!(
            f,
            "interrupted by {name} after step {} (epoch {}): the run folder has its records, \
             summary and report; --save was not written",
            self.step, self.epoch
        )?;
        if let Some(Err(why)) = &self.checkpoint {
            write!(f, "\nThe stop's checkpoint could not be written: {why}")?;
        }
        let Some(dir) = &self.resume else {
            return Ok(());
        };
        let which = match &self.checkpoint {
            Some(Ok(())) => "A checkpoint was written",
            // The steps after the newest one run again.
            Some(Err(_)) => "An earlier checkpoint is kept",
            None => "The run has a checkpoint from before the stop",
        };
        write!(
            f,
            "\n{which}: continue with `redline train --resume {}`",
            dir.display()
        )
    }
}

impl std::error::Error for Stopped {}

/// The flag the training loop polls, set by SIGINT or SIGTERM, and which one.
pub struct StopFlags {
    /// Set by the first signal; the loop polls it.
    pub flag: Arc<AtomicBool>,
    /// Which signal came.
    pub signal: Arc<AtomicUsize>,
}

impl StopFlags {
    /// The stop of a run that a signal ended `during` a phase before training.
    pub fn stopped(&self, during: &'static str) -> anyhow::Error {
        anyhow::Error::new(Stopped {
            signal: self.signal.load(Ordering::Relaxed) as i32,
            step: 0,
            epoch: 0,
            during: Some(during),
            resume: None,
            checkpoint: None,
        })
    }

    /// `Err` once a signal came, at the end of a phase before training.
    pub fn check(&self, during: &'static str) -> anyhow::Result<()> {
        match self.flag.load(Ordering::Relaxed) {
            true => Err(self.stopped(during)),
            false => Ok(()),
        }
    }
}

/// Turns the first SIGINT/SIGTERM into a graceful stop (the current step
/// finishes, everything is written); a second one exits at once.
pub fn stop_on_signals() -> anyhow::Result<StopFlags> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let flags = StopFlags {
        flag: Arc::new(AtomicBool::new(false)),
        signal: Arc::new(AtomicUsize::new(0)),
    };
    for sig in [SIGINT, SIGTERM] {
        // Registered first, so it sees the flag as the previous signal left it.
        signal_hook::flag::register_conditional_shutdown(sig, 128 + sig, Arc::clone(&flags.flag))
            .context("installing the signal handlers")?;
        signal_hook::flag::register(sig, Arc::clone(&flags.flag))?;
        signal_hook::flag::register_usize(sig, Arc::clone(&flags.signal), sig as usize)?;
    }
    Ok(flags)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stopped(resume: bool, checkpoint: Option<Result<(), String>>) -> String {
        Stopped {
            signal: signal_hook::consts::SIGTERM,
            step: 7,
            epoch: 1,
            during: None,
            resume: resume.then(|| PathBuf::from("runs/r")),
            checkpoint,
        }
        .to_string()
    }

    /// The message claims a checkpoint only where one was written, and says
    /// why the stop's own failed.
    #[test]
    fn the_stop_message_says_which_checkpoint_there_is() {
        let written = stopped(true, Some(Ok(())));
        assert!(
            written.contains(
                "A checkpoint was written: continue with `redline train --resume runs/r`"
            ),
            "{written}"
        );
        let failed = stopped(true, Some(Err("No space left on device".into())));
        assert!(
            failed.contains("could not be written: No space left on device"),
            "{failed}"
        );
        assert!(
            failed.contains("An earlier checkpoint is kept: continue with"),
            "{failed}"
        );
        assert!(!failed.contains("A checkpoint was written"), "{failed}");
        let none_left = stopped(false, Some(Err("disk full".into())));
        assert!(
            none_left.contains("could not be written: disk full"),
            "{none_left}"
        );
        assert!(!none_left.contains("--resume"), "{none_left}");
        let before = stopped(true, None);
        assert!(
            before.contains("from before the stop: continue with"),
            "{before}"
        );
        assert!(!stopped(false, None).contains("checkpoint"));
    }
}
