// Private to src/data: text from a data file made safe to quote in a message.
// Not an escaping library: it only keeps messages printable and short.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace cohort::data {

// 's' in single quotes, cut to `max` characters (then "..."), bytes outside printable ASCII as
// \xHH.
inline std::string printable(std::string_view s, std::size_t max) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "'";
  for (std::size_t i = 0; i < s.size() && i < max; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  if (s.size() > max) out += "...";
  return out + "'";
}

}  // namespace cohort::data
