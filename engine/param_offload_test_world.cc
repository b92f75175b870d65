#include "engine/param_offload_test_world.h"

#include "sim/sim_world.h"

namespace zerostep {

std::unique_ptr<LocalWorld> make_sim_world(int world_size, uint64_t seed) {
  SimOptions o;
  o.world_size = world_size;
  o.seed = seed;
  return std::make_unique<SimWorld>(o);
}

}  // namespace zerostep
