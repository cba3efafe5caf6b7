//! With the `cuda` feature: compiles `cuda/*.cu` with nvcc into one fatbin
//! for the GPU architecture `CUDA_COMPUTE_CAP` (default 90, H100/H200):
//! machine code for it, plus its PTX for newer GPUs. The binary embeds it, so
//! no run compiles these kernels. Without the feature this does nothing.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=cuda");
    println!("cargo:rerun-if-env-changed=CUDA_COMPUTE_CAP");
    println!("cargo:rerun-if-env-changed=NVCC");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let out = PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default());
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "90".into());
    let cap: String = cap.chars().filter(char::is_ascii_digit).collect();
    let nvcc = std::env::var_os("NVCC")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("CUDA_ROOT").map(|r| PathBuf::from(r).join("bin").join("nvcc"))
        })
        .filter(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("nvcc"));
    let fatbin = out.join("redline_kernels.fatbin");
    let status = Command::new(&nvcc)
        .args(["-fatbin", "-O3", "-std=c++17"])
        .arg(format!("-gencode=arch=compute_{cap},code=sm_{cap}"))
        .arg(format!("-gencode=arch=compute_{cap},code=compute_{cap}"))
        .arg("-o")
        .arg(&fatbin)
        .arg("cuda/redline.cu")
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => {
            eprintln!("nvcc failed ({s}) compiling cuda/redline.cu for sm_{cap}");
            std::process::exit(1);
        }
        Err(e) => {
            eprintln!(
                "cannot run nvcc ({}): {e}; the cuda feature needs CUDA's compiler \
                 (eval \"$(scripts/cuda-toolchain.sh)\")",
                nvcc.display()
            );
            std::process::exit(1);
        }
    }
}
