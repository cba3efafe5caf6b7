//! The allocator policy, checked on the main thread of a test binary of
//! its own (`harness = false`): glibc serves other threads from arenas
//! whose heaps cannot hold a 96 MiB block, and the counters read here are
//! process-wide. glibc's defaults are checked in a child process.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn main() {
    use redline_core::host_alloc::reuse_freed_memory;
    const BIG: usize = 96 << 20;
    let policy = reuse_freed_memory();
    // SAFETY: mallinfo2 only reads the allocator's counters.
    let mapped = || unsafe { libc::mallinfo2() }.hblkhd;
    let before = mapped();
    let mut v = vec![0u8; BIG];
    for i in (0..v.len()).step_by(4096) {
        v[i] = 1;
    }
    let own_mapping = mapped() >= before + BIG;
    let first = std::hint::black_box(&v).as_ptr() as usize;
    drop(v);
    let v = vec![0u8; BIG];
    let reused = std::hint::black_box(&v).as_ptr() as usize == first;
    let report = format!("policy {policy:?} own_mapping {own_mapping} reused {reused}");
    if std::env::var("REDLINE_HOST_ALLOC").is_ok() {
        // The child: report only.
        println!("{report}");
        return;
    }
    assert_eq!(
        report, "policy Reuse own_mapping false reused true",
        "with the policy a step-sized buffer comes from the heap and is reused"
    );
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .env("REDLINE_HOST_ALLOC", "system")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("policy System own_mapping true"),
        "REDLINE_HOST_ALLOC=system keeps glibc's mapping per large buffer: {text}"
    );
    println!("host_alloc: {report}; system: {}", text.trim());
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn main() {}
