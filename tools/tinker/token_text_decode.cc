// token_text_decode DIR: reads lines of space-separated token ids from
// stdin and prints, per line, models/token_text.h's decode of them as hex,
// with skip_special_tokens true, then false (tab-separated). The C++ half
// of tools/tinker/token_text_test.py.
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "common/errors.h"
#include "models/token_text.h"

namespace {

std::string hex(const std::string& s) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    out.push_back(d[c >> 4]);
    out.push_back(d[c & 15]);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: token_text_decode DIR < ids\n");
    return 2;
  }
  try {
    const zerostep::TokenText text = zerostep::TokenText::read_folder(argv[1]);
    std::string line;
    while (std::getline(std::cin, line)) {
      std::istringstream in(line);
      std::vector<int64_t> ids;
      for (int64_t id; in >> id;) ids.push_back(id);
      std::printf("%s\t%s\n", hex(text.decode(ids, true)).c_str(),
                  hex(text.decode(ids, false)).c_str());
    }
  } catch (const zerostep::Error& e) {
    std::fprintf(stderr, "token_text_decode: %s\n", e.what());
    return 2;
  }
  return 0;
}
