// The one translation unit nvcc compiles into Redline's fatbin (build.rs).
#include "half16.cu"
#include "optim.cu"
#include "loss.cu"
#include "linear.cu"
#include "pool.cu"
#include "conv.cu"
#include "conv_mma.cu"
#include "gather.cu"
