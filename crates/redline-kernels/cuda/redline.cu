// The one translation unit nvcc compiles into Redline's fatbin (build.rs).
#include "optim.cu"
#include "loss.cu"
#include "linear.cu"
#include "pool.cu"
#include "conv.cu"
