// Small text helpers shared by the ds_config parsers (config/*.cc): case
// folding, "did you mean" suggestions, and recognising numbers written as
// strings.
//
// Thread safety: pure functions.
#ifndef ZEROSTEP_CONFIG_TEXT_H_
#define ZEROSTEP_CONFIG_TEXT_H_

#include <cstddef>
#include <initializer_list>
#include <string>
#include <vector>

namespace zerostep {
namespace config_text {

std::string lower(std::string s);
bool contains(const std::vector<std::string>& v, const std::string& s);
size_t levenshtein(const std::string& a, const std::string& b);
// The closest candidate of all the lists (case-insensitive) within
// max(2, len/3) edits, or "" when none is close enough to be a plausible
// typo (always "" for words over 100 bytes: no key is that long, and the
// edit distance costs len × candidate length).
std::string closest(
    const std::string& word,
    std::initializer_list<const std::vector<std::string>*> candidate_lists);
// The deepest nesting of arrays and objects in a JSON text (brackets inside
// strings do not count); a linear scan that needs no parse, so a document
// too deep to parse safely can be refused before parsing.
size_t nesting_depth(const std::string& json_text);
// True when `s` is, in full, a number a user meant to write without quotes.
bool looks_numeric(const std::string& s);

}  // namespace config_text
}  // namespace zerostep

#endif  // ZEROSTEP_CONFIG_TEXT_H_
