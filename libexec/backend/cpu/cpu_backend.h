// The CPU backend: host memory, the reference operators of libexec/ops
// (Eigen), synchronous (synchronize() returns at once).
#pragma once

#include <memory>

#include "libexec/backend/backend.h"

namespace spindle::exec {

std::unique_ptr<Backend> make_cpu_backend();

// The same backend, but device() says Device::cuda while every tensor it
// allocates stays host memory (flagged host): with NcclEmulation
// (comm/nccl_emulation.h), the executor takes the branches it takes with a
// CUDA backend and NCCL, on a machine without a GPU (spindle-run under
// SPINDLE_TEST_EMULATE_DEVICE=1, docs/gpu.md). For tests only: a host
// tensor is never "in" this backend's memory, so every move through it
// (to_backend) copies.
std::unique_ptr<Backend> make_cpu_backend_as_device();

}  // namespace spindle::exec
