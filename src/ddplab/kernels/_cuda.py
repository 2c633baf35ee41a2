"""The CUDA C++ grayscale kernel of seed report A, built on first use with load_inline.

One thread per output pixel over the whole batch (N*H*W threads), planar input: the R, G
and B planes of image n start at n*3*H*W, +H*W and +2*H*W. uint8 uses the exact integer
round-half-up of the reference; float types accumulate in at::opmath_type (fp32 for
half/bf16, fp64 for double).

The source is split the way PyTorch's own extensions are: the host function that checks
its input (CHECK_CUDA, CHECK_CONTIGUOUS, shape, dtype, as the seed did), allocates the
output and raises is C++ compiled by the host compiler (`CPP_SOURCE`); the .cu file
(`CUDA_SOURCE`) only launches the kernel and returns a cudaError_t, and never throws. A
C++ exception raised inside nvcc-compiled host code took the whole process down with
SIGSEGV on an H200 (torch 2.11, nvcc 13.0) instead of reaching Python, so no check lives
there any more: a bad input is a RuntimeError, whoever calls the extension. In the host file
too, a TORCH_CHECK that formats its message from values (its std::string path) died with
SIGSEGV on that machine (torch 2.11, the image's /opt/gcc g++) where one with a literal message
raised cleanly: the host file formats its messages itself and hands TORCH_CHECK a `const char*`.
"""

from __future__ import annotations

import functools

import torch

from ddplab.kernels.reference import GRAY_SCALE, GRAY_WEIGHTS_E4

# Dtype codes shared by both files: the launcher switches on them instead of throwing.
DTYPE_CODES = {"kByte": 0, "kFloat": 1, "kDouble": 2, "kHalf": 3, "kBFloat16": 4}

CPP_SOURCE = r"""
#include <cstdio>
#include <torch/extension.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#define CHECK_CUDA(x) TORCH_CHECK((x).device().is_cuda(), #x " must be a CUDA tensor")
#define CHECK_CONTIGUOUS(x) TORCH_CHECK((x).is_contiguous(), #x " must be contiguous")
#define CHECK_INPUT(x) CHECK_CUDA(x); CHECK_CONTIGUOUS(x)

cudaError_t launch_rgb_to_gray(const void* rgb, void* gray, int dtype_code, int64_t hw, int64_t total,
                               cudaStream_t stream);

static int dtype_code(at::ScalarType t) {
  switch (t) {
@CASES@
    default: return -1;
  }
}

torch::Tensor rgb_to_gray(torch::Tensor rgb) {
  CHECK_INPUT(rgb);
  char why[160];  // formatted here, not by TORCH_CHECK: see the module's docstring
  std::snprintf(why, sizeof why, "rgb must be 3 x H x W or N x 3 x H x W, got %lld dimensions",
                static_cast<long long>(rgb.dim()));
  TORCH_CHECK(rgb.dim() == 3 || rgb.dim() == 4, static_cast<const char*>(why));
  std::snprintf(why, sizeof why, "rgb must have 3 channels, got %lld", static_cast<long long>(rgb.size(-3)));
  TORCH_CHECK(rgb.size(-3) == 3, static_cast<const char*>(why));
  const int code = dtype_code(rgb.scalar_type());
  std::snprintf(why, sizeof why, "rgb must be uint8, float16, bfloat16, float32 or float64, got %s",
                c10::toString(rgb.scalar_type()));
  TORCH_CHECK(code >= 0, static_cast<const char*>(why));
  const c10::cuda::CUDAGuard guard(rgb.device());
  std::vector<int64_t> shape(rgb.sizes().begin(), rgb.sizes().end());
  shape.erase(shape.end() - 3);
  auto gray = torch::empty(shape, rgb.options());
  const int64_t total = gray.numel();
  if (total == 0) return gray;
  C10_CUDA_CHECK(launch_rgb_to_gray(rgb.data_ptr(), gray.data_ptr(), code, rgb.size(-1) * rgb.size(-2), total,
                                    c10::cuda::getCurrentCUDAStream()));
  return gray;
}
"""

