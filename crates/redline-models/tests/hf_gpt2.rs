//! A Hugging Face GPT-2 folder written by transformers itself
//! (`tools/reference/make_golden_hf_gpt2.py`): Redline's GPT loads it
//! (Conv1D weights transposed, the tied head absent), gives transformers'
//! logits and its greedy `generate` ids, and writes the folder back with
//! the same tensors under the same names.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;

use candle_core::Device;
use redline_models::gpt::hf;
use redline_models::init::Initializer;
use redline_models::{Gpt, GptConfig, Sampling};

fn golden() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/golden")
}

fn expect() -> serde_json::Value {
    let text = std::fs::read_to_string(golden().join("hf_gpt2_tiny.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn build(cfg: &GptConfig) -> Gpt {
    let dev = redline_core::Device::cpu();
    let mut init = Initializer::new(1, &dev, redline_core::Precision::Fp32);
    Gpt::new(cfg, &mut init).unwrap()
}

fn loaded() -> Gpt {
    let dir = golden().join("hf-gpt2-tiny");
    let cfg = GptConfig::from_hf(&dir).unwrap();
    assert_eq!((cfg.n_layer, cfg.n_head, cfg.n_embd), (2, 2, 32));
    assert_eq!((cfg.block_size, cfg.vocab_size), (32, 320));
    let m = build(&cfg);
    m.load_hf(&dir).unwrap();
    m
}

#[test]
fn logits_and_greedy_ids_match_transformers() {
    let e = expect();
    let m = loaded();
    let prompt = ids(&e["prompt_ids"]);
    let logits = m
        .forward_cached(&prompt, &mut m.cache())
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    let want: Vec<f64> = e["last_logits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    let worst = logits
        .iter()
        .zip(&want)
        .map(|(a, b)| (f64::from(*a) - b).abs())
        .fold(0.0, f64::max);
    assert!(worst < 1e-5, "logits differ by {worst}");
    let greedy = Sampling {
        temperature: 0.0,
        top_k: None,
        seed: 0,
    };
    let got = m.generate(&prompt, 16, &greedy, |_| Ok(())).unwrap();
    assert_eq!(got, ids(&e["greedy_ids"]));
}

#[test]
fn a_shorter_block_crops_the_position_table_and_a_longer_one_is_refused() {
    let dir = golden().join("hf-gpt2-tiny");
    let mut cfg = GptConfig::from_hf(&dir).unwrap();
    cfg.block_size = 16;
    let m = build(&cfg);
    m.load_hf(&dir).unwrap();
    let full = loaded();
    let prompt = [5u32, 9, 11];
    let a = m.forward_cached(&prompt, &mut m.cache()).unwrap();
    let b = full.forward_cached(&prompt, &mut full.cache()).unwrap();
    assert_eq!(a.to_vec1::<f32>().unwrap(), b.to_vec1::<f32>().unwrap());
    cfg.block_size = 64;
    let err = build(&cfg).load_hf(&dir).unwrap_err().to_string();
    assert!(
        err.contains("block_size 64") && err.contains("32 positions"),
        "{err}"
    );
    cfg.block_size = 16;
    cfg.n_embd = 16;
    let err = build(&cfg).load_hf(&dir).unwrap_err().to_string();
    assert!(err.contains("n_embd: the model 16, the folder 32"), "{err}");
}

#[test]
fn the_export_holds_transformers_tensors_and_never_overwrites() {
    let m = loaded();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("export");
    m.save_hf(&out).unwrap();
    let theirs = candle_core::safetensors::load(
        golden().join("hf-gpt2-tiny").join(hf::WEIGHTS),
        &Device::Cpu,
    )
    .unwrap();
    let ours = candle_core::safetensors::load(out.join(hf::WEIGHTS), &Device::Cpu).unwrap();
    let mut names: Vec<&String> = theirs.keys().collect();
    names.sort();
    let mut our_names: Vec<&String> = ours.keys().collect();
    our_names.sort();
    assert_eq!(names, our_names);
    for n in names {
        let (a, b) = (&theirs[n], &ours[n]);
        assert_eq!(a.dims(), b.dims(), "{n}");
        let a = a.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let b = b.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(a, b, "{n}");
    }
    assert_eq!(
        GptConfig::from_hf(&out).unwrap(),
        GptConfig::from_hf(&golden().join("hf-gpt2-tiny")).unwrap()
    );
    let err = m.save_hf(&out).unwrap_err().to_string();
    assert!(err.contains("already exists"), "{err}");
}

#[test]
fn another_architecture_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(golden().join("hf-gpt2-tiny").join(hf::CONFIG)).unwrap();
    std::fs::write(
        tmp.path().join(hf::CONFIG),
        text.replace("\"gpt2\"", "\"llama\""),
    )
    .unwrap();
    let err = GptConfig::from_hf(tmp.path()).unwrap_err().to_string();
    assert!(err.contains("model_type \"llama\""), "{err}");
    std::fs::write(
        tmp.path().join(hf::CONFIG),
        text.replace("\"gelu_new\"", "\"relu\""),
    )
    .unwrap();
    let err = GptConfig::from_hf(tmp.path()).unwrap_err().to_string();
    assert!(err.contains("activation_function"), "{err}");
    std::fs::write(tmp.path().join(hf::CONFIG), "{not json").unwrap();
    assert!(GptConfig::from_hf(tmp.path()).is_err());
}

/// The original `gpt2` upload's layout: names without `transformer.`, the
/// attention's mask buffers, and a tied `lm_head` stored anyway; an untied
/// head is refused.
#[test]
fn unprefixed_names_buffers_and_a_tied_head_are_read() {
    let file = golden().join("hf-gpt2-tiny").join(hf::WEIGHTS);
    let theirs = candle_core::safetensors::load(&file, &Device::Cpu).unwrap();
    let want = hf::from_hf(theirs.clone(), &file).unwrap();
    let mut bare: std::collections::HashMap<String, candle_core::Tensor> = theirs
        .iter()
        .map(|(k, v)| (k.trim_start_matches("transformer.").to_string(), v.clone()))
        .collect();
    bare.insert(
        "h.0.attn.bias".into(),
        candle_core::Tensor::ones((1, 1, 32, 32), candle_core::DType::F32, &Device::Cpu).unwrap(),
    );
    bare.insert(
        "lm_head.weight".into(),
        theirs["transformer.wte.weight"].clone(),
    );
    let got = hf::from_hf(bare.clone(), &file).unwrap();
    let mut names: Vec<&String> = got.keys().collect();
    names.sort();
    let mut want_names: Vec<&String> = want.keys().collect();
    want_names.sort();
    assert_eq!(names, want_names);
    for n in names {
        let (a, b) = (&got[n], &want[n]);
        let d = (a - b).unwrap().abs().unwrap().max_all().unwrap();
        assert_eq!(d.to_scalar::<f32>().unwrap(), 0.0, "{n}");
    }
    let untied = (&theirs["transformer.wte.weight"] * 2.0).unwrap();
    bare.insert("lm_head.weight".into(), untied);
    let err = hf::from_hf(bare, &file).unwrap_err().to_string();
    assert!(err.contains("untied head"), "{err}");
}
