//! The fused causal attention's memory grows with the sequence, not its
//! square: at T = 16384 a score matrix per head would be 1 GiB of fp32,
//! while the kernel keeps one row of scores per thread. The peak resident
//! memory (VmHWM, reset before the op through /proc/self/clear_refs) must
//! stay far below that. One test in its own binary: no other test's
//! allocations share the process.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use candle_core::{Device, Tensor, Var};

/// VmHWM in bytes, after resetting it to the current resident size.
fn reset_and_read_peak(reset: bool) -> Option<u64> {
    if reset {
        std::fs::write("/proc/self/clear_refs", "5").ok()?;
    }
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[test]
fn memory_grows_with_t_not_t_squared() {
    let (t, d) = (16384usize, 8usize);
    let x = |salt: f32| {
        let v: Vec<f32> = (0..t * d).map(|i| (i as f32 * 0.37 + salt).sin()).collect();
        Var::from_tensor(&Tensor::from_vec(v, (1, 1, t, d), &Device::Cpu).unwrap()).unwrap()
    };
    let (q, k, v) = (x(0.1), x(0.2), x(0.3));
    let Some(before) = reset_and_read_peak(true) else {
        eprintln!("no /proc/self/clear_refs here: the peak cannot be measured");
        return;
    };
    let o = redline_kernels::causal_attention(&q, &k, &v).unwrap();
    let grads = o.sum_all().unwrap().backward().unwrap();
    assert!(grads.get(&q).is_some());
    let peak = reset_and_read_peak(false).unwrap();
    let grown = peak.saturating_sub(before);
    let square = (t * t * 4) as u64;
    // The inputs, output and gradients are 512 KiB each; a score matrix 1 GiB.
    assert!(
        grown < square / 16,
        "attention at T = {t} grew the peak by {} MiB (a T x T matrix is {} MiB)",
        grown >> 20,
        square >> 20
    );
}
