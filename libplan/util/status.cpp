#include "libplan/util/status.h"

namespace spindle::plan {

Error make_error(const Where& where, const std::string& what) {
  std::string m = where.file.empty() ? std::string("<input>") : where.file;
  // append() rather than operator+ chains: GCC 12 at -O3 warns falsely
  // (-Wrestrict) on `":" + std::to_string(...)`.
  if (where.line > 0) m.append(":").append(std::to_string(where.line)).append(":").append(std::to_string(where.column));
  m.append(": ");
  if (!where.key.empty()) m.append(where.key).append(": ");
  m.append(what);
  return Error{m};
}

}  // namespace spindle::plan
