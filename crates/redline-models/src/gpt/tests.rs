#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
use candle_core::{Device, Tensor};

use crate::gpt::{Gpt, GptConfig};
use crate::init::Initializer;
use crate::Model;

fn cfg(dropout: f64, bias: bool) -> GptConfig {
    GptConfig {
        n_layer: 2,
        n_head: 2,
        n_embd: 16,
        block_size: 8,
        vocab_size: 11,
        dropout,
        bias,
    }
}

fn build(c: &GptConfig) -> Gpt {
    let dev = redline_core::Device::cpu();
    let mut init = Initializer::new(5, &dev, redline_core::Precision::default());
    Gpt::new(c, &mut init).unwrap()
}

fn ids() -> Tensor {
    let v: Vec<u32> = (0..16).map(|i| (i * 3 + 1) % 11).collect();
    Tensor::from_vec(v, (2, 8), &Device::Cpu).unwrap()
}

fn values(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1().unwrap()
}

#[test]
fn dropout_draws_in_training_only_and_its_streams_resume() {
    let m = build(&cfg(0.3, true));
    // Evaluation is deterministic and equals the model without dropout.
    let plain = build(&cfg(0.0, true));
    let e1 = values(&m.forward_t(&ids(), false).unwrap());
    assert_eq!(e1, values(&m.forward_t(&ids(), false).unwrap()));
    assert_eq!(e1, values(&plain.forward_t(&ids(), false).unwrap()));
    // Training draws masks: two passes differ, and differ from evaluation.
    let state = m.rng_state();
    // The embeddings', and per block the attention's and two projections'.
    assert_eq!(state.len(), 1 + 2 * 3);
    let t1 = values(&m.forward_t(&ids(), true).unwrap());
    let t2 = values(&m.forward_t(&ids(), true).unwrap());
    assert_ne!(t1, t2);
    assert_ne!(t1, e1);
    // Put back, the streams draw the first pass's masks again.
    m.load_rng_state(&state).unwrap();
    assert_eq!(values(&m.forward_t(&ids(), true).unwrap()), t1);
    assert!(m.load_rng_state(&state[..3]).is_err());
    assert!(m.capture_safe().is_err() && plain.capture_safe().is_err());
    assert!(plain.rng_state().is_empty());
}

#[test]
fn without_biases_the_model_has_no_bias_parameters_and_still_learns() {
    let m = build(&cfg(0.0, false));
    let names: Vec<String> = m.params().iter().map(|(n, _)| n.to_string()).collect();
    assert!(names.iter().all(|n| !n.ends_with(".bias")), "{names:?}");
    // wte, wpe, per block ln_1, c_attn, c_proj, ln_2, c_fc, c_proj, ln_f.
    assert_eq!(names.len(), 2 + 2 * 6 + 1);
    let x = ids();
    let y: Vec<u32> = (0..16).map(|i| (i * 5 + 2) % 11).collect();
    let y = Tensor::from_vec(y, 16, &Device::Cpu).unwrap();
    let loss = |m: &Gpt| {
        let l = m.forward_t(&x, true).unwrap().reshape((16, 11)).unwrap();
        redline_kernels::cross_entropy(&l, &y).unwrap()
    };
    let before = loss(&m).to_scalar::<f32>().unwrap();
    for _ in 0..30 {
        let l = loss(&m);
        m.params().backward(&l).unwrap();
        for (_, p) in m.params().iter_params() {
            let g = p.grad().to_tensor(p.as_tensor()).unwrap().unwrap();
            p.var()
                .set(&(p.as_tensor() - (g * 0.5).unwrap()).unwrap())
                .unwrap();
            p.grad().clear();
        }
    }
    let after = loss(&m).to_scalar::<f32>().unwrap();
    assert!(after < 0.7 * before, "{before} -> {after}");
    let err = cfg(1.0, true).check().unwrap_err().to_string();
    assert!(err.contains("dropout 1"), "{err}");
}
