// Fuzz target of the .npy header reader (parse_npy_header, libexec/data/npy.h).
// A header it accepts must describe data that NpyArray can bound-check:
// the data offset inside the input, at most 8 dimensions, at most 2^40
// elements, a dtype of the contract; an error must name the file.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "libexec/data/npy.h"
#include "test/fuzz/fuzz_check.h"

using namespace spindle;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  const plan::Result<exec::NpyHeader> h = exec::parse_npy_header(bytes, fuzz::kPath);
  if (!h.ok()) {
    fuzz::require_error_names_file(h.error().message);
    return 0;
  }
  fuzz::require(h->data_offset <= size, "the header lies inside the input");
  fuzz::require(h->shape.size() <= 8, "at most 8 dimensions");
  int64_t numel = 1;
  for (int64_t d : h->shape) {
    fuzz::require(d >= 0, "dimensions are not negative");
    numel *= d;
  }
  fuzz::require(numel == h->numel() && numel <= (int64_t{1} << 40), "at most 2^40 elements");
  fuzz::require(exec::element_size(h->dtype) >= 1 && exec::element_size(h->dtype) <= 8, "a contract dtype");
  fuzz::require(h->major >= 1 && h->major <= 3 && h->minor == 0, "version 1.0-3.0");
  return 0;
}
