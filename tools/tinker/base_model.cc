#include "tools/tinker/base_model.h"

#include "common/errors.h"

namespace zerostep {
namespace tinker {

const std::vector<BaseModel>& base_models() {
  static const std::vector<BaseModel> kModels = {
      {"zerostep/tiny-gpt", 256, 64, 32, 2, 2},
      {"zerostep/small-gpt", 256, 128, 64, 4, 4},
  };
  return kModels;
}

const BaseModel& find_base_model(const std::string& name) {
  std::string names;
  for (const BaseModel& b : base_models()) {
    if (b.name == name) return b;
    names += (names.empty() ? "" : ", ") + b.name;
  }
  throw UsageError("unknown base_model '" + name +
                   "'. This server has: " + names);
}

}  // namespace tinker
}  // namespace zerostep
