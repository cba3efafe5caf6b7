//! The zoo's models take their input and output sizes from the data: 32x32
//! colour images on the MLP and a `--classes 20` give a model of those sizes,
//! not a raw shape error deep in a layer or ten outputs.

use candle_core::{DType, Device as CDevice, Tensor};
use redline_core::{Device, Precision};
use redline_models::ModelConfig;

#[test]
fn zoo_models_take_their_sizes_from_the_data() -> redline_models::Result<()> {
    let x = Tensor::zeros((2, 3, 32, 32), DType::F32, &CDevice::Cpu)?;
    for name in ["mlp", "cnn"] {
        let model = ModelConfig::for_data(name, &[3, 32, 32], 20, None)?.build(
            &Device::cpu(),
            Precision::Fp32,
            0,
        )?;
        assert_eq!(model.forward_t(&x, false)?.dims(), &[2, 20], "{name}");
    }
    // Non-square images are refused by the CNN with the sizes named.
    let err = ModelConfig::for_data("cnn", &[3, 32, 24], 10, None)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("32x24"), "{err}");
    Ok(())
}
