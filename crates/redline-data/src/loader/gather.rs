//! The resident loader's batch gather: on the CPU, each sample's row
//! copied once into the batch.
//!
//! candle's `index_select` fills its output with zeros and then copies the
//! rows in: two passes over the batch (38.5 MB at 64 x 3 x 224 x 224
//! fp32), of which the first is wasted. Other devices and layouts take
//! `index_select`.

use candle_core::{CpuStorage, Storage, Tensor};

use crate::{Error, Result};

/// Rows `order` (indices along dimension 0) of `t`; `idx` is the same
/// order as a tensor on `t`'s device, used where the copy is not done
/// here.
pub(crate) fn rows(t: &Tensor, order: &[u32], idx: &Tensor) -> Result<Tensor> {
    if !t.device().is_cpu() || !t.is_contiguous() || t.rank() == 0 {
        return Ok(t.index_select(idx, 0)?);
    }
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cpu(cpu) = &*storage else {
        return Ok(t.index_select(idx, 0)?);
    };
    let (n, dims) = (t.dim(0)?, t.dims());
    let row = dims[1..].iter().product::<usize>();
    if let Some(&bad) = order.iter().find(|&&i| i as usize >= n) {
        return Err(Error::Config(format!(
            "sample {bad} in a batch of a split of {n} samples"
        )));
    }
    let start = layout.start_offset();
    let mut shape = dims.to_vec();
    shape[0] = order.len();
    let dev = t.device();
    macro_rules! gather {
        ($($v:ident),*) => {
            match cpu {
                $(CpuStorage::$v(v) => Tensor::from_vec(copy(v, start, row, order), shape, dev)?,)*
                _ => return Ok(t.index_select(idx, 0)?),
            }
        };
    }
    Ok(gather!(U8, U32, I64, BF16, F16, F32, F64))
}

/// `order`'s rows of `row` values each from `v` (starting at `start`),
/// concatenated: written once, never zero-filled first.
fn copy<T: Copy>(v: &[T], start: usize, row: usize, order: &[u32]) -> Vec<T> {
    let mut out = Vec::with_capacity(order.len() * row);
    for &i in order {
        let at = start + i as usize * row;
        out.extend_from_slice(&v[at..at + row]);
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use candle_core::{DType, Device};

    /// The gather gives `index_select`'s batch for each dtype, from a
    /// tensor that starts inside its storage (a narrowed view).
    #[test]
    fn gathered_rows_are_index_selects() {
        let order = [4u32, 0, 3, 3];
        let idx = Tensor::new(&order, &Device::Cpu).unwrap();
        let base = Tensor::arange(0f32, 72.0, &Device::Cpu)
            .unwrap()
            .reshape((6, 3, 4))
            .unwrap();
        let view = base.narrow(0, 1, 5).unwrap();
        for dtype in [DType::F32, DType::U8, DType::BF16, DType::I64, DType::U32] {
            let t = view.to_dtype(dtype).unwrap();
            let t = if dtype == DType::F32 { view.clone() } else { t };
            let got = rows(&t, &order, &idx).unwrap();
            let want = t.index_select(&idx, 0).unwrap();
            assert_eq!(got.dims(), &[4, 3, 4]);
            let (g, w) = (
                got.to_dtype(DType::F64)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f64>()
                    .unwrap(),
                want.to_dtype(DType::F64)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f64>()
                    .unwrap(),
            );
            assert_eq!(g, w, "{dtype:?}");
        }
        // A sample past the split is an error, not a read past the end.
        let bad = [5u32];
        let e = rows(&view, &bad, &Tensor::new(&bad, &Device::Cpu).unwrap()).unwrap_err();
        assert!(e.to_string().contains("sample 5"), "{e}");
    }
}
