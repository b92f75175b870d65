// TokenText on a hand-written byte-level tokenizer.json (the package's own
// decode is compared in tools/tinker/token_text_test.sh), and utf8_lossy.
#include "models/token_text.h"

#include <gtest/gtest.h>

#include "common/errors.h"

namespace zerostep {
namespace {

// "Ġ" is the space byte and "Ã©" is é's two bytes (C3 A9) in GPT-2's
// alphabet; "Ċ" is '\n'; "<|e|>" is a special added token, "<x>" an added
// one that is not special; "Ã" alone is the lead byte C3.
const char* kTokenizer = R"({
  "model": {"type": "BPE", "vocab": {"a": 0, "\u0120b": 1, "\u00c3\u00a9": 2,
                                     "\u010a": 3, "\u00c3": 4, "\u00e6\u0139\u00a5": 6}},
  "added_tokens": [{"id": 5, "content": "<|e|>", "special": true},
                   {"id": 7, "content": "<x>", "special": false}],
  "decoder": {"type": "ByteLevel", "add_prefix_space": true}
})";

TEST(TokenText, DecodesByteLevelTokensAndSkipsSpecials) {
  const TokenText t(kTokenizer, "test");
  EXPECT_EQ(t.size(), 8);
  EXPECT_EQ(t.bytes(1), " b");
  EXPECT_EQ(t.bytes(2), "\xC3\xA9");
  EXPECT_EQ(t.bytes(3), "\n");
  EXPECT_EQ(t.decode({0, 1, 2, 3}), "a b\xC3\xA9\n");
  EXPECT_EQ(t.decode({0, 5, 7}), "a<x>");
  EXPECT_EQ(t.decode({0, 5, 7}, /*skip_special_tokens=*/false), "a<|e|><x>");
  EXPECT_TRUE(t.is_special(5));
  EXPECT_FALSE(t.is_special(7));
  // A lone lead byte is U+FFFD in text, but stays a byte for stop strings.
  EXPECT_EQ(t.decode({4, 0}), "\xEF\xBF\xBD" "a");
  EXPECT_EQ(t.decode_bytes({4, 0}), "\xC3" "a");
  // A token whose characters are outside GPT-2's alphabet is its own UTF-8
  // (id 6 holds "æĹ¥", all inside: 日's three bytes).
  EXPECT_EQ(t.bytes(6), "\xE6\x97\xA5");
  const std::vector<std::string> table = t.table(10);
  ASSERT_EQ(table.size(), 10u);
  EXPECT_EQ(table[5], "");  // special
  EXPECT_EQ(table[9], "");  // past the tokenizer's ids
  EXPECT_THROW(t.bytes(8), UsageError);
}

TEST(TokenText, RefusesWhatItCannotDecode) {
  EXPECT_THROW(TokenText("{", "x"), UsageError);
  EXPECT_THROW(TokenText(R"({"model": {"type": "Unigram", "vocab": []},
                             "decoder": {"type": "ByteLevel"}})", "x"),
               UsageError);
  EXPECT_THROW(TokenText(R"({"model": {"type": "BPE", "vocab": {"a": 0}},
                             "decoder": {"type": "Metaspace"}})", "x"),
               UsageError);
  EXPECT_THROW(TokenText(R"({"model": {"type": "BPE", "vocab": {"a": -1}},
                             "decoder": {"type": "ByteLevel"}})", "x"),
               UsageError);
  EXPECT_THROW(TokenText::read_folder("/nonexistent-folder"), IoError);
}

TEST(TokenText, Utf8LossyReplacesMaximalInvalidSubparts) {
  EXPECT_EQ(utf8_lossy("ok \xE6\x97\xA5"), "ok \xE6\x97\xA5");
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(utf8_lossy("\xE6\x97"), r);             // truncated: one
  EXPECT_EQ(utf8_lossy("\xE6\x97" "a"), r + "a");   // broken, then ASCII
  EXPECT_EQ(utf8_lossy("\xC0\x80"), r + r);         // never valid leads
  EXPECT_EQ(utf8_lossy("\xED\xA0\x80"), r + r + r); // a surrogate
  EXPECT_EQ(utf8_lossy("\xF0\x9F\x98"), r);
  EXPECT_EQ(utf8_lossy("\x80\xBF"), r + r);
}

}  // namespace
}  // namespace zerostep
