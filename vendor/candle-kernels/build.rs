use cudaforge::{KernelBuilder, Result};
use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const CUTILE_FEATURE: &str = "CARGO_FEATURE_CUTILE";

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

    let mut moe_sources = vec![
        "src/moe/moe_gguf.cu",
        "src/moe/moe_wmma.cu",
        "src/moe/moe_wmma_gguf.cu",
        "src/mmvq_gguf.cu",
        "src/mmq_gguf/mmq_quantize.cu",
        "src/mmq_gguf/mmq_instance_q4_0.cu",
        "src/mmq_gguf/mmq_instance_q4_1.cu",
        "src/mmq_gguf/mmq_instance_q5_0.cu",
        "src/mmq_gguf/mmq_instance_q5_1.cu",
        "src/mmq_gguf/mmq_instance_q8_0.cu",
        "src/mmq_gguf/mmq_instance_q2_k.cu",
        "src/mmq_gguf/mmq_instance_q3_k.cu",
        "src/mmq_gguf/mmq_instance_q4_k.cu",
        "src/mmq_gguf/mmq_instance_q5_k.cu",
        "src/mmq_gguf/mmq_instance_q6_k.cu",
    ];
    if env::var_os(CUTILE_FEATURE).is_some() {
        moe_sources.push("src/moe/moe_align.cu");
    }

    let mut moe_builder = KernelBuilder::default()
        .source_files(moe_sources)
        .arg("--expt-relaxed-constexpr")
        .arg("-std=c++17")
        .arg("-O3");

    // Disable bf16 WMMA kernels on GPUs older than sm_80 (Ampere).
    // bf16 WMMA fragments require compute capability >= 8.0.
    let compute_cap = cudaforge::detect_compute_cap()
        .map(|arch| arch.base())
        .unwrap_or(80);
    if compute_cap < 80 {
        moe_builder = moe_builder.arg("-DNO_BF16_KERNEL");
    }

    let mut is_target_msvc = false;
    if let Ok(target) = std::env::var("TARGET") {
        if target.contains("msvc") {
            is_target_msvc = true;
            moe_builder = moe_builder.arg("-D_USE_MATH_DEFINES");
        }
    }

    if !is_target_msvc {
        moe_builder = moe_builder.arg("-Xcompiler").arg("-fPIC");
    }

    moe_builder.build_lib(out_dir.join("libmoe.a"))?;
    println!("cargo:rustc-link-search={}", out_dir.display());
    println!("cargo:rustc-link-lib=moe");
    println!("cargo:rustc-link-lib=dylib=cudart");
    if !is_target_msvc {
        println!("cargo:rustc-link-lib=stdc++");
    }
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
