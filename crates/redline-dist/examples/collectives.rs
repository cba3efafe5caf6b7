//! Every collective on every rank, checked against what it must give; run by
//! `tests/mpirun.rs` as `mpirun -n N collectives [hang RANK | die RANK]`.
//! Prints `rank R/N ok` when all checks pass; exits non-zero otherwise.
//! `hang R` makes rank R stop before the last all-reduce (the others must
//! time out); `die R` makes it exit without finalizing.

use std::time::Duration;

use redline_dist::{connect, Launch};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let launch = Launch::detect()?;
    let timeout = Duration::from_secs_f64(
        std::env::var("TIMEOUT_S")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(10.0),
    );
    let comm = connect(&launch, timeout)?;
    let (rank, n) = (comm.rank(), comm.world_size());
    // Sum: rank r contributes [r, 1, 0.5 * r]; f64 likewise.
    let mut v = vec![rank as f32, 1.0, 0.5 * rank as f32];
    comm.all_reduce_sum(&mut v, "all-reduce f32")?;
    let tri = (n * (n - 1) / 2) as f32;
    assert_eq!(v, [tri, n as f32, 0.5 * tri], "rank {rank}");
    let mut d = vec![rank as f64 + 0.25; 3];
    comm.all_reduce_sum_f64(&mut d, "all-reduce f64")?;
    assert_eq!(d[0], tri as f64 + 0.25 * n as f64);
    // Broadcast from the last rank.
    let mut b = vec![rank as f32; 4];
    comm.broadcast(&mut b, n - 1, "broadcast")?;
    assert_eq!(b, vec![(n - 1) as f32; 4]);
    // All-gather of bytes of different lengths.
    let mine = vec![b'a' + rank as u8; rank + 1];
    let all = comm.all_gather_bytes(&mine, "all-gather")?;
    for (r, got) in all.iter().enumerate() {
        assert_eq!(got, &vec![b'a' + r as u8; r + 1]);
    }
    comm.barrier("barrier")?;
    match (
        args.get(1).map(String::as_str),
        args.get(2).and_then(|r| r.parse::<usize>().ok()),
    ) {
        (Some("hang"), Some(r)) if r == rank => {
            std::thread::sleep(Duration::from_secs(600));
        }
        (Some("die"), Some(r)) if r == rank => std::process::exit(3),
        _ => {}
    }
    let mut last = vec![1.0f32];
    if let Err(e) = comm.all_reduce_sum(&mut last, "the last all-reduce (step 7)") {
        // One write: the ranks share the terminal, and a message written in
        // pieces interleaves with another rank's.
        use std::io::Write;
        let _ = std::io::stderr().write_all(format!("{e}\n").as_bytes());
        std::process::exit(2);
    }
    println!("rank {rank}/{n} ok ({})", comm.backend());
    Ok(())
}
