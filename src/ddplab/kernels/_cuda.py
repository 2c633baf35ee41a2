"""The CUDA C++ grayscale kernel of seed report A, built on first use with load_inline.

One thread per output pixel over the whole batch (N*H*W threads), planar input: the R, G
and B planes of image n start at n*3*H*W, +H*W and +2*H*W. uint8 uses the exact integer
round-half-up of the reference; float types accumulate in at::opmath_type (fp32 for
half/bf16, fp64 for double). The host function checks its input the way the seed did
(CHECK_CUDA, CHECK_CONTIGUOUS, plus shape and dtype), so a direct caller gets a clear error
instead of reading the wrong memory.
"""

from __future__ import annotations

import functools

import torch

from ddplab.kernels.reference import GRAY_SCALE, GRAY_WEIGHTS_E4

CPP_SOURCE = "torch::Tensor rgb_to_gray(torch::Tensor rgb);"

CUDA_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#define CHECK_CUDA(x) TORCH_CHECK((x).device().is_cuda(), #x " must be a CUDA tensor")
#define CHECK_CONTIGUOUS(x) TORCH_CHECK((x).is_contiguous(), #x " must be contiguous")
#define CHECK_INPUT(x) CHECK_CUDA(x); CHECK_CONTIGUOUS(x)

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

template <typename scalar_t>
__global__ void rgb_to_gray_float_kernel(const scalar_t* __restrict__ rgb, scalar_t* __restrict__ gray,
                                         int64_t hw, int64_t total) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int64_t n = i / hw;
  const int64_t p = i - n * hw;
  const scalar_t* img = rgb + n * 3 * hw;
  const acc_t v = (acc_t(W_R) * static_cast<acc_t>(img[p]) + acc_t(W_G) * static_cast<acc_t>(img[hw + p]) +
                   acc_t(W_B) * static_cast<acc_t>(img[2 * hw + p])) / acc_t(SCALE);
  gray[i] = static_cast<scalar_t>(v);
}

torch::Tensor rgb_to_gray(torch::Tensor rgb) {
  CHECK_INPUT(rgb);
  TORCH_CHECK(rgb.dim() == 3 || rgb.dim() == 4, "rgb must be 3 x H x W or N x 3 x H x W, got ", rgb.sizes());
  TORCH_CHECK(rgb.size(-3) == 3, "rgb must have 3 channels, got ", rgb.size(-3));
  TORCH_CHECK(rgb.scalar_type() == at::kByte || at::isFloatingType(rgb.scalar_type()),
              "rgb must be uint8 or floating point, got ", rgb.scalar_type());
  const c10::cuda::CUDAGuard guard(rgb.device());
  std::vector<int64_t> shape(rgb.sizes().begin(), rgb.sizes().end());
  shape.erase(shape.end() - 3);
  auto gray = torch::empty(shape, rgb.options());
  const int64_t hw = rgb.size(-1) * rgb.size(-2);
  const int64_t total = gray.numel();
  if (total == 0) return gray;
  const unsigned int blocks = static_cast<unsigned int>((total + THREADS - 1) / THREADS);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  if (rgb.scalar_type() == at::kByte) {
    rgb_to_gray_u8_kernel<<<blocks, THREADS, 0, stream>>>(rgb.data_ptr<uint8_t>(), gray.data_ptr<uint8_t>(), hw, total);
  } else {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, rgb.scalar_type(), "rgb_to_gray", [&] {
      rgb_to_gray_float_kernel<scalar_t><<<blocks, THREADS, 0, stream>>>(
          rgb.data_ptr<scalar_t>(), gray.data_ptr<scalar_t>(), hw, total);
    });
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return gray;
}
"""


def cuda_source() -> str:
    """The kernel source with the reference's weights filled in (one source of truth)."""
    w_r, w_g, w_b = GRAY_WEIGHTS_E4
    return (CUDA_SOURCE.replace("@W_R@", str(w_r)).replace("@W_G@", str(w_g))
            .replace("@W_B@", str(w_b)).replace("@SCALE@", str(GRAY_SCALE)))


@functools.cache
def load_extension():
    """Compile (first call only, ~1 min; cached by PyTorch on disk) and return the module."""
    from torch.utils.cpp_extension import load_inline

    return load_inline(
        name="ddplab_rgb_to_gray",
        cpp_sources=CPP_SOURCE,
        cuda_sources=cuda_source(),
        functions=["rgb_to_gray"],
        extra_cuda_cflags=["-O3"],
        verbose=False,
    )


def rgb_to_gray(x: torch.Tensor) -> torch.Tensor:
    return load_extension().rgb_to_gray(x)
