// A RapidCheck property over the ds_config parser: every accepted file of
// the corpus (config/testdata/corpus/, real projects' shapes) with one key
// set to a JSON value of any kind, or removed, or one object replaced by
// another kind. Whatever the change, parse_config() returns a Config or
// throws ConfigError (never another exception: a nlohmann type error, an
// out_of_range, ...), and a ConfigError of a changed value names a key on
// the changed path (the key itself, or its section). On a failure
// RapidCheck shrinks to the smallest change and prints the file, the path
// and the value, with the reproduce string (propertytests/README.md).
#include <dirent.h>
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/errors.h"
#include "config/config.h"
#include "config/config_test_util.h"

namespace zerostep {
namespace {

using nlohmann::ordered_json;

using testing_config::read_file;
using testing_config::runfile;

struct CorpusFile {
  std::string name;
  ordered_json doc;
  int world_size = 1;
};

// The corpus files the parser accepts, with their world sizes (.expect).
const std::vector<CorpusFile>& accepted_files() {
  static const std::vector<CorpusFile> files = [] {
    std::vector<CorpusFile> out;
    const std::string dir = runfile("config/testdata/corpus");
    DIR* d = opendir(dir.c_str());
    if (d == nullptr) return out;
    std::vector<std::string> names;
    while (dirent* e = readdir(d)) {
      const std::string n = e->d_name;
      if (n.size() > 7 && n.compare(n.size() - 7, 7, ".expect") == 0)
        names.push_back(n.substr(0, n.size() - 7));
    }
    closedir(d);
    std::sort(names.begin(), names.end());
    for (const std::string& n : names) {
      const std::string expect = read_file(dir + "/" + n + ".expect");
      std::istringstream lines(expect);
      std::string line;
      CorpusFile f;
      f.name = n;
      bool accept = false;
      while (std::getline(lines, line)) {
        if (line.rfind("world_size: ", 0) == 0)
          f.world_size = std::stoi(line.substr(12));
        if (line == "accept") accept = true;
      }
      if (!accept) continue;
      f.doc = ordered_json::parse(read_file(dir + "/" + n + ".json"));
      out.push_back(std::move(f));
    }
    return out;
  }();
  return files;
}

// Every path to a value in `j` (objects' members, not array elements).
void paths_of(const ordered_json& j, std::vector<std::string>& prefix,
              std::vector<std::vector<std::string>>* out) {
  if (!j.is_object()) return;
  for (auto it = j.begin(); it != j.end(); ++it) {
    prefix.push_back(it.key());
    out->push_back(prefix);
    paths_of(it.value(), prefix, out);
    prefix.pop_back();
  }
}

rc::Gen<ordered_json> any_value() {
  return rc::gen::oneOf(
      rc::gen::just(ordered_json(nullptr)),
      rc::gen::map(rc::gen::arbitrary<bool>(),
                   [](bool b) { return ordered_json(b); }),
      rc::gen::map(
          rc::gen::element<int64_t>(-1, 0, 1, 2, 3, 4, 7, 1000000000,
                                    std::numeric_limits<int64_t>::min(),
                                    std::numeric_limits<int64_t>::max()),
          [](int64_t i) { return ordered_json(i); }),
      rc::gen::just(ordered_json(std::numeric_limits<uint64_t>::max())),
      rc::gen::map(rc::gen::element(0.5, -0.5, 2.0, 1e-300, 1e300, -1e19),
                   [](double d) { return ordered_json(d); }),
      rc::gen::map(rc::gen::element<std::string>("auto", "", "true", "1", "cpu",
                                                 "none", "fp16", "x"),
                   [](std::string s) { return ordered_json(s); }),
      rc::gen::element(ordered_json::array(), ordered_json::array({1, 2}),
                       ordered_json::object(), ordered_json{{"enabled", true}},
                       ordered_json{{"stage", 3}}));
}

std::string dotted(const std::vector<std::string>& path) {
  std::string s;
  for (const std::string& k : path) s += (s.empty() ? "" : ".") + k;
  return s;
}

RC_GTEST_PROP(ConfigProperty, AnyChangeIsAConfigOrAConfigErrorNamingIt, ()) {
  const std::vector<CorpusFile>& files = accepted_files();
  RC_PRE(!files.empty());
  const CorpusFile& file = files[*rc::gen::inRange<size_t>(0, files.size())];
  std::vector<std::vector<std::string>> paths;
  std::vector<std::string> prefix;
  paths_of(file.doc, prefix, &paths);
  RC_PRE(!paths.empty());
  const std::vector<std::string>& path =
      paths[*rc::gen::inRange<size_t>(0, paths.size())];
  ordered_json doc = file.doc;
  ordered_json* parent = &doc;
  for (size_t i = 0; i + 1 < path.size(); ++i) parent = &(*parent)[path[i]];
  const bool remove = *rc::gen::weightedOneOf<bool>(
      {{1, rc::gen::just(true)}, {4, rc::gen::just(false)}});
  ordered_json value;
  if (remove) {
    parent->erase(path.back());
  } else {
    value = *any_value();
    (*parent)[path.back()] = value;
  }
  RC_LOG() << file.name << ".json (world " << file.world_size
           << "): " << dotted(path)
           << (remove ? " removed" : " = " + value.dump()) << std::endl;
  try {
    parse_config(doc.dump(), file.world_size);
    RC_LOG() << "accepted" << std::endl;
  } catch (const ConfigError& e) {
    RC_LOG() << "ConfigError: " << e.what() << std::endl;
    if (remove) return;  // what a removal breaks may be named elsewhere
    // Keys whose rules tie them together: a changed one may leave the error
    // on another of its group.
    // Keys whose rules tie them together (by their sections): a changed
    // one may leave the error on another of its group.
    const std::vector<std::vector<std::string>> groups = {
        {"train_batch_size", "train_micro_batch_size_per_gpu",
         "gradient_accumulation_steps"},
        {"fp16", "bf16", "bfloat16", "data_types"},
    };
    const auto section = [](const std::string& key) {
      return key.substr(0, key.find('.'));
    };
    bool named = false;
    for (const std::vector<std::string>& g : groups)
      if (std::find(g.begin(), g.end(), path.front()) != g.end())
        for (const ConfigProblem& p : e.problems())
          named =
              named || std::find(g.begin(), g.end(), section(p.key)) != g.end();
    for (const ConfigProblem& p : e.problems())
      for (size_t n = 1; n <= path.size(); ++n) {
        const std::vector<std::string> head(path.begin(), path.begin() + n);
        named = named || p.key == dotted(head) ||
                p.key.rfind(dotted(head) + ".", 0) == 0 ||
                p.key.find(path.back()) != std::string::npos;
      }
    RC_ASSERT(named);
  }
}

}  // namespace
}  // namespace zerostep
