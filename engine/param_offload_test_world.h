// A SimWorld behind the LocalWorld interface, for param_offload_test.cc:
// sim/sim_world.h (via sim/faults.h) and sim/faulty_block_device.h each
// define a zerostep::FaultKind, so one translation unit cannot include
// both; the test includes this header instead of sim_world.h.
#ifndef ZEROSTEP_ENGINE_PARAM_OFFLOAD_TEST_WORLD_H_
#define ZEROSTEP_ENGINE_PARAM_OFFLOAD_TEST_WORLD_H_

#include <cstdint>
#include <memory>

#include "comm/local_world.h"

namespace zerostep {

// A fault-free simulated world of `world_size` ranks.
std::unique_ptr<LocalWorld> make_sim_world(int world_size, uint64_t seed);

}  // namespace zerostep

#endif  // ZEROSTEP_ENGINE_PARAM_OFFLOAD_TEST_WORLD_H_
