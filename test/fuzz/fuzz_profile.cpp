// Fuzz target of the profile reader (parse_profile_string). A profile it
// accepts must encode and decode to the same bytes (spec: encode, decode,
// encode gives the same bytes; libplan/io/profile.h).
#include <cstddef>
#include <cstdint>
#include <string>

#include "libplan/io/profile.h"
#include "test/fuzz/fuzz_check.h"

using namespace spindle;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  plan::Result<plan::Profile> profile = plan::parse_profile_string(text, fuzz::kPath);
  if (!profile.ok()) {
    fuzz::require_error_names_file(profile.error().message);
    return 0;
  }
  const std::string once = plan::profile_to_json(*profile);
  plan::Result<plan::Profile> again = plan::parse_profile_string(once, fuzz::kPath);
  fuzz::require(again.ok(), "a written profile reads back", again.ok() ? once : again.error().message);
  fuzz::require(plan::profile_to_json(*again) == once, "encode(decode(encode(p))) == encode(p)", once);
  return 0;
}
