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
        // The header's metadata alone (`redline test WEIGHTS` reads the run
        // folder from it): read or refused, never a panic.
        let _ = redline_models::params::safetensors_metadata(&path);
        if params.load_safetensors(&path).is_err() {
            for (name, v) in params.iter() {
                let sum = v.as_tensor().abs().unwrap().sum_all().unwrap();
                assert_eq!(sum.to_scalar::<f32>().unwrap(), 0.0, "{name} changed");
            }
        }
    });
}

/// Model files (`--model FILE.toml`): any text is a model whose every size
/// was checked, with its FLOPs counted, or an error; never a panic. Shaped
/// for images, a table and token ids (the corpus has named layers, strided
/// padded pools, inits, attention and position tables).
#[test]
fn fuzz_model_files() {
    use redline_models::SequentialConfig;
    fuzz("model", |bytes| {
        let Ok(text) = std::str::from_utf8(bytes) else {
            return;
        };
        // A `kind = "gpt"` file (issue 50): parsed, checked, counted.
        if let Ok(Some(mut gpt)) = redline_models::GptConfig::from_file_text(text) {
            gpt.vocab_size = 256;
            if gpt.check().is_ok() {
                let _ = gpt.flops();
            }
        }
        for (dims, outputs) in [(&[3usize, 32, 32][..], 10), (&[13][..], 3), (&[8][..], 10)] {
            if let Ok(cfg) = SequentialConfig::from_toml(text, "m", dims, outputs) {
                let _ = cfg.check_head();
                let _ = cfg.flops();
            }
        }
    });
}

/// A model file or weights file that is not a regular file is refused, not
/// read forever.
#[test]
fn special_files_are_refused_as_model_and_weights_files() {
    use redline_models::SequentialConfig;
    use redline_testkit::fuzz::{special_files, within};
    let dir = tempfile::tempdir().unwrap();
    let limit = std::time::Duration::from_secs(30);
    for p in special_files(&dir.path().join("m"), "m.toml") {
        let what = format!("--model {}", p.display());
        let r = within(limit, &what, move || {
            SequentialConfig::from_file(&p, &[13], 3).map(|_| ())
        });
        assert!(r.is_err(), "{what}");
    }
    for p in special_files(&dir.path().join("w"), "w.safetensors") {
        let what = format!("--init {}", p.display());
        let r = within(limit, &what, move || {
            let mut params = Params::new();
            params
                .push("b", Var::zeros(2, DType::F32, &Device::Cpu).unwrap())
                .unwrap();
            params.load_safetensors(&p).map(|_| ())
        });
        assert!(r.is_err(), "{what}");
    }
}

/// A Hugging Face folder's `config.json` (`--init DIR`, `redline sample
/// DIR`): a GPT-2 config that was checked, or an error; never a panic.
#[test]
fn fuzz_hf_configs() {
    let dir = tempfile::tempdir().unwrap();
    fuzz("hf_config", |bytes| {
        std::fs::write(dir.path().join("config.json"), bytes).unwrap();
        if let Ok(cfg) = redline_models::GptConfig::from_hf(dir.path()) {
            assert!(cfg.check().is_ok());
            let _ = cfg.flops();
        }
    });
}
