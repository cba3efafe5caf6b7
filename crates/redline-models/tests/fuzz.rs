//! Fuzzing the weights loader (`--init`, `redline_testkit::fuzz`, corpus in
//! `testdata/fuzz/safetensors/`): any file loads or is refused with an
//! error; a refused file changes no weight.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use candle_core::{DType, Device, Var};
use redline_models::Params;
use redline_testkit::fuzz::fuzz;

#[test]
fn fuzz_safetensors_weights() {
    let mut params = Params::new();
    params
        .push(
            "fc.weight",
            Var::zeros((2, 3), DType::F32, &Device::Cpu).unwrap(),
        )
        .unwrap();
    params
        .push("fc.bias", Var::zeros(2, DType::F32, &Device::Cpu).unwrap())
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.safetensors");
    fuzz("safetensors", |bytes| {
        for (_, v) in params.iter() {
            v.set(&v.as_tensor().zeros_like().unwrap()).unwrap();
        }
        std::fs::write(&path, bytes).unwrap();
        if params.load_safetensors(&path).is_err() {
            for (name, v) in params.iter() {
                let sum = v.as_tensor().abs().unwrap().sum_all().unwrap();
                assert_eq!(sum.to_scalar::<f32>().unwrap(), 0.0, "{name} changed");
            }
        }
    });
}
