// TokenText: every token id's text, as bytes, read from a Hugging Face
// tokenizer.json of a byte-level BPE (GPT-2's byte-to-unicode alphabet: the
// tokenizers of Llama 3, Qwen2 and Qwen3), so a server can decode sampled
// ids and find stop strings in them without Python, as vLLM's
// detokenizer does. Torch-free.
//
// Note [Byte-level decoding]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// The `tokenizers` package (0.23) decodes ids by mapping each to its token
// string (added tokens first, then model.vocab), dropping special added
// tokens when skip_special_tokens, and handing the strings to the
// ByteLevel decoder, which maps each character back to its byte through
// the inverse of GPT-2's bytes_to_unicode table, or, for a token holding
// a character outside that table, takes the token's own UTF-8 bytes; the
// bytes are then read as UTF-8 with U+FFFD for invalid sequences. decode()
// here does the same, so its text equals tokenizers' decode(ids,
// skip_special_tokens) (tools/tinker/token_text_test.sh checks it against
// the package on a trained tokenizer). Stop strings match the bytes before
// that last step (bytes(), decode_bytes()), so a stop string is found even
// when a sample ends inside a multi-byte character.
//
// Thread safety: immutable after construction.
#ifndef ZEROSTEP_MODELS_TOKEN_TEXT_H_
#define ZEROSTEP_MODELS_TOKEN_TEXT_H_

#include <cstdint>
#include <string>
#include <vector>

namespace zerostep {

class TokenText {
 public:
  // The tokenizer.json text `json_text` (`source` names it in errors).
  // UsageError naming the source and the problem: not JSON, a model other
  // than BPE, a decoder other than ByteLevel (alone or in a Sequence), an
  // id used twice or negative.
  TokenText(const std::string& json_text, const std::string& source);
  // <dir>/tokenizer.json. IoError if it cannot be read; UsageError as
  // above.
  static TokenText read_folder(const std::string& dir);

  // One more than the largest id (ids without a token decode to nothing).
  int64_t size() const { return static_cast<int64_t>(bytes_.size()); }
  // Token `id`'s bytes; "" for an id without a token. UsageError for an id
  // outside [0, size()).
  const std::string& bytes(int64_t id) const;
  bool is_special(int64_t id) const;
  // Every id's bytes, specials as "" (what the sampler's stop strings read,
  // SamplingOptions::token_text), `vocab` entries (ids past size() "").
  std::vector<std::string> table(int64_t vocab,
                                 bool skip_special_tokens = true) const;
  // The ids' bytes, concatenated.
  std::string decode_bytes(const std::vector<int64_t>& ids,
                           bool skip_special_tokens = true) const;
  // decode_bytes() read as UTF-8, each invalid sequence replaced by U+FFFD
  // (Note [Byte-level decoding]).
  std::string decode(const std::vector<int64_t>& ids,
                     bool skip_special_tokens = true) const;

 private:
  std::vector<std::string> bytes_;
  std::vector<bool> special_;
};

// `bytes` as UTF-8 with every maximal invalid subpart replaced by U+FFFD
// (the Unicode standard's recommended practice, which Rust's
// from_utf8_lossy and Python's errors="replace" follow).
std::string utf8_lossy(const std::string& bytes);

}  // namespace zerostep

#endif  // ZEROSTEP_MODELS_TOKEN_TEXT_H_
