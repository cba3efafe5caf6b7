//! `redline monitor --once`, without the CLI: one snapshot of this machine.
//!
//! `cargo run -p redline-monitor --example once [-- [--json] [--csv FILE]]`

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let csv = args
        .iter()
        .position(|a| a == "--csv")
        .and_then(|i| args.get(i + 1))
        .map(std::path::PathBuf::from);
    redline_monitor::run(&redline_monitor::MonitorOptions {
        once: true,
        json: args.iter().any(|a| a == "--json"),
        csv,
        ..Default::default()
    })?;
    Ok(())
}
