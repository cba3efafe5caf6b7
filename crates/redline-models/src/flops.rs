//! FLOPs per sample, counted from the layers: a property of a layer, worked
//! out where its output shape is (one walk over the layers with their input
//! shapes), never a table keyed by model name.
//!
//! Counted as PyTorch's `torch.utils.flop_counter.FlopCounterMode` counts,
//! so the numbers compare with what PyTorch users see:
//! * a matrix product `(M, K) x (K, N)` is `2·M·N·K` (a linear layer's bias
//!   is not counted, as `addmm` counts only its product);
//! * a convolution is `2 · Cout · Ho · Wo · Cin · kh · kw` per sample (its
//!   bias not counted);
//! * elementwise work (activations, batch and layer norms, pooling,
//!   dropout, the loss) and lookups (embeddings) count nothing;
//! * the backward computes every weighted layer's weight gradient (the same
//!   FLOPs as its forward) and its input gradient (the same again) only
//!   where something before it has parameters: the data needs no gradient,
//!   so the first weighted layer's input gradient is not computed, as
//!   autograd skips it and as Redline's fused kernels do.

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::layers::{out_shape, LayerSpec};

/// Floating-point operations for one sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Flops {
    /// The forward pass.
    pub forward: u64,
    /// The backward pass (weight and input gradients).
    pub backward: u64,
}

impl Flops {
    /// A training step's FLOPs for the sample: forward plus backward.
    pub fn train(self) -> u64 {
        self.forward.saturating_add(self.backward)
    }

    fn add(self, other: Self) -> Self {
        Self {
            forward: self.forward.saturating_add(other.forward),
            backward: self.backward.saturating_add(other.backward),
        }
    }

    /// A weighted layer whose forward is `f`: the backward's weight gradient
    /// costs `f` again, its input gradient `f` more when wanted.
    fn weighted(f: u64, grad_in: bool) -> Self {
        Self {
            forward: f,
            backward: if grad_in { f.saturating_mul(2) } else { f },
        }
    }
}

/// The product of `dims`, saturating (a model file's sizes are bounded, but
/// their product need not fit).
fn product(dims: &[usize]) -> u64 {
    dims.iter().fold(1u64, |a, &d| {
        a.saturating_mul(u64::try_from(d).unwrap_or(u64::MAX))
    })
}

/// What `specs` cost per sample from per-sample input shape `input`, and
/// whether a gradient flows out of them: `grad_in` says whether one flows
/// in (something before has parameters).
pub(crate) fn fold(
    specs: &[LayerSpec],
    input: &[usize],
    outputs: usize,
    mut grad_in: bool,
) -> Result<(Flops, bool)> {
    let mut shape = input.to_vec();
    let mut total = Flops::default();
    for spec in specs {
        let out = out_shape(spec, &shape, outputs)?;
        let (f, has_params) = layer(spec, &shape, &out, outputs, grad_in)?;
        total = total.add(f);
        grad_in |= has_params;
        shape = out;
    }
    Ok((total, grad_in))
}

