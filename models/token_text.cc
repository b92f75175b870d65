#include "models/token_text.h"

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/errors.h"

namespace zerostep {
namespace {

// GPT-2's bytes_to_unicode, inverted: code point -> byte.
const std::map<uint32_t, unsigned char>& char_bytes() {
  static const std::map<uint32_t, unsigned char> table = [] {
    std::map<uint32_t, unsigned char> t;
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable =
          (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      t[printable ? static_cast<uint32_t>(b) : next++] =
          static_cast<unsigned char>(b);
    }
    return t;
  }();
  return table;
}

// The code points of valid UTF-8 `s` (a JSON string, so valid).
std::vector<uint32_t> code_points(const std::string& s) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const int len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
    for (int k = 1; k < len && i + k < s.size(); ++k)
      cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    out.push_back(cp);
    i += static_cast<size_t>(len);
  }
  return out;
}

// The ByteLevel decoder of one token string (Note [Byte-level decoding]).
std::string byte_level(const std::string& token) {
  std::string out;
  for (uint32_t cp : code_points(token)) {
    auto it = char_bytes().find(cp);
    if (it == char_bytes().end()) return token;
    out.push_back(static_cast<char>(it->second));
  }
  return out;
}

bool byte_level_decoder(const nlohmann::json& d) {
  if (!d.is_object()) return false;
  const std::string type = d.value("type", "");
  if (type == "ByteLevel") return true;
  if (type != "Sequence" || !d.contains("decoders")) return false;
  const nlohmann::json& list = d["decoders"];
  return list.is_array() && list.size() == 1 && byte_level_decoder(list[0]);
}

}  // namespace

TokenText::TokenText(const std::string& json_text, const std::string& source) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json_text);
  } catch (const std::exception& e) {
    throw UsageError(source + " is not JSON: " + e.what());
  }
  const nlohmann::json* model = j.is_object() && j.contains("model") ? &j["model"] : nullptr;
  if (model == nullptr || !model->is_object() || model->value("type", "") != "BPE" ||
      !model->contains("vocab") || !(*model)["vocab"].is_object())
    throw UsageError(source +
                     ": model.type must be \"BPE\" with a model.vocab object "
                     "(a byte-level BPE, as Llama 3's and Qwen's); this one "
                     "is not, so its ids cannot be decoded here");
  if (!j.contains("decoder") || !byte_level_decoder(j["decoder"]))
    throw UsageError(source + ": the decoder is " +
                     (j.contains("decoder") ? j["decoder"].dump().substr(0, 200)
                                            : std::string("absent")) +
                     "; only a ByteLevel decoder is read here (Llama 3, "
                     "Qwen2, Qwen3)");
  std::map<int64_t, std::pair<std::string, bool>> tokens;
  auto put = [&](int64_t id, const std::string& bytes, bool special,
                 bool added) {
    if (id < 0)
      throw UsageError(source + ": token id " + std::to_string(id) +
                       " is negative");
    auto it = tokens.find(id);
    if (it != tokens.end() && !added)
      throw UsageError(source + ": token id " + std::to_string(id) +
                       " is used twice in model.vocab");
    tokens[id] = {bytes, special};  // an added token wins, as in tokenizers
  };
  for (const auto& kv : (*model)["vocab"].items()) {
    if (!kv.value().is_number_integer())
      throw UsageError(source + ": model.vocab['" + kv.key() +
                       "'] is not an integer id");
    put(kv.value().get<int64_t>(), byte_level(kv.key()), false, false);
  }
  if (j.contains("added_tokens") && j["added_tokens"].is_array())
    for (const nlohmann::json& a : j["added_tokens"]) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
          !a.contains("content") || !a["content"].is_string())
        throw UsageError(source + ": an added_tokens entry without an integer "
                                  "id and a string content: " +
                         a.dump().substr(0, 200));
      put(a["id"].get<int64_t>(), byte_level(a["content"].get<std::string>()),
          a.value("special", false), true);
    }
  const int64_t n = tokens.empty() ? 0 : tokens.rbegin()->first + 1;
  bytes_.assign(static_cast<size_t>(n), "");
  special_.assign(static_cast<size_t>(n), false);
  for (const auto& [id, t] : tokens) {
    bytes_[static_cast<size_t>(id)] = t.first;
    special_[static_cast<size_t>(id)] = t.second;
  }
}

TokenText TokenText::read_folder(const std::string& dir) {
  const std::string path = dir + "/tokenizer.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError("cannot read '" + path + "'");
  std::stringstream s;
  s << in.rdbuf();
  return TokenText(s.str(), "'" + path + "'");
}

const std::string& TokenText::bytes(int64_t id) const {
  if (id < 0 || id >= size())
    throw UsageError("token id " + std::to_string(id) +
                     " is outside the tokenizer's ids [0, " +
                     std::to_string(size()) + ")");
  return bytes_[static_cast<size_t>(id)];
}

bool TokenText::is_special(int64_t id) const {
  return id >= 0 && id < size() && special_[static_cast<size_t>(id)];
}

std::vector<std::string> TokenText::table(int64_t vocab,
                                          bool skip_special_tokens) const {
  std::vector<std::string> out(static_cast<size_t>(vocab));
  for (int64_t id = 0; id < vocab && id < size(); ++id)
    if (!(skip_special_tokens && is_special(id)))
      out[static_cast<size_t>(id)] = bytes_[static_cast<size_t>(id)];
  return out;
}

std::string TokenText::decode_bytes(const std::vector<int64_t>& ids,
                                    bool skip_special_tokens) const {
  std::string out;
  for (int64_t id : ids)
    if (!(skip_special_tokens && is_special(id))) out += bytes(id);
  return out;
}

std::string TokenText::decode(const std::vector<int64_t>& ids,
                              bool skip_special_tokens) const {
  return utf8_lossy(decode_bytes(ids, skip_special_tokens));
}

std::string utf8_lossy(const std::string& s) {
  static const std::string kReplacement = "\xEF\xBF\xBD";
  std::string out;
  const size_t n = s.size();
  auto at = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  for (size_t i = 0; i < n;) {
    const unsigned char c = at(i);
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    size_t need = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the first continuation's range
    if (c >= 0xC2 && c <= 0xDF) {
      need = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      need = 2;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      need = 3;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      out += kReplacement;
      ++i;
      continue;
    }
    size_t k = 1;
    for (; k <= need; ++k) {
      if (i + k >= n) break;
      const unsigned char b = at(i + k);
      if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) break;
    }
    if (k == need + 1) {
      out.append(s, i, need + 1);
    } else {
      out += kReplacement;  // the maximal subpart, without the byte that broke it
    }
    i += k;
  }
  return out;
}

}  // namespace zerostep
