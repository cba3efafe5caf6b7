//! ResNet-18, -34, -50, -101 and -152 in the zoo (`--model resnet18` ...)
//! as torchvision builds them (`torchvision.models.resnet`, the v1.5 design:
//! a bottleneck's stride is on its 3x3 convolution), written as the layer
//! set's layers with torchvision's parameter names (`conv1.weight`,
//! `layer1.0.bn2.running_mean`, `layer2.0.downsample.0.weight`, `fc.bias`),
//! so `--init` takes a torchvision `state_dict` saved as safetensors, and
//! initialised as torchvision does: convolutions `kaiming_normal_(mode =
//! "fan_out")`, batch norms ones and zeros, `fc` PyTorch's default.

use crate::error::{Error, Result};
use crate::layers::{ConvInit, LayerSpec, SequentialConfig};

/// The depths torchvision ships, with blocks per stage and whether the
/// blocks are bottlenecks.
const DEPTHS: [(usize, [usize; 4], bool); 5] = [
    (18, [2, 2, 2, 2], false),
    (34, [3, 4, 6, 3], false),
    (50, [3, 4, 6, 3], true),
    (101, [3, 4, 23, 3], true),
    (152, [3, 8, 36, 3], true),
];

/// The zoo names: `resnet18` ... `resnet152`.
pub fn names() -> impl Iterator<Item = String> {
    DEPTHS.iter().map(|(d, _, _)| format!("resnet{d}"))
}

fn conv(name: &str, out: usize, kernel: usize, stride: usize) -> LayerSpec {
    LayerSpec::Conv2d {
        out,
        kernel,
        padding: kernel / 2,
        stride,
        groups: 1,
        bias: false,
        init: ConvInit::KaimingNormalFanOut,
        name: Some(name.into()),
    }
}

fn bn(name: &str) -> LayerSpec {
    LayerSpec::Batchnorm2d {
        eps: 1e-5,
        momentum: 0.1,
        name: Some(name.into()),
    }
}

/// One block of `planes` (x4 out for a bottleneck) from `inplanes` channels,
/// its first convolution strided by `stride`.
fn block(
    name: String,
    inplanes: usize,
    planes: usize,
    stride: usize,
    bottleneck: bool,
) -> LayerSpec {
    let expansion = if bottleneck { 4 } else { 1 };
    let layers = if bottleneck {
        vec![
            conv("conv1", planes, 1, 1),
            bn("bn1"),
            LayerSpec::Relu,
            conv("conv2", planes, 3, stride),
            bn("bn2"),
            LayerSpec::Relu,
            conv("conv3", planes * expansion, 1, 1),
            bn("bn3"),
        ]
    } else {
        vec![
            conv("conv1", planes, 3, stride),
            bn("bn1"),
            LayerSpec::Relu,
            conv("conv2", planes, 3, 1),
            bn("bn2"),
        ]
    };
    // torchvision's downsample: a strided 1x1 convolution and batch norm,
    // named by position (`downsample.0`, `downsample.1`).
    let shortcut = if stride != 1 || inplanes != planes * expansion {
        vec![conv("0", planes * expansion, 1, stride), bn("1")]
    } else {
        Vec::new()
    };
    LayerSpec::Residual {
        layers,
        shortcut,
        name: Some(name),
    }
}

/// The layers of `torchvision.models.resnet{depth}`.
pub fn layers(depth: usize) -> Result<Vec<LayerSpec>> {
    let Some(&(_, blocks, bottleneck)) = DEPTHS.iter().find(|(d, _, _)| *d == depth) else {
        return Err(Error::Config(format!(
            "resnet{depth}: torchvision's depths are 18, 34, 50, 101 and 152"
        )));
    };
    let mut out = vec![
        conv("conv1", 64, 7, 2),
        bn("bn1"),
        LayerSpec::Relu,
        LayerSpec::Maxpool2d {
            kernel: 3,
            stride: Some(2),
            padding: 1,
        },
    ];
    let expansion = if bottleneck { 4 } else { 1 };
    let mut inplanes = 64;
    for (stage, (&n, planes)) in blocks.iter().zip([64, 128, 256, 512]).enumerate() {
        for j in 0..n {
            let stride = if stage > 0 && j == 0 { 2 } else { 1 };
            let name = format!("layer{}.{j}", stage + 1);
            out.push(block(name, inplanes, planes, stride, bottleneck));
            out.push(LayerSpec::Relu);
            inplanes = planes * expansion;
        }
    }
    out.extend([
        LayerSpec::Adaptiveavgpool2d,
        LayerSpec::Flatten,
        LayerSpec::Linear {
            out: None,
            name: Some("fc".into()),
        },
    ]);
    Ok(out)
}

