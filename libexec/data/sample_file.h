// The reader interface of the data module: one file of a dataset holds S
// samples (its first dimension) of one element type and shape.
//
// FileSource (dataset.h) does the sampling, the checks against the model
// and the conversion to the runtime's tensors for any SampleFile; a file
// format only has to say what it holds and read one sample's elements.
// `.npy` (npy.h) is the format of today; a second one joins by implementing
// SampleFile and being chosen by open_sample_file() from the file name.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "libplan/util/status.h"

namespace spindle::exec {

// The element types the data contract reads (docs/spec/data.md).
enum class ElementType { f32, f16, u8, u16, i32, i64 };

// "float32", "float16", "uint8", "uint16", "int32", "int64".
const char* element_type_name(ElementType t);
// Bytes per element.
size_t element_size(ElementType t);

class SampleFile {
 public:
  virtual ~SampleFile() = default;

  virtual const std::string& path() const = 0;
  virtual ElementType dtype() const = 0;
  // [S, ...]: the first dimension counts samples (empty for a scalar).
  virtual const std::vector<int64_t>& shape() const = 0;
  // Sample s's elements (0 <= s < samples(), row-major) converted to double
  // (exactly for every type but int64 beyond 2^53), appended to `out`.
  // Touches only that sample's bytes. Thread-safe.
  virtual void read_row(int64_t s, std::vector<double>& out) const = 0;

  int64_t samples() const { return shape().empty() ? 0 : shape()[0]; }
  // Elements per sample (product of shape[1:]).
  int64_t row_elems() const;
};

// The file of `stem` in `dir` (today `dir/stem.npy`), whether it exists or
// not: what open_sample_file() opens and messages name.
std::string sample_file_path(const std::string& dir, const std::string& stem);

// Opens and checks `dir/stem.<format>`. Errors name the file.
plan::Result<std::unique_ptr<SampleFile>> open_sample_file(const std::string& dir, const std::string& stem);

}  // namespace spindle::exec
