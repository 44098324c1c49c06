#include "libplan/rules/devices.h"

namespace spindle::plan {

bool valid_device_count(int n, int tensor_parallel, int64_t batch) {
  if (n < 1 || tensor_parallel < 1 || batch < 1) return false;
  return n % tensor_parallel == 0 && batch % (n / tensor_parallel) == 0;
}

std::vector<int> valid_device_counts(int max_devices, int tensor_parallel, int64_t batch) {
  std::vector<int> out;
  if (tensor_parallel < 1 || batch < 1) return out;
  for (int n = tensor_parallel; n <= max_devices; n += tensor_parallel)
    if (valid_device_count(n, tensor_parallel, batch)) out.push_back(n);
  return out;
}

bool several_valid_device_counts(int max_devices, int tensor_parallel, int64_t batch) {
  if (tensor_parallel < 1 || batch < 2) return false;
  const int64_t most = max_devices / tensor_parallel;   // data-parallel sizes that fit
  if (most < 2) return false;
  int64_t smallest = batch;   // B's smallest factor above 1
  for (int64_t q = 2; q * q <= batch; ++q)
    if (batch % q == 0) {
      smallest = q;
      break;
    }
  return smallest <= most;
}

}  // namespace spindle::plan
