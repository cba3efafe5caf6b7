//! The progress bar: an observer of training events (indicatif), hidden when
//! stdout is not a terminal.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use redline_train::{Callback, Event};

/// Shows epoch, step, loss, samples/s and ETA.
pub struct Progress {
    bar: ProgressBar,
    epochs: usize,
}

impl Progress {
    /// A bar drawn only when stdout is a terminal.
    pub fn new() -> Self {
        let bar = ProgressBar::hidden();
        if std::io::stdout().is_terminal() {
            bar.set_draw_target(ProgressDrawTarget::stderr());
        }
        Self { bar, epochs: 0 }
    }
}

impl Callback for Progress {
    fn name(&self) -> &str {
        "progress"
    }

    fn on_event(&mut self, event: &Event<'_>) -> Result<(), String> {
        match event {
            Event::FitStart {
                epochs,
                total_steps,
                ..
            } => {
                self.epochs = *epochs;
                self.bar.set_length(*total_steps as u64);
                let style = ProgressStyle::with_template(
                    "{prefix} [{bar:30}] {pos}/{len} steps {msg} ETA {eta}",
                )
                .map_err(|e| e.to_string())?
                .progress_chars("=> ");
                self.bar.set_style(style);
            }
            Event::EpochStart { epoch } => self
                .bar
                .set_prefix(format!("epoch {epoch}/{}", self.epochs)),
            Event::StepEnd { .. } => self.bar.inc(1),
            Event::Log(s) => self.bar.set_message(format!(
                "loss {:.4} {:.0} samples/s",
                s.loss, s.samples_per_s
            )),
            Event::ValidationStart { epoch } => self
                .bar
                .set_prefix(format!("epoch {epoch}/{} (validating)", self.epochs)),
            Event::EpochEnd(_) | Event::Test(_) => {}
            Event::FitEnd(_) => self.bar.finish_and_clear(),
        }
        Ok(())
    }
}
