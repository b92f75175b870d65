// Forwarding header: engine/zero3_block.h moved to blocks/zero3_block.h (a
// leaf package that models and the engine both use, 2026-11-30). Include
// "blocks/zero3_block.h" and depend on @zerostep//blocks:zero3_block; this
// header and the @zerostep//engine:zero3_block target stay for one release
// (CHANGELOG.md, docs/api.md "Moved and removed"). engine/engine.h includes
// blocks/zero3_block.h, so Zero3Block is reachable through it as before.
#ifndef ZEROSTEP_ENGINE_ZERO3_BLOCK_H_
#define ZEROSTEP_ENGINE_ZERO3_BLOCK_H_

#pragma message( \
    "engine/zero3_block.h is deprecated: include blocks/zero3_block.h (@zerostep//blocks:zero3_block)")

#include "blocks/zero3_block.h"

#endif  // ZEROSTEP_ENGINE_ZERO3_BLOCK_H_