/// One layer's FLOPs from per-sample input `input` to output `out`, and
/// whether it has parameters (so that a gradient flows from it on).
fn layer(
    spec: &LayerSpec,
    input: &[usize],
    out: &[usize],
    outputs: usize,
    grad_in: bool,
) -> Result<(Flops, bool)> {
    Ok(match spec {
        // (rows, in) x (in, out): 2·rows·in·out, the leading dimensions rows
        LayerSpec::Linear { .. } => (
            Flops::weighted(
                product(&[2])
                    .saturating_mul(product(input))
                    .saturating_mul(product(&out[out.len() - 1..])),
                grad_in,
            ),
            true,
        ),
        // c_attn (C -> 3C) and c_proj (C -> C) over T rows, and the heads'
        // two products (q k^T and the weights times v, 2·T·T·C each over
        // the heads), counted as FlopCounterMode counts SDPA: the whole
        // T x T (no halving for the mask), and its backward five such
        // products (the scores recomputed, then dV, dP, dQ and dK).
        LayerSpec::Attention { .. } => {
            let (t, c) = (input[0], input[1]);
            let c_attn = Flops::weighted(product(&[2, t, c, 3 * c]), grad_in);
            let c_proj = Flops::weighted(product(&[2, t, c, c]), true);
            let sdpa = product(&[2, t, t, c]);
            let heads = Flops {
                forward: sdpa.saturating_mul(2),
                backward: sdpa.saturating_mul(5),
            };
            (c_attn.add(c_proj).add(heads), true)
        }
        // Each output value is a dot product over (Cin/groups)·k·k inputs.
        LayerSpec::Conv2d { kernel, groups, .. } => (
            Flops::weighted(
                product(&[2, input[0] / groups.max(&1), *kernel, *kernel])
                    .saturating_mul(product(out)),
                grad_in,
            ),
            true,
        ),
        LayerSpec::Batchnorm2d { .. }
        | LayerSpec::Layernorm { .. }
        | LayerSpec::Embedding { .. }
        | LayerSpec::Positions { .. } => (Flops::default(), true),
        LayerSpec::Residual {
            layers, shortcut, ..
        } => {
            let (body, body_grad) = fold(layers, input, outputs, grad_in)?;
            let (short, short_grad) = fold(shortcut, input, outputs, grad_in)?;
            (body.add(short), body_grad || short_grad)
        }
        LayerSpec::Maxpool2d { .. }
        | LayerSpec::Avgpool2d { .. }
        | LayerSpec::Adaptiveavgpool2d
        | LayerSpec::Flatten
        | LayerSpec::Relu
        | LayerSpec::Gelu { .. }
        | LayerSpec::Dropout { .. } => (Flops::default(), false),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn linear(out: usize) -> LayerSpec {
        LayerSpec::Linear {
            out: Some(out),
            name: None,
        }
    }

    #[test]
    fn the_first_layer_computes_no_input_gradient() -> Result<()> {
        // 784-128-10: forward 2·784·128 + 2·128·10; backward: fc1's weight
        // gradient only, fc2's weight and input gradients.
        let specs = [linear(128), LayerSpec::Relu, linear(10)];
        let (f, grad) = fold(&specs, &[784], 10, false)?;
        let (a, b) = (2 * 784 * 128, 2 * 128 * 10);
        assert_eq!(f.forward, a + b);
        assert_eq!(f.backward, a + 2 * b);
        assert_eq!(f.train(), 2 * a + 3 * b);
        assert!(grad);
        Ok(())
    }

    #[test]
    fn a_convolution_counts_every_output_value() -> Result<()> {
        // 4x32x32 -> 16x16x16 with a 3x3 kernel, stride 2, padding 1.
        let conv = |groups: usize| LayerSpec::Conv2d {
            out: 16,
            kernel: 3,
            padding: 1,
            stride: 2,
            groups,
            bias: true,
            init: Default::default(),
            name: None,
        };
        let (f, _) = fold(&[conv(1)], &[4, 32, 32], 10, true)?;
        let one = 2 * 4 * 9 * 16 * 16 * 16;
        assert_eq!((f.forward, f.backward), (one, 2 * one));
        // Grouped (FlopCounterMode's count): each output sums Cin/groups inputs.
        let (f, _) = fold(&[conv(4)], &[4, 32, 32], 10, true)?;
        assert_eq!((f.forward, f.backward), (one / 4, one / 2));
        Ok(())
    }

    #[test]
    fn parameters_before_a_layer_make_it_compute_its_input_gradient() -> Result<()> {
        // A layer norm (weighted, no FLOPs) first: the linear after it needs dx.
        let specs = [LayerSpec::Layernorm { eps: 1e-5 }, linear(4)];
        let (f, _) = fold(&specs, &[8], 4, false)?;
        assert_eq!((f.forward, f.backward), (64, 128));
        // A ReLU first has no parameters: no dx.
        let specs = [LayerSpec::Relu, linear(4)];
        let (f, grad) = fold(&specs, &[8], 4, false)?;
        assert_eq!((f.forward, f.backward), (64, 64));
        assert!(grad);
        let (f, grad) = fold(&[LayerSpec::Relu], &[8], 4, false)?;
        assert_eq!((f, grad), (Flops::default(), false));
        Ok(())
    }

    #[test]
    fn a_residual_adds_its_body_and_shortcut() -> Result<()> {
        let block = LayerSpec::Residual {
            layers: vec![linear(8), LayerSpec::Relu, linear(8)],
            shortcut: vec![linear(8)],
            name: None,
        };
        let (f, _) = fold(&[block], &[8], 8, true)?;
        let one = 2 * 8 * 8;
        assert_eq!((f.forward, f.backward), (3 * one, 6 * one));
        Ok(())
    }

    #[test]
    fn a_linear_over_a_sequence_counts_every_row() -> Result<()> {
        let (f, _) = fold(&[linear(4)], &[10, 8], 4, true)?;
        assert_eq!((f.forward, f.backward), (2 * 10 * 8 * 4, 4 * 10 * 8 * 4));
        Ok(())
    }

    #[test]
    fn huge_sizes_saturate_instead_of_wrapping() {
        assert_eq!(product(&[1 << 24, 1 << 24, 1 << 24]), u64::MAX);
        let f = Flops::weighted(u64::MAX, true);
        assert_eq!(f.train(), u64::MAX);
    }
}
