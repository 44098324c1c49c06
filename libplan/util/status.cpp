#include "libplan/util/status.h"

namespace spindle::plan {

Error make_error(const Where& where, const std::string& what) {
  std::string m = where.file.empty() ? std::string("<input>") : where.file;
  if (where.line > 0) m += ":" + std::to_string(where.line) + ":" + std::to_string(where.column);
  m += ": ";
  if (!where.key.empty()) m += where.key + ": ";
  m += what;
  return Error{m};
}

}  // namespace spindle::plan
