//! The unit tests of `loader.rs`.

use super::*;
use crate::idx::IdxArray;
use crate::mnist::Normalize;
use crate::stage::PlainStage;
use candle_core::Device;
use std::path::Path;

fn split(n: usize) -> Result<Split> {
    let host = crate::mnist::from_idx(
        Path::new("i"),
        IdxArray {
            dims: vec![n, 1, 1],
            data: (0..n).map(|i| i as u8).collect(),
        },
        Path::new("l"),
        IdxArray {
            dims: vec![n],
            data: (0..n).map(|i| (i % 10) as u8).collect(),
        },
        Some(10),
        Normalize {
            mean: 0.0,
            std: 1.0 / 255.0,
        },
    )?;
    Split::from_host(&host, &Device::Cpu)
}

fn pixels(l: &Loader, epoch: usize) -> Result<Vec<Vec<u32>>> {
    l.epoch(epoch)
        .map(|b| {
            let b = b?;
            let v = b.x.flatten_all()?.to_vec1::<f32>()?;
            Ok(v.into_iter().map(|p| p.round() as u32).collect())
        })
        .collect()
}

fn cfg(shuffle: bool, prefetch: usize) -> LoaderConfig {
    LoaderConfig {
        batch_size: 4,
        shuffle,
        seed: 7,
        prefetch,
        drop_last: false,
    }
}

/// PyTorch's `DistributedSampler` on 5 samples and 2 ranks: padded,
/// `[0, 2, 4]` and `[1, 3, 0]`; unpadded, `[0, 2, 4]` and `[1, 3]`. The
/// batches of every feed hold exactly the samples of the rank's order.
#[test]
fn shards_split_each_epochs_order_as_distributed_sampler() -> Result<()> {
    let shard = |l: Loader, rank, pad| {
        l.shard(Shard {
            rank,
            world: 2,
            pad,
        })
    };
    let plain = |pad, rank| -> Result<Vec<u32>> {
        Ok(shard(Loader::new(split(5)?, cfg(false, 0))?, rank, pad)?.order(0))
    };
    assert_eq!(
        (plain(true, 0)?, plain(true, 1)?),
        (vec![0, 2, 4], vec![1, 3, 0])
    );
    assert_eq!(
        (plain(false, 0)?, plain(false, 1)?),
        (vec![0, 2, 4], vec![1, 3])
    );
    for (shuffle, prefetch, streaming) in [(true, 0, false), (true, 2, true), (false, 2, true)] {
        let whole = Loader::new(split(37)?, cfg(shuffle, 0))?;
        let mut seen = Vec::new();
        for rank in 0..2 {
            let base = if streaming {
                Loader::streaming(split(37)?, &Device::Cpu, cfg(shuffle, prefetch))?
            } else {
                Loader::new(split(37)?, cfg(shuffle, prefetch))?
            };
            let l = shard(base, rank, false)?;
            let order = l.order(3);
            assert_eq!(l.len(), order.len());
            let got: Vec<u32> = pixels(&l, 3)?.into_iter().map(|b| b[0]).collect();
            // The first pixel of each batch is its first sample's index.
            let firsts: Vec<u32> = order.chunks(4).map(|c| c[0]).collect();
            assert_eq!(got, firsts, "rank {rank} shuffle {shuffle}");
            seen.extend(order);
        }
        seen.sort_unstable();
        let mut all = whole.order(3);
        all.sort_unstable();
        assert_eq!(seen, all, "the two parts cover the epoch once");
    }
    assert!(Loader::new(split(5)?, cfg(false, 0))?
        .shard(Shard {
            rank: 2,
            world: 2,
            pad: true
        })
        .is_err());
    Ok(())
}

