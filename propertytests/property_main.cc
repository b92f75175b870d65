#include "propertytests/property_main.h"

#include <cstdlib>
#include <iostream>
#include <string>

#include "runtime/runtime_info.h"

namespace zerostep {

void prepare_property_run(int ci_max_success) {
  const char* current = std::getenv("RC_PARAMS");
  std::string params = current ? current : "";
  if (params.find("max_success") == std::string::npos) {
    params = "max_success=" + std::to_string(ci_max_success) +
             (params.empty() ? "" : " " + params);
    setenv("RC_PARAMS", params.c_str(), /*overwrite=*/1);
  }
  set_compute_threads(1);
  std::cerr << "propertytests: RC_PARAMS=\"" << std::getenv("RC_PARAMS")
            << "\" " << runtime_info() << std::endl;
}

}  // namespace zerostep
