//! Causal attention on `cuda:0` (candle's ops there: matmul, mask, fp32
//! softmax) against the CPU's fused kernel, forward and backward, in fp32
//! and bf16; the GPU check of issue 50's layer until a CUDA kernel lands.

use candle_core::{DType, Device, Tensor, Var};
use redline_kernels::causal_attention;

fn inputs(dev: &Device, dtype: DType) -> [Var; 3] {
    let shape = (2, 3, 70, 16);
    let n = 2 * 3 * 70 * 16;
    let mk = |s: f64| {
        let t = Tensor::arange(0f32, n as f32, &Device::Cpu)
            .unwrap()
            .affine(0.37, s)
            .unwrap()
            .sin()
            .unwrap()
            .reshape(shape)
            .unwrap();
        Var::from_tensor(&t.to_dtype(dtype).unwrap().to_device(dev).unwrap()).unwrap()
    };
    [mk(0.1), mk(0.2), mk(0.3)]
}

fn rel(a: &Tensor, b: &Tensor) -> f32 {
    let (a, b) = (
        a.to_dtype(DType::F32)
            .unwrap()
            .to_device(&Device::Cpu)
            .unwrap(),
        b.to_dtype(DType::F32)
            .unwrap()
            .to_device(&Device::Cpu)
            .unwrap(),
    );
    let d = (&a - &b)
        .unwrap()
        .sqr()
        .unwrap()
        .sum_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    let n = b
        .sqr()
        .unwrap()
        .sum_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    (d / n.max(1e-30)).sqrt()
}

#[test]
fn cuda_attention_matches_the_cpu_kernel_forward_and_backward() {
    let gpu = super::gpu();
    for (dtype, tol) in [(DType::F32, 1e-5f32), (DType::BF16, 2e-2)] {
        let (c, g) = (inputs(&Device::Cpu, dtype), inputs(&gpu, dtype));
        let oc = causal_attention(&c[0], &c[1], &c[2]).unwrap();
        let og = causal_attention(&g[0], &g[1], &g[2]).unwrap();
        assert_eq!(og.dtype(), dtype);
        let e = rel(&og, &oc);
        assert!(e < tol, "{dtype:?} output: {e}");
        let gc = oc
            .to_dtype(DType::F32)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let gg = og
            .to_dtype(DType::F32)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        for i in 0..3 {
            let e = rel(gg.get(&g[i]).unwrap(), gc.get(&c[i]).unwrap());
            assert!(e < tol * 10.0, "{dtype:?} gradient {i}: {e}");
        }
        println!("cuda attention {dtype:?}: output within {e:.2e} of the CPU kernel");
    }
}
