//! The README's library example: the tutorial MLP on the shipped
//! Fashion-MNIST, validated each epoch, then a test pass.
//!
//! ```text
//! cargo run --release -p redline-train --example quickstart   # from the repository root
//! ```

use redline_core::{Device, Precision};
use redline_data::{Loader, LoaderConfig, Normalize, Split, SplitKind};
use redline_models::ModelConfig;
use redline_train::{Classifier, Trainer};

fn main() -> anyhow::Result<()> {
    let dev = Device::resolve("auto".parse()?)?;
    let dir = std::path::Path::new("data/fashion-mnist");
    let split = |k| Split::load(dir, k, 10, Normalize::default(), dev.candle());
    let train = Loader::new(split(SplitKind::Train)?, LoaderConfig::default())?;
    let test = Loader::new(
        split(SplitKind::Test)?,
        LoaderConfig {
            shuffle: false,
            ..Default::default()
        },
    )?;
    let model = ModelConfig::by_name("mlp")?.build(&dev, Precision::Fp32, 0)?;
    let mut trainer = Trainer::builder()
        .epochs(5)
        .build(Classifier::new(model), dev)?;
    trainer.fit(&train, Some(&test))?; // validates after each epoch
    let result = trainer.test(&test)?; // loss and the step's metrics
    println!("test accuracy {:?}", result.metrics.get("accuracy"));
    Ok(())
}