/// `name` (`resnet50`) as a zoo model for ImageNet-sized inputs, or `None`
/// when it is not one of torchvision's ResNets.
pub fn config(name: &str) -> Option<Result<SequentialConfig>> {
    let depth: usize = name.strip_prefix("resnet")?.parse().ok()?;
    Some(layers(depth).map(|layers| SequentialConfig {
        name: name.to_string(),
        input_dims: vec![3, 224, 224],
        outputs: 1000,
        layers,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::init::Initializer;

    /// torchvision's parameter counts (`sum(p.numel() for p in
    /// resnet18().parameters())`) and its state dict's first and last names.
    #[test]
    fn parameter_counts_and_names_are_torchvisions() -> Result<()> {
        for (name, want) in [("resnet18", 11_689_512), ("resnet50", 25_557_032)] {
            let cfg = config(name).ok_or_else(|| Error::Config(name.into()))??;
            let shapes = cfg.shapes()?;
            assert_eq!(shapes.last(), Some(&vec![1000]), "{name}");
            let device = redline_core::Device::cpu();
            let mut init = Initializer::new(0, &device, redline_core::Precision::Fp32);
            let model = cfg.build(&mut init)?;
            use crate::Model;
            let count: usize = model.params().iter().map(|(_, v)| v.elem_count()).sum();
            assert_eq!(count, want, "{name}");
            let names: Vec<&str> = model.params().state().map(|(n, _)| n).collect();
            for n in [
                "conv1.weight",
                "bn1.running_var",
                "layer1.0.conv1.weight",
                "layer2.0.downsample.0.weight",
                "layer2.0.downsample.1.num_batches_tracked",
                "layer4.1.bn2.bias",
                "fc.weight",
                "fc.bias",
            ] {
                assert!(names.contains(&n), "{name}: {n} missing");
            }
        }
        assert!(config("resnet19").is_some_and(|c| c.is_err()));
        // torchvision's init: N(0, 2 / fan_out) for every convolution.
        let cfg = config("resnet18").ok_or_else(|| Error::Config("resnet18".into()))??;
        let device = redline_core::Device::cpu();
        let mut init = Initializer::new(1, &device, redline_core::Precision::Fp32);
        let model = cfg.build(&mut init)?;
        use crate::Model;
        for (name, fan_out) in [
            ("conv1.weight", 64 * 49),
            ("layer1.0.conv1.weight", 64 * 9),
            ("layer4.1.conv2.weight", 512 * 9),
            ("layer2.0.downsample.0.weight", 128),
        ] {
            let w = model
                .params()
                .get(name)
                .ok_or_else(|| Error::Config(name.into()))?
                .as_tensor()
                .flatten_all()?
                .to_vec1::<f32>()?;
            let n = w.len() as f64;
            let mean = w.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
            let std = (w
                .iter()
                .map(|&v| (f64::from(v) - mean).powi(2))
                .sum::<f64>()
                / n)
                .sqrt();
            let want = (2.0 / f64::from(fan_out)).sqrt();
            assert!(
                (std / want - 1.0).abs() < 0.05,
                "{name}: std {std}, want {want}"
            );
            assert!(mean.abs() < 0.05 * want, "{name}: mean {mean}");
        }
        assert!(config("resnetx").is_none());
        Ok(())
    }
}