#[test]
fn a_limit_yields_the_first_batches_of_each_epochs_order() -> Result<()> {
    for prefetch in [0, 2] {
        let whole = Loader::new(split(10)?, cfg(true, prefetch))?;
        let l = Loader::new(split(10)?, cfg(true, prefetch))?.limit_batches(2);
        assert_eq!(l.batches_per_epoch(), 2);
        for epoch in 0..3 {
            let all = pixels(&whole, epoch)?;
            assert_eq!(pixels(&l, epoch)?, all[..2].to_vec(), "epoch {epoch}");
        }
        // A limit past the data's batches changes nothing.
        let l = Loader::new(split(10)?, cfg(true, prefetch))?.limit_batches(9);
        assert_eq!(l.batches_per_epoch(), 3);
    }
    Ok(())
}

#[test]
fn file_order_keeps_last_partial_batch() -> Result<()> {
    let l = Loader::new(split(10)?, cfg(false, 0))?;
    assert_eq!(l.batches_per_epoch(), 3);
    let got = pixels(&l, 0)?;
    assert_eq!(got, vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7], vec![8, 9]]);
    Ok(())
}

#[test]
fn shuffle_is_a_seeded_permutation_fresh_each_epoch() -> Result<()> {
    let l = Loader::new(split(50)?, cfg(true, 0))?;
    let (e0, e1) = (l.order(0), l.order(1));
    assert_ne!(e0, e1);
    assert_eq!(e0, l.order(0));
    let mut sorted = e0.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..50).collect::<Vec<u32>>());
    let flat: Vec<u32> = pixels(&l, 0)?.concat();
    assert_eq!(flat, e0);
    Ok(())
}

#[test]
fn prefetch_yields_the_same_batches_as_inline() -> Result<()> {
    let inline = Loader::new(split(37)?, cfg(true, 0))?;
    let ahead = Loader::new(split(37)?, cfg(true, 3))?;
    assert_eq!(pixels(&inline, 2)?, pixels(&ahead, 2)?);
    Ok(())
}

#[test]
fn epoch_from_continues_where_the_epoch_was() -> Result<()> {
    for prefetch in [0, 2] {
        let l = Loader::new(split(37)?, cfg(true, prefetch))?;
        let whole: Vec<(usize, Vec<f32>)> = l
            .epoch(3)
            .map(|b| b.and_then(|b| Ok((b.index, b.x.flatten_all()?.to_vec1()?))))
            .collect::<Result<_>>()?;
        let tail: Vec<(usize, Vec<f32>)> = l
            .epoch_from(3, 2)
            .map(|b| b.and_then(|b| Ok((b.index, b.x.flatten_all()?.to_vec1()?))))
            .collect::<Result<_>>()?;
        assert!(whole.len() > 2);
        assert_eq!(tail, whole[2..]);
    }
    Ok(())
}

#[test]
fn stopping_early_does_not_hang() -> Result<()> {
    // The drop runs on another thread so that a hang fails the test (after
    // 10 s) instead of stalling the whole test run.
    let l = Loader::new(split(100)?, cfg(true, 1))?;
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut it = l.epoch(0);
        let first = it.next().is_some();
        drop(it);
        let _ = done_tx.send(first);
    });
    let got = done_rx.recv_timeout(std::time::Duration::from_secs(10));
    assert_eq!(got, Ok(true), "the epoch did not stop within 10 s");
    Ok(())
}

fn labels(l: &Loader, epoch: usize) -> Result<Vec<Vec<u32>>> {
    l.epoch(epoch).map(|b| Ok(b?.y.to_vec1::<u32>()?)).collect()
}

#[test]
fn resident_and_streaming_yield_the_same_batches() -> Result<()> {
    for shuffle in [false, true] {
        for prefetch in [0, 1, 3] {
            let resident = Loader::new(split(37)?, cfg(shuffle, prefetch))?;
            let streaming = Loader::streaming(split(37)?, &Device::Cpu, cfg(shuffle, prefetch))?;
            assert_eq!(resident.placement(), Placement::Resident);
            assert_eq!(streaming.placement(), Placement::Streaming);
            for epoch in [0, 1] {
                let want = pixels(&resident, epoch)?;
                assert_eq!(want.len(), 10, "9 full batches and a partial one");
                assert_eq!(
                    want,
                    pixels(&streaming, epoch)?,
                    "shuffle {shuffle} prefetch {prefetch}"
                );
                assert_eq!(labels(&resident, epoch)?, labels(&streaming, epoch)?);
            }
        }
    }
    Ok(())
}

