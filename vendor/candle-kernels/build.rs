use cudaforge::{KernelBuilder, Result};
use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() -> Result<()> {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=src");
    println!("cargo::rerun-if-changed=src/compatibility.cuh");
    println!("cargo::rerun-if-changed=src/cuda_utils.cuh");
    println!("cargo::rerun-if-changed=src/binary_op_macros.cuh");

    // Build for PTX
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());
    let ptx_path = out_dir.join("ptx.rs");
    let bindings = KernelBuilder::new()
        .source_dir("src") // Scan src/ for .cu files
        .exclude(&["moe_*.cu", "mmvq_gguf.cu", "mmq_*.cu"]) // Exclude statically compiled kernels from ptx build
        .arg("--expt-relaxed-constexpr")
        .arg("-std=c++17")
        .arg("-O3")
        .build_ptx()?;

    bindings.write(&ptx_path)?;
    // Redline: each module's machine code beside its PTX (REDLINE.md).
    write_fatbins(&out_dir);

    // Redline: candle's GGUF and MoE kernels (src/moe, src/mmq_gguf,
    // mmvq_gguf.cu, built into libmoe.a here upstream) are left out: Redline
    // trains no quantized or mixture-of-experts models, and they were 32 MB
    // of machine code in every binary and six minutes of nvcc per build
    // (REDLINE.md). src/ffi.rs says so to any caller.
    Ok(())
}

/// Redline: the modules that get machine code (all but `quantized`, whose
/// 5.8 MB of PTX Redline never loads).
const FATBIN_MODULES: [&str; 10] = [
    "affine", "binary", "cast", "conv", "fill", "indexing", "reduce", "sort", "ternary", "unary",
];

/// Redline: compiles each module's PTX with nvcc into a fatbin (the machine
/// code for the PTX's own `.target`, and the PTX) and writes `fatbin.rs`, one
/// `&[u8]` per module, empty where nvcc failed (that module's PTX is then
/// JIT-compiled at its first load, as before; the build says so).
fn write_fatbins(out_dir: &Path) {
    println!("cargo::rerun-if-env-changed=NVCC");
    let nvcc = env::var_os("NVCC")
        .map(PathBuf::from)
        .or_else(|| {
            ["CUDA_ROOT", "CUDA_PATH", "CUDA_HOME"]
                .iter()
                .filter_map(env::var_os)
                .map(|r| PathBuf::from(r).join("bin").join("nvcc"))
                .find(|p| p.exists())
        })
        .unwrap_or_else(|| PathBuf::from("nvcc"));
    let built: Vec<bool> = std::thread::scope(|s| {
        let jobs: Vec<_> = FATBIN_MODULES
            .iter()
            .map(|m| s.spawn(|| fatbin(&nvcc, out_dir, m)))
            .collect();
        jobs.into_iter()
            .map(|j| match j.join() {
                Ok(Ok(())) => true,
                Ok(Err(e)) => {
                    println!("cargo::warning=candle-kernels: no machine code, PTX only: {e}");
                    false
                }
                Err(_) => false,
            })
            .collect()
    });
    let mut rs = String::new();
    for (m, ok) in FATBIN_MODULES.iter().zip(built) {
        let name = m.to_uppercase();
        if ok {
            rs += &format!(
                "pub const {name}: &[u8] = include_bytes!(concat!(env!(\"OUT_DIR\"), \"/{m}.fatbin\"));\n"
            );
        } else {
            rs += &format!("pub const {name}: &[u8] = &[];\n");
        }
    }
    rs += "pub const QUANTIZED: &[u8] = &[];\n";
    if let Err(e) = std::fs::write(out_dir.join("fatbin.rs"), rs) {
        panic!("writing fatbin.rs: {e}");
    }
}

/// Redline: `{module}.ptx` in `out_dir` -> `{module}.fatbin`, for the
/// architecture the PTX names in its `.target` line (e.g. `sm_90a`).
fn fatbin(nvcc: &Path, out_dir: &Path, module: &str) -> std::result::Result<(), String> {
    let ptx = out_dir.join(format!("{module}.ptx"));
    let text = std::fs::read_to_string(&ptx).map_err(|e| format!("{}: {e}", ptx.display()))?;
    let arch = text
        .lines()
        .find_map(|l| l.trim().strip_prefix(".target "))
        .and_then(|t| t.split(',').next())
        .and_then(|t| t.trim().strip_prefix("sm_"))
        .ok_or_else(|| format!("{}: no .target sm_XX line", ptx.display()))?
        .to_string();
    let out = out_dir.join(format!("{module}.fatbin"));
    let status = Command::new(nvcc)
        .args(["-fatbin", "-O3"])
        .arg(format!("-gencode=arch=compute_{arch},code=sm_{arch}"))
        .arg(format!("-gencode=arch=compute_{arch},code=compute_{arch}"))
        .arg("-o")
        .arg(&out)
        .arg(&ptx)
        .status()
        .map_err(|e| format!("cannot run {}: {e}", nvcc.display()))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{} failed ({status}) on {module}.ptx for sm_{arch}", nvcc.display()))
    }
}
