#include "libexec/backend/backend.h"

#include "libexec/backend/cpu/cpu_backend.h"

namespace spindle::exec {

std::unique_ptr<Backend> make_backend(std::string_view name) {
  if (name == "cpu") return make_cpu_backend();
  return nullptr;
}

std::vector<std::string_view> backend_names() { return {"cpu"}; }

}  // namespace spindle::exec
