//! Prints the measured table behind the CPU convolution's choice of path:
//! every path that can run each of ResNet's convolution shapes, forward,
//! weight gradient and input gradient, ms per pass, the chosen one starred.
//!
//! `cargo run --release -p redline-kernels --example conv_paths -- [--threads N] [--batch B] [--size S] [--reps R]`

use redline_kernels::conv_paths::time_paths;

mod common;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (batch, size, reps) = common::setup();
    let (s1, s2, s3, s4) = (size / 4, size / 8, size / 16, size / 32);
    // (name, cin, cout, k, stride, pad, input side): ResNet-18's 3x3
    // convolutions and a 5x5 off the zoo's shapes.
    let shapes = [
        ("layer1 3x3", 64, 64, 3, 1, 1, s1),
        ("layer2.0.conv1 3x3/2", 64, 128, 3, 2, 1, s1),
        ("layer2 3x3", 128, 128, 3, 1, 1, s2),
        ("layer3.0.conv1 3x3/2", 128, 256, 3, 2, 1, s2),
        ("layer3 3x3", 256, 256, 3, 1, 1, s3),
        ("layer4.0.conv1 3x3/2", 256, 512, 3, 2, 1, s3),
        ("layer4 3x3", 512, 512, 3, 1, 1, s4),
        ("5x5 at layer3's side", 128, 128, 5, 1, 2, s3),
    ];
    println!("| conv | out px | pass | im2col ms | direct ms | pixel-major ms | winograd ms |");
    println!("| --- | ---: | --- | ---: | ---: | ---: | ---: |");
    for (name, cin, cout, k, stride, pad, side) in shapes {
        let rows = time_paths(batch, (cin, cout), side, (k, stride, pad), reps)?;
        let o = (side + 2 * pad - k) / stride + 1;
        for pass in ["forward", "weight grad", "input grad"] {
            let cell = |path: &str| {
                rows.iter()
                    .find(|r| r.pass == pass && r.path == path)
                    .map_or("-".to_string(), |r| {
                        format!("{:.1}{}", r.ms, if r.chosen { " *" } else { "" })
                    })
            };
            println!(
                "| {name} | {} | {pass} | {} | {} | {} | {} |",
                o * o,
                cell("im2col"),
                cell("direct"),
                cell("pixel-major"),
                cell("winograd")
            );
        }
    }
    println!(
        "\n`*`: the path the rules choose (conv_winograd, conv_nhwc, conv_direct, conv's batched)."
    );
    Ok(())
}
