// Text rules every reader shares.
#pragma once

#include <string>

namespace spindle::plan {

// Offset of the first control character of `text` (a byte below 0x20, or
// DEL): npos if none. Names, ids and the strings of every input format
// take none (docs/hardening.md): a NUL cuts a message short where it is
// printed, an ESC or newline writes into the terminal or a log line.
inline std::string::size_type control_char_at(const std::string& text) {
  for (std::string::size_type i = 0; i < text.size(); ++i)
    if (static_cast<unsigned char>(text[i]) < 0x20 || text[i] == 0x7f) return i;
  return std::string::npos;
}

}  // namespace spindle::plan
