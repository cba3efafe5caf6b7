//! Casts between f32, bf16 and fp16 on the CPU that autograd records, each
//! one vectorised pass ([`crate::half16`]'s conversions, round to nearest
//! even as candle's and PyTorch's casts). A 16-bit ResNet step casts every
//! activation on each side of every convolution and batch norm, and each
//! gradient back: candle's `to_dtype` (a per-value conversion) took a
//! seventh of a bf16-mixed ResNet-18 step at 64 px (perf). Other devices
//! and dtypes take candle's `to_dtype`.

use candle_core::{CpuStorage, CustomOp1, DType, Layout, Shape, Tensor};

use crate::half16::{narrow, rounded, widen};
use crate::Result;

/// `t` as `dtype`, as `t.to_dtype(dtype)` computes it: the gradient comes
/// back cast to `t`'s dtype.
pub fn to_dtype(t: &Tensor, dtype: DType) -> Result<Tensor> {
    convert(t, dtype, dtype)
}

/// `t` rounded to `dtype`'s values and kept in `t`'s f32, as
/// `t.to_dtype(dtype)?.to_dtype(F32)` computes it (the gradient rounded to
/// `dtype` on the way back too), in one pass each way.
pub fn round_to(t: &Tensor, dtype: DType) -> Result<Tensor> {
    match t.dtype() {
        DType::F32 => convert(t, dtype, DType::F32),
        // Its values are `dtype`'s already: widened.
        d if d == dtype => to_dtype(t, DType::F32),
        _ => Ok(t.to_dtype(dtype)?.to_dtype(DType::F32)?),
    }
}

/// Whether the vectorised conversions take `dtype`.
fn takes(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::BF16 | DType::F16)
}

/// `t`'s values rounded to `round` and stored as `to` (one of them f32, or
/// both the same 16-bit type).
fn convert(t: &Tensor, round: DType, to: DType) -> Result<Tensor> {
    if !t.device().is_cpu() || !takes(t.dtype()) || !takes(to) {
        let y = t.to_dtype(round)?;
        return Ok(if to == round { y } else { y.to_dtype(to)? });
    }
    if t.dtype() == to && (round == to || to != DType::F32) {
        return Ok(t.clone());
    }
    Ok(t.contiguous()?.apply_op1(Cast { round, to })?)
}

/// The recorded cast: values rounded to `round`, stored as `to`.
struct Cast {
    round: DType,
    to: DType,
}

impl CustomOp1 for Cast {
    fn name(&self) -> &'static str {
        "redline-cast16"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let name = self.name();
        // Into f32 the values are rounded to `round`; a 16-bit store rounds
        // as it narrows (f32 values go to it as they lie).
        let out = match self.to {
            DType::F32 => CpuStorage::F32(rounded(s, l, self.round, name)?.into_owned()),
            to => narrow(&widen(s, l, name)?, to)?,
        };
        Ok((out, l.shape().clone()))
    }

    fn bwd(
        &self,
        arg: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        // The gradient in the input's dtype; an f32 input's rounded to
        // `round` as the 16-bit cast it stands for rounds it.
        let back = arg.dtype();
        let round = if back == DType::F32 { self.round } else { back };
        let g = grad
            .contiguous()?
            .apply_op1_no_bwd(&Cast { round, to: back })?;
        Ok(Some(g))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use candle_core::{Device, Var};

    /// Values around every rounding case: ties, subnormals, large, NaN, inf.
    fn awkward(n: usize) -> Tensor {
        let mut v: Vec<f32> = (0..n)
            .map(|i| ((i as f32) * 0.618).sin() * 10f32.powi((i % 9) as i32 - 4))
            .collect();
        v.extend([
            f32::NAN,
            f32::INFINITY,
            -f32::INFINITY,
            1e-40,
            -0.0,
            f32::from_bits(0x3f80_8000), // a bf16 tie
            f32::from_bits(0x3f81_8000), // the other tie
            70000.0,                     // fp16 overflows
        ]);
        let n = v.len();
        Tensor::from_vec(v, n, &Device::Cpu).unwrap()
    }

    fn bits(t: &Tensor) -> Vec<u32> {
        crate::half16::bits(t).unwrap()
    }

    /// Forward and backward bit for bit as candle's casts, every pair of
    /// f32, bf16 and fp16, and the rounding round trip; a tensor converted
    /// on one thread and one split across the threads.
    #[test]
    fn casts_are_candles_bit_for_bit_forward_and_backward() {
        for n in [4099, 200_000] {
            same_as_candle(n);
        }
    }

    fn same_as_candle(n: usize) {
        let base = awkward(n);
        let up = (awkward(n) * 0.37).unwrap().sin().unwrap();
        for from in [DType::F32, DType::BF16, DType::F16] {
            for to in [DType::F32, DType::BF16, DType::F16] {
                let x = Var::from_tensor(&base.to_dtype(from).unwrap()).unwrap();
                let cases: [(&str, Tensor, Tensor); 2] = [
                    (
                        "to_dtype",
                        to_dtype(x.as_tensor(), to).unwrap(),
                        x.as_tensor().to_dtype(to).unwrap(),
                    ),
                    (
                        "round_to",
                        round_to(x.as_tensor(), to).unwrap(),
                        x.as_tensor()
                            .to_dtype(to)
                            .unwrap()
                            .to_dtype(DType::F32)
                            .unwrap(),
                    ),
                ];
                for (what, got, want) in cases {
                    let what = format!("{what} {from:?} -> {to:?}");
                    assert_eq!(got.dtype(), want.dtype(), "{what}");
                    assert_eq!(bits(&got), bits(&want), "{what}: forward");
                    let seed = up.to_dtype(got.dtype()).unwrap();
                    let loss = |y: &Tensor| {
                        (y.to_dtype(DType::F32).unwrap() * seed.to_dtype(DType::F32).unwrap())
                            .unwrap()
                            .sum_all()
                            .unwrap()
                    };
                    let (g1, g2) = (
                        loss(&got).backward().unwrap(),
                        loss(&want).backward().unwrap(),
                    );
                    let (a, b) = (g1.get(x.as_tensor()), g2.get(x.as_tensor()));
                    let (a, b) = (a.unwrap(), b.unwrap());
                    assert_eq!(a.dtype(), from, "{what}: gradient dtype");
                    assert_eq!(bits(a), bits(b), "{what}: backward");
                }
            }
        }
    }
}
