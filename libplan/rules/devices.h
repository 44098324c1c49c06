// Which device counts a slice may run on (plan rule 4, docs/spec/plan.md).
//
// A MetaOp of a module with tensor_parallel K runs on n devices as n / K
// data-parallel groups of K devices (Megatron-LM's layout). n is valid when
// n is a positive multiple of K and the data-parallel size n / K divides the
// task batch B, so every group holds B / (n / K) whole rows. Example: a TP-4
// trunk with batch 32 may run on 64 devices (16 groups of 2 rows).
//
// The one place this rule lives: the allocator, the analytic profiler,
// spindle-profile, the checker and the runtime all call these functions.
#pragma once

#include <cstdint>
#include <vector>

namespace spindle::plan {

// True when n devices can run a MetaOp of tensor-parallel degree
// `tensor_parallel` on batch `batch`. False for n < 1, tensor_parallel < 1
// or batch < 1.
bool valid_device_count(int n, int tensor_parallel, int64_t batch);

// Every valid n in 1..max_devices, ascending. Empty when none.
std::vector<int> valid_device_counts(int max_devices, int tensor_parallel, int64_t batch);

// valid_device_counts(max_devices, tensor_parallel, batch).size() >= 2,
// without listing them: the valid counts are K d for each divisor d of B
// with K d <= max_devices, so there are two or more when 2 K <= max_devices
// and B's smallest factor above 1 is at most max_devices / K (trial
// division up to sqrt(B): at most 31623 steps for B <= 10^9).
bool several_valid_device_counts(int max_devices, int tensor_parallel, int64_t batch);

}  // namespace spindle::plan
