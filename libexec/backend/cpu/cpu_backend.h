// The CPU backend: host memory, the reference operators of libexec/ops
// (Eigen), synchronous (synchronize() returns at once).
#pragma once

#include <memory>

#include "libexec/backend/backend.h"

namespace spindle::exec {

std::unique_ptr<Backend> make_cpu_backend();

}  // namespace spindle::exec
