// Fuzz target of the checkpoint tensor-file decoder (decode_tensors,
// libexec/exec/checkpoint.h). The format has one spelling, so a file it
// accepts must be exactly what encode_tensors writes for what it decoded;
// an error must name the file. Reading a checkpoint checks each file's
// SHA-256 against its manifest first, so only a crafted checkpoint (its
// manifest made to match) reaches the decoder with such bytes.
#include <cstddef>
#include <cstdint>
#include <string>

#include "libexec/exec/checkpoint.h"
#include "test/fuzz/fuzz_check.h"

using namespace spindle;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  const plan::Result<std::map<std::string, exec::Tensor>> tensors = exec::decode_tensors(bytes, fuzz::kPath);
  if (!tensors.ok()) {
    fuzz::require_error_names_file(tensors.error().message);
    return 0;
  }
  fuzz::require(exec::encode_tensors(*tensors) == bytes, "an accepted file is what encode_tensors writes");
  return 0;
}
