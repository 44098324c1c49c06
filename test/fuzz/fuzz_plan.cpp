// Fuzz target of the plan reader (parse_plan_string). A plan it accepts must
// encode and decode to the same bytes (libplan/plan/plan_io.h).
#include <cstddef>
#include <cstdint>
#include <string>

#include "libplan/plan/plan_io.h"
#include "test/fuzz/fuzz_check.h"

using namespace spindle;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  plan::Result<plan::Plan> p = plan::parse_plan_string(text, fuzz::kPath);
  if (!p.ok()) {
    fuzz::require_error_names_file(p.error().message);
    return 0;
  }
  const std::string once = plan::plan_to_json(*p);
  plan::Result<plan::Plan> again = plan::parse_plan_string(once, fuzz::kPath);
  fuzz::require(again.ok(), "a written plan reads back", again.ok() ? once : again.error().message);
  fuzz::require(plan::plan_to_json(*again) == once, "encode(decode(encode(p))) == encode(p)", once);
  return 0;
}
