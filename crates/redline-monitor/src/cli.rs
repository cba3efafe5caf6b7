//! `redline monitor`: print the machine's state once or at an interval.
//!
//! The binary parses flags into [`MonitorOptions`] and calls [`run`]; this
//! module does the sampling loop and the output (table, JSON lines, CSV).
//! Sampling happens on the calling thread: the loop sleeps to a fixed grid of
//! ticks, so a slow terminal does not make the interval drift.

use std::io::{ErrorKind, IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::csv::CsvLog;
use crate::error::{Error, Result};
use crate::host::CPU_WINDOW;
use crate::sample::Monitor;
use crate::view::render;

/// Moves the cursor home and clears the screen (ANSI), for redrawing in place.
const CLEAR: &str = "\x1b[H\x1b[2J";

/// What `redline monitor` should do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MonitorOptions {
    /// Time between samples (`--interval`). CPU figures need at least
    /// [`crate::CPU_WINDOW`]; shorter intervals repeat the last CPU reading.
    pub interval: Duration,
    /// Print one snapshot and exit (`--once`); overrides `count`.
    pub once: bool,
    /// One JSON object per sample instead of the table (`--json`).
    pub json: bool,
    /// Also append one CSV row per sample to this file (`--csv FILE`).
    pub csv: Option<PathBuf>,
    /// Stop after this many samples (`--count N`); `None` runs until interrupted.
    pub count: Option<usize>,
}

impl Default for MonitorOptions {
    /// One table a second, forever, like `nvidia-smi -l 1`.
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(1),
            once: false,
            json: false,
            csv: None,
            count: None,
        }
    }
}

/// Samples and prints until `count` (or one, with `once`) samples are out, or
/// forever. The first sample comes after [`crate::CPU_WINDOW`] (two host
/// readings that far apart make the CPU figures real). A closed stdout
/// (`redline monitor --json | head -1`) ends the run successfully.
///
/// # Errors
/// A zero interval or count, a CSV file that cannot be created or written or
/// has another machine's header, or a failing stdout.
pub fn run(opts: &MonitorOptions) -> Result<()> {
    let redraw = !opts.once && !opts.json && std::io::stdout().is_terminal();
    write_samples(opts, &mut std::io::stdout().lock(), redraw)
}

/// As [`run`], writing to `out` instead of stdout and never clearing the screen.
///
/// # Errors
/// As [`run`]; a failing `out` is [`Error::Output`].
pub fn run_to(opts: &MonitorOptions, out: &mut dyn Write) -> Result<()> {
    write_samples(opts, out, false)
}

fn write_samples(opts: &MonitorOptions, out: &mut dyn Write, redraw: bool) -> Result<()> {
    validate(opts)?;
    let mut monitor = Monitor::new();
    let gpu_count = monitor.gpus().map_or(0, |g| g.count() as usize);
    let mut csv = match &opts.csv {
        Some(path) => Some(CsvLog::open(path, gpu_count)?),
        None => None,
    };
    let driver = monitor.driver_summary();
    let total = if opts.once { Some(1) } else { opts.count };

    let mut next = Instant::now() + CPU_WINDOW;
    let mut taken = 0usize;
    loop {
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
        let sample = monitor.sample();
        if let Some(csv) = csv.as_mut() {
            csv.append(&sample)?;
        }
        let text = if opts.json {
            serde_json::to_string(&sample).map_err(Error::Json)? + "\n"
        } else if redraw {
            format!("{CLEAR}{}", render(&sample, driver.as_deref()))
        } else if taken > 0 {
            format!("\n{}", render(&sample, driver.as_deref()))
        } else {
            render(&sample, driver.as_deref())
        };
        match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::BrokenPipe => return Ok(()),
            Err(e) => return Err(Error::Output(e)),
        }
        taken += 1;
        if total.is_some_and(|n| taken >= n) {
            return Ok(());
        }
        next += opts.interval;
        let now = Instant::now();
        if next < now {
            next = now + opts.interval;
        }
    }
}

fn validate(opts: &MonitorOptions) -> Result<()> {
    if opts.interval.is_zero() {
        return Err(Error::Options(
            "--interval 0: the interval must be longer than zero\nHINT: pass e.g. --interval 1s"
                .into(),
        ));
    }
    if opts.count == Some(0) && !opts.once {
        return Err(Error::Options(
            "--count 0: nothing to sample\n\
             HINT: pass --count 1 or more, or leave it out to run until Ctrl-C"
                .into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer that always fails with `kind`.
    struct Failing(ErrorKind);

    impl Write for Failing {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(self.0.into())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_closed_pipe_ends_the_run_and_other_write_errors_are_reported() {
        let forever = MonitorOptions {
            interval: Duration::from_millis(10),
            ..MonitorOptions::default()
        };
        run_to(&forever, &mut Failing(ErrorKind::BrokenPipe)).unwrap();
        let err = run_to(&forever, &mut Failing(ErrorKind::StorageFull)).unwrap_err();
        assert!(matches!(err, Error::Output(_)), "{err}");
    }

    #[test]
    fn zero_interval_and_zero_count_are_refused_with_a_hint() {
        let zero = MonitorOptions {
            interval: Duration::ZERO,
            ..MonitorOptions::default()
        };
        let err = run(&zero).unwrap_err().to_string();
        assert!(
            err.starts_with("--interval 0") && err.contains("HINT:"),
            "{err}"
        );
        let none = MonitorOptions {
            count: Some(0),
            ..MonitorOptions::default()
        };
        let err = run(&none).unwrap_err().to_string();
        assert!(
            err.starts_with("--count 0") && err.contains("HINT:"),
            "{err}"
        );
    }
}
