//! `redline`: the command-line entry point. Parse, resolve, dispatch; this is
//! the only place that turns errors into output and exit codes.

// No function here longer than `clippy.toml`'s 120 lines: a command is a
// short coordinator of named stages (shared/STYLE.md, issue 47), and CI's
// `-D warnings` makes a longer one fail the build.
#![warn(clippy::too_many_lines)]

mod auto_device;
mod auto_flag;
mod cli;
mod data_flags;
mod dist;
mod evaluate;
mod export;
mod gpt_job;
mod pack;
mod peak;
mod plan;
mod predict;
mod print_config;
mod progress;
mod resume;
mod run_shape;
mod sample;
mod short_runs;
mod signals;
mod spawn;
mod step_kind;
mod summary;
mod train;
mod tune;
mod tune_workers;

#[cfg(test)]
mod hostile_tests;

use std::process::ExitCode;

/// Large blocks kept for the next step, with huge pages
/// (`redline_core::host_alloc`).
#[global_allocator]
static ALLOC: redline_core::host_alloc::HostAlloc = redline_core::host_alloc::HostAlloc;

use clap::Parser;

/// Runs one subcommand.
fn dispatch(command: cli::Command) -> anyhow::Result<()> {
    match command {
        cli::Command::Train(t) => train::run(&t),
        cli::Command::Devices(d) => cli::devices(&d),
        cli::Command::Monitor(m) => cli::monitor(&m),
        cli::Command::Report(r) => cli::report(&r),
        cli::Command::Runs(r) => cli::runs(&r),
        cli::Command::Tune(t) => tune::run(&t),
        cli::Command::Test(t) => evaluate::run(&t),
        cli::Command::Predict(p) => predict::run(&p),
        cli::Command::Pack(p) => pack::run(&p),
        cli::Command::Sample(s) => sample::run(&s),
        cli::Command::Export(e) => export::run(&e),
    }
}

fn main() -> ExitCode {
    // Freed activations stay in the process for the next step (glibc).
    redline_core::host_alloc::reuse_freed_memory();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("REDLINE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
    let result = cli::expand_config(std::env::args_os().collect()).and_then(|(argv, config)| {
        match cli::Cli::try_parse_from(argv) {
            Ok(args) => dispatch(args.command).map_err(|e| config.annotate(e)),
            Err(e) => match (cli::config_key_of(&e, &config), &config.file) {
                // A bad value read from a --config file: say which file and key.
                (Some(key), Some(file)) => {
                    eprint!("{}", e.render());
                    eprintln!(
                        "  in --config {}: the key `{key}`\nHINT: fix or remove `{key}` in that \
                         file, or pass --{key} on the command line to override it",
                        file.display()
                    );
                    std::process::exit(2)
                }
                _ => e.exit(),
            },
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // A closed pipe (`redline ... | head`) is not a failure.
            if err.chain().any(|c| {
                c.downcast_ref::<std::io::Error>()
                    .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
            }) {
                return ExitCode::SUCCESS;
            }
            // A signal's graceful stop: the shell's exit code for it (130, 143).
            if let Some(stopped) = err.downcast_ref::<signals::Stopped>() {
                eprintln!("{stopped}");
                return ExitCode::from(u8::try_from(128 + stopped.signal).unwrap_or(1));
            }
            // One write: data-parallel ranks share the terminal, and a
            // message written in pieces interleaves with another rank's.
            let mut msg = format!("error: {err}\n");
            for cause in err.chain().skip(1) {
                msg.push_str(&format!("  caused by: {cause}\n"));
            }
            use std::io::Write;
            let _ = std::io::stderr().write_all(msg.as_bytes());
            ExitCode::FAILURE
        }
    }
}