#[test]
fn placed_uploads_or_streams_as_told() -> Result<()> {
    let r = Loader::placed(split(5)?, &Device::Cpu, Placement::Resident, cfg(true, 0))?;
    let s = Loader::placed(split(5)?, &Device::Cpu, Placement::Streaming, cfg(true, 0))?;
    assert_eq!(
        (r.placement(), s.placement()),
        (Placement::Resident, Placement::Streaming)
    );
    assert_eq!(pixels(&r, 3)?, pixels(&s, 3)?);
    Ok(())
}

/// A stage that records which slot each batch went through and how far
/// the producer ran ahead of the consumer.
struct Recording {
    inner: PlainStage,
    log: Arc<Mutex<Vec<(usize, usize)>>>,
    produced: Arc<std::sync::atomic::AtomicUsize>,
}

impl Stage for Recording {
    fn stage(&mut self, slot: usize, data: &dyn Dataset, idx: &[u32]) -> Result<Staged> {
        let n = self.inner.slots();
        if let Ok(mut l) = self.log.lock() {
            l.push((slot, slot % n));
        }
        self.produced
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.stage(slot, data, idx)
    }

    fn slots(&self) -> usize {
        self.inner.slots()
    }
}

#[test]
fn streaming_uses_slots_in_turn_and_runs_at_most_prefetch_ahead() -> Result<()> {
    use std::sync::atomic::Ordering;
    let prefetch = 2;
    let l = Loader::streaming(split(40)?, &Device::Cpu, cfg(true, prefetch))?;
    let Feed::Streaming { host, stages, .. } = &l.feed else {
        return Err(Error::Config("not streaming".into()));
    };
    let log = Arc::new(Mutex::new(Vec::new()));
    let produced = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let rec = Recording {
        inner: PlainStage::new(&Device::Cpu, host.as_ref(), 4, prefetch + 1)?,
        log: log.clone(),
        produced: produced.clone(),
    };
    stages
        .lock()
        .map_err(|_| Error::Prefetch("poisoned".into()))?
        .push(Box::new(rec));
    let mut consumed = 0;
    for (b, batch) in l.epoch(0).enumerate() {
        assert_eq!(batch?.index, b, "batches arrive in order");
        consumed += 1;
        // Give the producer time to fill every slot it may, then check it did
        // not pass the bound: `prefetch` queued plus one being staged.
        std::thread::sleep(std::time::Duration::from_millis(5));
        let ahead = produced.load(Ordering::SeqCst) - consumed;
        assert!(ahead <= prefetch + 1, "producer ran {ahead} batches ahead");
    }
    assert_eq!(consumed, 10);
    let log = log
        .lock()
        .map_err(|_| Error::Prefetch("poisoned".into()))?
        .clone();
    let want: Vec<(usize, usize)> = (0..10).map(|b| (b, b % (prefetch + 1))).collect();
    assert_eq!(log, want);
    // The stage went back to the pool for the next epoch (pinned buffers are reused).
    assert_eq!(stages.lock().map(|p| p.len()).unwrap_or(0), 1);
    Ok(())
}

#[test]
fn staging_refuses_a_batch_larger_than_its_slot() -> Result<()> {
    let host = split(10)?.to_host()?;
    let mut st = PlainStage::new(&Device::Cpu, &host, 2, 1)?;
    let err = st.stage(0, &host, &[0, 1, 2]).err().map(|e| e.to_string());
    assert!(err.is_some_and(|m| m.contains("holds 2 samples, batch has 3")));
    Ok(())
}

#[test]
fn zero_batch_size_is_refused() -> Result<()> {
    assert!(Loader::new(split(3)?, cfg(false, 0).clone_with(0)).is_err());
    Ok(())
}

impl LoaderConfig {
    fn clone_with(mut self, batch_size: usize) -> Self {
        self.batch_size = batch_size;
        self
    }
}
