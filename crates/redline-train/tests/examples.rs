//! The examples run on small data: a step, metric and callback of one's own; a
//! candle-nn model; a model, dataset and loss of one's own.

#[path = "../examples/custom_step.rs"]
mod custom_step;

#[path = "../examples/candle_nn.rs"]
mod candle_nn;

#[path = "../examples/own_model_data_loss.rs"]
mod own_model_data_loss;

use std::path::Path;

use candle_core::{Device, Tensor};
use redline_data::Batch;
use redline_train::TrainStep;

#[test]
fn custom_step_trains_and_reports_its_own_metrics() -> anyhow::Result<()> {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/fashion-mnist");
    let metrics = custom_step::run(&data, 2, 2048)?;
    let names: Vec<&str> = metrics.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["accuracy", "confidence"]);
    let (acc, conf) = (metrics[0].1, metrics[1].1);
    assert!(
        acc > 0.5 && acc <= 1.0,
        "2 epochs on 2048 images beat chance: {acc}"
    );
    // The top class's probability is at least 1/10 and below 1 with smoothing.
    assert!(conf > 0.1 && conf < 1.0, "{conf}");
    Ok(())
}

#[test]
fn label_smoothing_of_equal_logits_is_log_classes() -> anyhow::Result<()> {
    // Every class equally likely: smoothed or not, the loss is ln(C).
    let model = redline_models::ModelConfig::Mlp(redline_models::MlpConfig {
        in_features: 4,
        hidden: vec![],
        classes: 5,
    })
    .build(
        &redline_core::Device::cpu(),
        redline_core::Precision::Fp32,
        0,
    )?;
    for (_, v) in model.params().iter() {
        v.set(&v.as_tensor().zeros_like()?)?;
    }
    let step = custom_step::SmoothedClassifier::for_test(model, 0.1);
    let batch = Batch {
        x: Tensor::ones((3, 4), candle_core::DType::F32, &Device::Cpu)?,
        y: Tensor::new(&[0u32, 3, 4], &Device::Cpu)?,
        index: 0,
    };
    let out = step.training_step(&batch)?;
    let loss = out.loss.to_scalar::<f32>()? as f64;
    assert!((loss - 5f64.ln()).abs() < 1e-6, "{loss}");
    Ok(())
}

#[test]
fn a_candle_nn_model_trains_unchanged() -> anyhow::Result<()> {
    // Its gradients come from candle's GradStore (no fused kernel covers
    // candle-nn's layers) into the parameters' buffers; clipping and the norm see them.
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/fashion-mnist");
    let acc = candle_nn::run(&data, 1, 2048)?;
    assert!(
        acc > 0.5 && acc <= 1.0,
        "1 epoch on 2048 images beats chance: {acc}"
    );
    Ok(())
}

/// Writes a CIFAR-10 binary folder: five training files of `per_file`
/// records and a test file, where an image's class sets its red plane's
/// brightness (plus a pixel pattern), so a CNN can learn it.
fn small_cifar10(dir: &Path, per_file: usize) -> anyhow::Result<()> {
    let record = |i: usize| -> Vec<u8> {
        let class = (i * 7) % 10;
        let mut r = vec![class as u8];
        for c in 0..3 {
            r.extend((0..1024).map(|p| {
                let base = if c == 0 { 20 + 22 * class } else { 128 };
                (base + (p * 31 + i * 17) % 16) as u8
            }));
        }
        r
    };
    let file = |name: &str, first: usize, n: usize| {
        let bytes: Vec<u8> = (first..first + n).flat_map(record).collect();
        std::fs::write(dir.join(name), bytes)
    };
    for b in 1..=5 {
        file(&format!("data_batch_{b}.bin"), b * per_file, per_file)?;
    }
    file("test_batch.bin", 0, per_file)?;
    Ok(())
}

#[test]
fn a_candle_nn_cnn_trains_on_cifar10_format_data() -> anyhow::Result<()> {
    // 3x32x32 inputs and 10 classes come from the data, not the code.
    let tmp = tempfile::tempdir()?;
    small_cifar10(tmp.path(), 128)?;
    let acc = candle_nn::run(tmp.path(), 8, usize::MAX)?;
    assert!(
        acc > 0.5 && acc <= 1.0,
        "8 epochs on 640 images beat chance (0.1) fivefold: {acc}"
    );
    Ok(())
}

#[test]
fn own_model_data_and_loss_train_together() -> anyhow::Result<()> {
    let (before, after) = own_model_data_loss::run(8, 4000)?;
    assert!(before > 0.2, "untrained error {before}");
    assert!(after < before / 3.0, "error {before} -> {after}");
    Ok(())
}

#[test]
fn huber_loss_matches_pytorch() -> anyhow::Result<()> {
    // torch.nn.functional.huber_loss(torch.tensor([0., 0.05, 1., -0.3]),
    //     torch.tensor([0., 0., 0., 0.2]), delta=0.1) == 0.03531249985098839
    struct Fixed(redline_models::Params);
    impl redline_models::Model for Fixed {
        fn forward_t(&self, x: &Tensor, _: bool) -> redline_models::Result<Tensor> {
            Ok(x.clone())
        }
        fn params(&self) -> &redline_models::Params {
            &self.0
        }
    }
    let step = own_model_data_loss::Huber::new(Fixed(Default::default()), 0.1);
    let batch = Batch {
        x: Tensor::new(&[[0f32], [0.05], [1.0], [-0.3]], &Device::Cpu)?,
        y: Tensor::new(&[0f32, 0.0, 0.0, 0.2], &Device::Cpu)?,
        index: 0,
    };
    let out = step.validation_step(&batch)?;
    let loss = out.loss.to_scalar::<f32>()?;
    assert!((loss - 0.035_312_5).abs() < 1e-7, "{loss}");
    let mae = out.metrics[0].sum.to_scalar::<f32>()? / 4.0;
    assert!((mae - 0.3875).abs() < 1e-6, "{mae}");
    Ok(())
}