CUDA_SOURCE = r"""
#include <cstdint>
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

constexpr int W_R = @W_R@, W_G = @W_G@, W_B = @W_B@, SCALE = @SCALE@;
constexpr int THREADS = 256;

__global__ void rgb_to_gray_u8_kernel(const uint8_t* __restrict__ rgb, uint8_t* __restrict__ gray,
                                      int64_t hw, int64_t total) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int64_t n = i / hw;
  const int64_t p = i - n * hw;
  const uint8_t* img = rgb + n * 3 * hw;
  const int v = W_R * img[p] + W_G * img[hw + p] + W_B * img[2 * hw + p] + SCALE / 2;
  gray[i] = static_cast<uint8_t>(min(v / SCALE, 255));
}

// Explicit conversions: torch's extension builder compiles with __CUDA_NO_HALF_CONVERSIONS__ and
// __CUDA_NO_BFLOAT16_CONVERSIONS__, which remove __half's and __nv_bfloat16's implicit casts.
__device__ __forceinline__ float widen(float x) { return x; }
__device__ __forceinline__ double widen(double x) { return x; }
__device__ __forceinline__ float widen(__half x) { return __half2float(x); }
__device__ __forceinline__ float widen(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ void narrow(float* out, float v) { *out = v; }
__device__ __forceinline__ void narrow(double* out, double v) { *out = v; }
__device__ __forceinline__ void narrow(__half* out, float v) { *out = __float2half_rn(v); }
__device__ __forceinline__ void narrow(__nv_bfloat16* out, float v) { *out = __float2bfloat16_rn(v); }

// acc_t: float for half/bf16/float (PyTorch's opmath type), double for double.
template <typename scalar_t, typename acc_t>
__global__ void rgb_to_gray_float_kernel(const scalar_t* __restrict__ rgb, scalar_t* __restrict__ gray,
                                         int64_t hw, int64_t total) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int64_t n = i / hw;
  const int64_t p = i - n * hw;
  const scalar_t* img = rgb + n * 3 * hw;
  const acc_t v = (acc_t(W_R) * widen(img[p]) + acc_t(W_G) * widen(img[hw + p]) +
                   acc_t(W_B) * widen(img[2 * hw + p])) / acc_t(SCALE);
  narrow(gray + i, v);
}

template <typename scalar_t, typename acc_t>
static void launch_float(const void* rgb, void* gray, int64_t hw, int64_t total, unsigned int blocks,
                         cudaStream_t stream) {
  rgb_to_gray_float_kernel<scalar_t, acc_t><<<blocks, THREADS, 0, stream>>>(
      static_cast<const scalar_t*>(rgb), static_cast<scalar_t*>(gray), hw, total);
}

// No C++ exception here: an unknown dtype code or a failed launch comes back as a cudaError_t.
cudaError_t launch_rgb_to_gray(const void* rgb, void* gray, int dtype_code, int64_t hw, int64_t total,
                               cudaStream_t stream) {
  const unsigned int blocks = static_cast<unsigned int>((total + THREADS - 1) / THREADS);
  switch (dtype_code) {
    case @kByte@:
      rgb_to_gray_u8_kernel<<<blocks, THREADS, 0, stream>>>(static_cast<const uint8_t*>(rgb),
                                                            static_cast<uint8_t*>(gray), hw, total);
      break;
    case @kFloat@: launch_float<float, float>(rgb, gray, hw, total, blocks, stream); break;
    case @kDouble@: launch_float<double, double>(rgb, gray, hw, total, blocks, stream); break;
    case @kHalf@: launch_float<__half, float>(rgb, gray, hw, total, blocks, stream); break;
    case @kBFloat16@: launch_float<__nv_bfloat16, float>(rgb, gray, hw, total, blocks, stream); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}
"""


def cpp_source() -> str:
    cases = "\n".join(f"    case at::{name}: return {code};" for name, code in DTYPE_CODES.items())
    return CPP_SOURCE.replace("@CASES@", cases)


def cuda_source() -> str:
    """The kernel source with the reference's weights and the dtype codes filled in (one source of truth)."""
    w_r, w_g, w_b = GRAY_WEIGHTS_E4
    src = (
        CUDA_SOURCE.replace("@W_R@", str(w_r))
        .replace("@W_G@", str(w_g))
        .replace("@W_B@", str(w_b))
        .replace("@SCALE@", str(GRAY_SCALE))
    )
    for name, code in DTYPE_CODES.items():
        src = src.replace(f"@{name}@", str(code))
    return src


@functools.cache
def load_extension():
    """Compile (first call only, ~1 min; cached by PyTorch on disk) and return the module."""
    from torch.utils.cpp_extension import load_inline

    return load_inline(
        name="ddplab_rgb_to_gray_v4",  # a new name: the cached build of an old source must not be reused
        cpp_sources=cpp_source(),
        cuda_sources=cuda_source(),
        functions=["rgb_to_gray"],
        extra_cuda_cflags=["-O3"],
        verbose=False,
    )


def rgb_to_gray(x: torch.Tensor) -> torch.Tensor:
    return load_extension().rgb_to_gray(x)
