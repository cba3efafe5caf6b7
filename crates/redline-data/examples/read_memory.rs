//! Peak memory of reading one `--data` input, against the bytes it holds:
//! `cargo run --release -p redline-data --example read_memory -- PATH`.
//! `bench/reader_memory.sh` runs it on the worst inputs of each reader
//! (docs/reliability.md quotes the table).

use std::path::PathBuf;

use redline_data::{prepare, DataOptions, Dataset};

/// A line of `/proc/self/status` in bytes (`VmHWM`: the peak resident set).
fn status_bytes(key: &str) -> anyhow::Result<u64> {
    let text = std::fs::read_to_string("/proc/self/status")?;
    let line = text
        .lines()
        .find(|l| l.starts_with(key))
        .ok_or_else(|| anyhow::anyhow!("no {key} in /proc/self/status"))?;
    let kb: u64 = line
        .split_whitespace()
        .nth(1)
        .ok_or_else(|| anyhow::anyhow!("{line}"))?
        .parse()?;
    Ok(kb * 1024)
}

/// Bytes under `path` (a file, or a folder's files).
fn size(path: &std::path::Path) -> anyhow::Result<u64> {
    if path.is_dir() {
        let mut total = 0;
        for e in std::fs::read_dir(path)? {
            total += size(&e?.path())?;
        }
        Ok(total)
    } else {
        Ok(std::fs::metadata(path)?.len())
    }
}

fn main() -> anyhow::Result<()> {
    let path: PathBuf = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .ok_or_else(|| anyhow::anyhow!("usage: read_memory PATH"))?;
    let base = status_bytes("VmRSS")?;
    let result = prepare(&path, &DataOptions::default());
    let peak = status_bytes("VmHWM")?.saturating_sub(base);
    let file = size(&path)?;
    let what = match &result {
        Ok(p) => format!("{} train samples", p.train.len()),
        Err(e) => format!(
            "refused: {}",
            e.to_string().lines().next().unwrap_or_default()
        ),
    };
    println!(
        "{}\t{:.1} MB\tpeak {:.1} MB\t{:.2}x\t{what}",
        path.display(),
        file as f64 / 1e6,
        peak as f64 / 1e6,
        peak as f64 / file.max(1) as f64
    );
    Ok(())
}
