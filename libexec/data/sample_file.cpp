#include "libexec/data/sample_file.h"

#include "libexec/data/npy.h"

namespace spindle::exec {

using plan::Result;

const char* element_type_name(ElementType t) {
  switch (t) {
    case ElementType::f32: return "float32";
    case ElementType::f16: return "float16";
    case ElementType::u8: return "uint8";
    case ElementType::u16: return "uint16";
    case ElementType::i32: return "int32";
    case ElementType::i64: return "int64";
  }
  return "?";
}

size_t element_size(ElementType t) {
  switch (t) {
    case ElementType::u8: return 1;
    case ElementType::f16:
    case ElementType::u16: return 2;
    case ElementType::f32:
    case ElementType::i32: return 4;
    case ElementType::i64: return 8;
  }
  return 1;
}

int64_t SampleFile::row_elems() const {
  int64_t n = 1;
  for (size_t d = 1; d < shape().size(); ++d) n *= shape()[d];
  return n;
}

std::string sample_file_path(const std::string& dir, const std::string& stem) {
  return dir.empty() ? stem + ".npy" : dir + "/" + stem + ".npy";
}

Result<std::unique_ptr<SampleFile>> open_sample_file(const std::string& dir, const std::string& stem) {
  auto a = NpyArray::open(sample_file_path(dir, stem));
  if (!a.ok()) return a.error();
  return std::unique_ptr<SampleFile>(std::make_unique<NpyArray>(std::move(*a)));
}

}  // namespace spindle::exec
