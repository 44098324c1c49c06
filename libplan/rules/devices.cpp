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

}  // namespace spindle::plan
